/// \file loss.cpp
/// \brief `vpce loss`: the loss (and gradient) of the logits in an HDF5 file (vpce::CrossEntropy), through the
/// computing commands' skeleton (command.hpp).

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "command.hpp"
#include "h5io.hpp"
#include "loss_input.hpp"
#include "tool.hpp"
#include "vpce/vpce.hpp"

namespace vpce::tool {

namespace {

/// Scalar: the logits' type (float, double, bfloat16, float16). Loss and lse are in its compute type; the
/// gradient is computed in the compute type or, for 16-bit logits with --grad-dtype logits, in Scalar.
template <class Scalar>
void run_loss(const Communicator& comm, const LossConfig& cfg, H5File& in, const LossInput& input,
              const VocabPartition& part) {
  using CE = CrossEntropy<Scalar>;
  using T = typename CE::compute_type;
  using mem = typename CE::memory_space;
  constexpr bool half = is_16bit_v<Scalar>;
  // The element read from and written to the file: the 16-bit types as their bits.
  using FileElem = file_element_t<Scalar>;
  static_assert(sizeof(FileElem) == sizeof(Scalar) && std::is_trivially_copyable_v<Scalar>);
  const std::int64_t n = input.n, v = input.v, vl = part.local_size(), max_vl = part.max_local_size();
  // The gradient in the logits' own 16-bit type, or in the compute type (written converted to float32 if asked).
  const bool grad_in_storage = half && cfg.grad_dtype == "logits";
  const bool grad_as_float32 = !std::is_same_v<T, float> && cfg.grad_dtype == "float32";
  // One call computing the loss and the gradient into the logits' own buffer (the library allows it): the
  // gradient's element type must be the logits' one.
  const bool in_place = cfg.grad && cfg.mode == "fused" && (std::is_same_v<Scalar, T> || grad_in_storage);

  using Matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, mem>;
  using GradMatrix = Kokkos::View<T**, Kokkos::LayoutRight, mem>;
  using Targets = Kokkos::View<std::int64_t*, mem>;
  using Vector = Kokkos::View<T*, mem>;
  Matrix logits, grad_s;  // grad_s: the gradient in Scalar (16-bit, or in place)
  Matrix probs;           // the target probabilities (/target_probs), if the file has them
  GradMatrix grad_t;      // the gradient in the compute type
  Targets targets;
  Vector loss;
  typename Matrix::HostMirror h_logits, h_grad_s, h_probs;
  typename GradMatrix::HostMirror h_grad_t;
  typename Targets::HostMirror h_targets;
  typename Vector::HostMirror h_loss;
  // The per-row outputs asked for (--lse, --entropy, --logprob, --z-loss-out): dataset name, the call's View
  // of them, its host copy.
  struct RowOut {
    const char* name;
    Kokkos::View<const T*, mem> (CE::*get)() const;
    typename Vector::HostMirror host;
  };
  std::vector<RowOut> row_outs;
  std::vector<T> h_weights;  // this rank's class weights (/weights), if the file has them
  if (cfg.lse) row_outs.push_back({"/lse", &CE::lse, {}});
  if (cfg.entropy) row_outs.push_back({"/entropy", &CE::entropy, {}});
  if (cfg.logprob) row_outs.push_back({"/logprob", &CE::logprob, {}});
  if (cfg.z_loss_out) row_outs.push_back({"/z_loss", &CE::z_loss_terms, {}});
  const auto n_row_outs = std::int64_t(row_outs.size());

  CommandSteps<T> steps;
  steps.n = n;
  steps.v = v;
  steps.memory_what =
      std::to_string(n) + " x " + std::to_string(vl) + " logits" + (cfg.grad ? " and their gradient" : "");
  steps.memory_bytes = double(n) * double(vl) *
                           double(sizeof(Scalar) * (input.probs ? 2 : 1) + (cfg.grad && !in_place ? sizeof(T) : 0)) +
                       double(n) * 8 * double(2 + n_row_outs);
  steps.allocate = [&] {
    logits = Matrix(uninitialized("vpce::tool::logits"), n, vl);
    if (input.probs) probs = Matrix(uninitialized("vpce::tool::target_probs"), n, vl);
    targets = Targets(uninitialized("vpce::tool::targets"), n);
    loss = Vector(uninitialized("vpce::tool::loss"), n);
    if (cfg.grad && in_place) {
      grad_s = logits;
    } else if (cfg.grad && grad_in_storage) {
      grad_s = Matrix(uninitialized("vpce::tool::grad"), n, vl);
    } else if (cfg.grad) {
      grad_t = GradMatrix(uninitialized("vpce::tool::grad"), n, vl);
    }
  };
  // This rank's columns of the logits.
  steps.read = [&](H5File& file) {
    h_logits = Kokkos::create_mirror_view(logits);
    h_targets = Kokkos::create_mirror_view(targets);
    file.read_columns<FileElem>("/logits", n, part.begin(), vl, max_vl, reinterpret_cast<FileElem*>(h_logits.data()));
    if (input.weights) {
      h_weights.resize(vl);
      file.read_range<T>("/weights", part.begin(), vl, h_weights.data());
    }
    if (input.probs) {  // this rank's columns; no /targets then
      h_probs = Kokkos::create_mirror_view(probs);
      file.read_columns<FileElem>("/target_probs", n, part.begin(), vl, max_vl,
                                  reinterpret_cast<FileElem*>(h_probs.data()));
      return static_cast<std::int64_t*>(nullptr);
    }
    return h_targets.data();
  };
  steps.upload = [&] {
    Kokkos::deep_copy(logits, h_logits);
    if (input.probs) {
      Kokkos::deep_copy(probs, h_probs);
    } else {
      Kokkos::deep_copy(targets, h_targets);
    }
    h_logits = {};
    h_targets = {};
    h_probs = {};
  };
  steps.compute = [&] {
    Options opt = library_options(cfg);
    opt.mode = cfg.mode == "stash" ? Mode::stash_softmax : Mode::recompute;
    opt.entropy = cfg.entropy;
    opt.entropy_weight = cfg.entropy_weight;
    opt.probability_targets = input.probs;
    CE ce(comm, part, opt);
    if (input.weights) {  // this rank's columns of /weights (read in the read step)
      Vector w(uninitialized("vpce::tool::weights"), vl);
      Kokkos::deep_copy(w, Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(h_weights.data(), vl));
      ce.set_class_weights(w);
    }
    // grad_scale 1: the gradient of the sum of the per-token losses (none), of the sum (sum) or of the mean
    // (mean: the library divides by the number of non-ignored tokens).
    auto compute_with = [&](const auto& grad, const auto& target) {
      if (cfg.grad && cfg.mode == "fused") {
        ce.loss_and_grad(logits, target, loss, grad, T(1));
      } else {
        ce.forward(logits, target, loss);
        if (cfg.grad) ce.backward(T(1), grad);
      }
    };
    auto compute = [&](const auto& grad) {
      if (input.probs) {
        compute_with(grad, typename CE::probs_view(probs));
      } else {
        compute_with(grad, typename CE::targets_view(targets));
      }
    };
    if constexpr (half) {
      if (grad_s.data() != nullptr)
        compute(grad_s);  // grad_storage_view: the logits' own type
      else
        compute(grad_t);
    } else {
      compute(grad_s.data() != nullptr ? grad_s : grad_t);  // the same View type here
    }
    for (auto& r : row_outs) {  // copied out: the next one may reuse the library's buffer
      Vector copy(uninitialized("vpce::tool::row_output"), n);
      Kokkos::deep_copy(copy, (ce.*r.get)());
      r.host = to_host(copy);
    }
    const Computed result{ce.reduced_loss(), ce.num_valid()};
    Kokkos::fence();
    return result;
  };
  steps.download = [&] {
    if (!in_place) logits = Matrix();  // free before writing
    h_loss = to_host(loss);
    h_grad_s = to_host(grad_s);
    h_grad_t = to_host(grad_t);
    return h_loss.data();
  };
  const std::int64_t grad_elem = !cfg.grad         ? 0
                                 : grad_in_storage ? std::int64_t(sizeof(Scalar))
                                 : grad_as_float32 ? 4
                                                   : std::int64_t(sizeof(T));
  steps.output_bytes = n * v * grad_elem + n_row_outs * n * std::int64_t(sizeof(T));
  steps.create = [&](H5File& out) {
    if (cfg.grad) {
      const hid_t type = grad_in_storage   ? little_endian_type<Scalar>()
                         : grad_as_float32 ? H5T_IEEE_F32LE
                                           : little_endian_type<T>();
      out.create_dataset("/grad_logits", {n, v}, type);
      if (grad_in_storage) out.write_attribute("dtype", to_string(dtype_of<Scalar>()), "/grad_logits");
    }
    for (const auto& r : row_outs) out.create_dataset(r.name, {n}, little_endian_type<T>());
    out.write_attribute("entropy_weight", number_text(cfg.entropy_weight));
    out.write_attribute("class_weights", input.weights ? "/weights" : "none");
    out.write_attribute("targets", input.probs ? "/target_probs" : "/targets");
    out.write_attribute("logits_dtype", to_string(dtype_of<Scalar>()));
    out.write_attribute("mode", cfg.grad ? cfg.mode : std::string("forward"));
  };
  steps.write = [&](H5File& out) {
    for (const auto& r : row_outs) out.write_all<T>(r.name, n, r.host.data(), 0);
    if (cfg.grad && h_grad_s.data() != nullptr) {
      out.write_columns<FileElem>("/grad_logits", n, part.begin(), vl, max_vl,
                                  reinterpret_cast<const FileElem*>(h_grad_s.data()));
    } else if (cfg.grad) {
      out.write_columns<T>("/grad_logits", n, part.begin(), vl, max_vl, h_grad_t.data());
    }
  };
  steps.describe = [&] {
    return std::to_string(n) + " tokens x " + std::to_string(v) + " vocabulary (" + to_string(dtype_of<Scalar>()) +
           ", " + ranks_text(comm) + ", strategy " + to_string(cfg.strategy) + ", " +
           (cfg.grad ? "mode " + cfg.mode : std::string("loss only")) + ")";
  };
  run_command(comm, cfg, in, steps);
}

}  // namespace

int cmd_loss(const Communicator& comm, const std::vector<std::string>& argv) {
  const LossConfig cfg = parse_loss_args(argv, comm.size());
  if (cfg.help) {
    print0(comm, loss_help);
    return 0;
  }
  H5File in = open_input(comm, cfg);
  const LossInput input = check_loss_input(comm, in, cfg);
  const VocabPartition part = partition_of(comm, cfg, input.v);
  agree(comm, size_error(cfg.input, input.n, input.v, part.max_local_size(), element_size(input.type)), false);
  dispatch(input.type, [&](auto tag) { run_loss<typename decltype(tag)::type>(comm, cfg, in, input, part); });
  return 0;
}

}  // namespace vpce::tool
