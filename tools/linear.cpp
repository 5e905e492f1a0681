/// \file linear.cpp
/// \brief `vpce linear`: the LM head fused with the loss (vpce::LinearCrossEntropy) on HDF5 files, through the
/// computing commands' skeleton (command.hpp).

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "command.hpp"
#include "h5io.hpp"
#include "linear_input.hpp"
#include "tool.hpp"
#include "vpce/vpce.hpp"

namespace vpce::tool {

#if defined(VPCE_HAVE_KOKKOSKERNELS)

namespace {

template <class Scalar>
void run_linear(const Communicator& comm, const LinearConfig& cfg, H5File& in, const LinearInput& input,
                const VocabPartition& part) {
  const std::int64_t n = input.n, h = input.h, v = input.v, vl = part.local_size(), max_vl = part.max_local_size();
  using LCE = LinearCrossEntropy<Scalar>;
  using mem = typename LCE::memory_space;
  using Matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, mem>;
  using Targets = Kokkos::View<std::int64_t*, mem>;
  using Vector = Kokkos::View<Scalar*, mem>;

  Matrix hidden, weight, grad_hidden, grad_weight;
  Targets targets;
  Vector loss;
  typename Matrix::HostMirror h_hidden, h_weight, h_grad_hidden, h_grad_weight;
  typename Targets::HostMirror h_targets;
  typename Vector::HostMirror h_loss;
  std::int64_t chunk_rows = 0;

  CommandSteps<Scalar> steps;
  steps.n = n;
  steps.v = v;
  steps.memory_what = std::to_string(n) + " x " + std::to_string(h) + " hidden states and " + std::to_string(vl) +
                      " x " + std::to_string(h) + " weight rows" + (cfg.grad ? " and their gradients" : "");
  steps.memory_bytes =
      (double(n) + double(vl)) * double(h) * double(sizeof(Scalar)) * (cfg.grad ? 2 : 1) + double(n) * 16;
  steps.allocate = [&] {
    hidden = Matrix(uninitialized("vpce::tool::hidden"), n, h);
    weight = Matrix(uninitialized("vpce::tool::weight"), vl, h);
    targets = Targets(uninitialized("vpce::tool::targets"), n);
    loss = Vector(uninitialized("vpce::tool::loss"), n);
    if (cfg.grad) {
      grad_hidden = Matrix(uninitialized("vpce::tool::grad_hidden"), n, h);
      grad_weight = Matrix(uninitialized("vpce::tool::grad_weight"), vl, h);
    }
  };
  // All of /hidden, this rank's rows of /weight.
  steps.read = [&](H5File& file) {
    h_hidden = Kokkos::create_mirror_view(hidden);
    h_weight = Kokkos::create_mirror_view(weight);
    h_targets = Kokkos::create_mirror_view(targets);
    file.read_rows<Scalar>("/hidden", 0, n, n, h, h_hidden.data());
    file.read_rows<Scalar>("/weight", part.begin(), vl, max_vl, h, h_weight.data());
    return h_targets.data();
  };
  steps.upload = [&] {
    Kokkos::deep_copy(hidden, h_hidden);
    Kokkos::deep_copy(weight, h_weight);
    Kokkos::deep_copy(targets, h_targets);
    h_hidden = h_weight = {};
    h_targets = {};
  };
  steps.compute = [&] {
    LinearOptions lin;
    lin.chunk_rows = cfg.chunk_rows;
    LCE lce(comm, part, h, library_options(cfg), lin);
    chunk_rows = lce.chunk_rows();
    // grad_scale 1: the gradient of the sum of the per-token losses (none), of the sum (sum) or of the mean
    // (mean: the library divides by the number of non-ignored tokens).
    if (cfg.grad)
      lce.loss_and_grad(hidden, weight, targets, loss, grad_hidden, grad_weight, Scalar(1));
    else
      lce.forward(hidden, weight, targets, loss);
    const Computed result{lce.reduced_loss(), lce.num_valid()};
    Kokkos::fence();
    return result;
  };
  steps.download = [&] {
    hidden = weight = Matrix();
    h_loss = to_host(loss);
    h_grad_hidden = to_host(grad_hidden);
    h_grad_weight = to_host(grad_weight);
    return h_loss.data();
  };
  steps.output_bytes = cfg.grad ? (n + v) * h * std::int64_t(sizeof(Scalar)) : 0;
  steps.create = [&](H5File& out) {
    if (cfg.grad) {
      out.create_dataset("/grad_hidden", {n, h}, little_endian_type<Scalar>());
      out.create_dataset("/grad_weight", {v, h}, little_endian_type<Scalar>());
    }
    out.write_attribute("hidden_dtype", to_string(dtype_of<Scalar>()));
    out.write_attribute("chunk_rows", std::to_string(chunk_rows));
  };
  steps.write = [&](H5File& out) {
    if (!cfg.grad) return;
    // grad_hidden is the same on every rank: each writes an even share of its rows.
    const int size = comm.size(), rank = comm.rank();
    const std::int64_t base = n / size, extra = n % size;
    const std::int64_t my_rows = base + (rank < extra ? 1 : 0);
    const std::int64_t my_first = rank * base + std::min<std::int64_t>(rank, extra);
    const std::int64_t max_rows = base + (extra ? 1 : 0);
    out.write_rows<Scalar>("/grad_hidden", my_first, my_rows, max_rows, h, h_grad_hidden.data() + my_first * h);
    out.write_rows<Scalar>("/grad_weight", part.begin(), vl, max_vl, h, h_grad_weight.data());
  };
  steps.describe = [&] {
    return std::to_string(n) + " tokens x " + std::to_string(h) + " hidden x " + std::to_string(v) + " vocabulary (" +
           to_string(dtype_of<Scalar>()) + ", " + ranks_text(comm) + ", " + std::to_string(chunk_rows) +
           " rows per chunk, strategy " + to_string(cfg.strategy) + (cfg.grad ? ", with gradients" : ", loss only") +
           ")";
  };
  run_command(comm, cfg, in, steps);
}

}  // namespace

#endif  // VPCE_HAVE_KOKKOSKERNELS

int cmd_linear(const Communicator& comm, const std::vector<std::string>& argv) {
  const LinearConfig cfg = parse_linear_args(argv, comm.size());
  if (cfg.help) {
    print0(comm, linear_help);
    return 0;
  }
#if defined(VPCE_HAVE_KOKKOSKERNELS)
  H5File in = open_input(comm, cfg);
  const LinearInput input = check_linear_input(comm, in, cfg);
  const VocabPartition part = partition_of(comm, cfg, input.v);
  agree(comm,
        linear_size_error(cfg.input, input.n, input.h, input.v, part.max_local_size(), cfg.chunk_rows,
                          element_size(input.type)),
        false);
  dispatch(input.type, [&](auto tag) {
    using S = typename decltype(tag)::type;
    // check_linear_input gives float32 or float64 only: LinearCrossEntropy has no 16-bit inputs.
    if constexpr (std::is_floating_point_v<S>)
      run_linear<S>(comm, cfg, in, input, part);
    else
      throw Error(std::string("linear: ") + to_string(input.type) + " hidden states are not supported");
  });
  return 0;
#else
  // Every rank throws the same error: exit status 1 everywhere.
  throw Error("linear: this build of vpce has no Kokkos Kernels (vpce::LinearCrossEntropy needs it): "
              "reconfigure with Kokkos Kernels installed (KokkosKernels_ROOT), or use 'vpce loss' on the logits");
#endif
}

}  // namespace vpce::tool
