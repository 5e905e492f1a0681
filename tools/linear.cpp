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

/// Scalar: the type of /hidden, /weight and /bias (float, double, bfloat16, float16); the loss and the
/// gradients are in its compute type.
template <class Scalar>
void run_linear(const Communicator& comm, const LinearConfig& cfg, H5File& in, const LinearInput& input,
                const VocabPartition& part) {
  const std::int64_t n = input.n, h = input.h, v = input.v, vl = part.local_size(), max_vl = part.max_local_size();
  using LCE = LinearCrossEntropy<Scalar>;
  using T = typename LCE::compute_type;
  using mem = typename LCE::memory_space;
  using FileElem = file_element_t<Scalar>;  // 16-bit types as their bits
  static_assert(sizeof(FileElem) == sizeof(Scalar) && std::is_trivially_copyable_v<Scalar>);
  using Matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, mem>;
  using InVector = Kokkos::View<Scalar*, mem>;
  using GradMatrix = Kokkos::View<T**, Kokkos::LayoutRight, mem>;
  using Targets = Kokkos::View<std::int64_t*, mem>;
  using Vector = Kokkos::View<T*, mem>;

  // The rows of /hidden this rank holds, and of /grad_hidden it writes: an even share (all of them in, with
  // replicated input).
  const int size = comm.size(), rank = comm.rank();
  const std::int64_t base = n / size, extra = n % size;
  const std::int64_t my_rows = base + (rank < extra ? 1 : 0);
  const std::int64_t my_first = rank * base + std::min<std::int64_t>(rank, extra);
  const std::int64_t max_rows = base + (extra ? 1 : 0);
  const std::int64_t held = cfg.sequence_parallel ? my_rows : n;

  Matrix hidden, weight;
  InVector bias;
  GradMatrix grad_hidden, grad_weight;
  Vector grad_bias;
  Targets targets;
  Vector loss;
  typename Matrix::HostMirror h_hidden, h_weight;
  typename InVector::HostMirror h_bias;
  typename GradMatrix::HostMirror h_grad_hidden, h_grad_weight;
  typename Vector::HostMirror h_grad_bias;
  typename Targets::HostMirror h_targets;
  typename Vector::HostMirror h_loss;
  std::int64_t chunk_rows = 0;

  CommandSteps<T> steps;
  steps.n = n;
  steps.v = v;
  steps.memory_what = std::to_string(held) + " x " + std::to_string(h) + " hidden states and " + std::to_string(vl) +
                      " x " + std::to_string(h) + " weight rows" + (cfg.grad ? " and their gradients" : "");
  steps.memory_bytes =
      (double(held) + double(vl)) * double(h) * (double(sizeof(Scalar)) + (cfg.grad ? sizeof(T) : 0)) + double(n) * 16;
  steps.allocate = [&] {
    hidden = Matrix(uninitialized("vpce::tool::hidden"), held, h);
    weight = Matrix(uninitialized("vpce::tool::weight"), vl, h);
    if (input.bias) bias = InVector(uninitialized("vpce::tool::bias"), vl);
    targets = Targets(uninitialized("vpce::tool::targets"), n);
    loss = Vector(uninitialized("vpce::tool::loss"), n);
    if (cfg.grad) {
      grad_hidden = GradMatrix(uninitialized("vpce::tool::grad_hidden"), held, h);
      grad_weight = GradMatrix(uninitialized("vpce::tool::grad_weight"), vl, h);
      if (input.bias) grad_bias = Vector(uninitialized("vpce::tool::grad_bias"), vl);
    }
  };
  // /hidden (all of it, or this rank's share), this rank's rows of /weight and entries of /bias.
  steps.read = [&](H5File& file) {
    h_hidden = Kokkos::create_mirror_view(hidden);
    h_weight = Kokkos::create_mirror_view(weight);
    h_bias = Kokkos::create_mirror_view(bias);
    h_targets = Kokkos::create_mirror_view(targets);
    auto elems = [](auto& host) { return reinterpret_cast<FileElem*>(host.data()); };
    if (cfg.sequence_parallel)
      file.read_rows<FileElem>("/hidden", my_first, my_rows, max_rows, h, elems(h_hidden));
    else
      file.read_rows<FileElem>("/hidden", 0, n, n, h, elems(h_hidden));
    file.read_rows<FileElem>("/weight", part.begin(), vl, max_vl, h, elems(h_weight));
    if (input.bias) file.read_range<FileElem>("/bias", part.begin(), vl, elems(h_bias));
    return h_targets.data();
  };
  steps.upload = [&] {
    Kokkos::deep_copy(hidden, h_hidden);
    Kokkos::deep_copy(weight, h_weight);
    Kokkos::deep_copy(bias, h_bias);
    Kokkos::deep_copy(targets, h_targets);
    h_hidden = h_weight = {};
    h_bias = {};
    h_targets = {};
  };
  steps.compute = [&] {
    LinearOptions lin;
    lin.chunk_rows = cfg.chunk_rows;
    lin.sequence_parallel = cfg.sequence_parallel;
    LCE lce(comm, part, h, library_options(cfg), lin);
    chunk_rows = lce.chunk_rows();
    // grad_scale 1: the gradient of the sum of the per-token losses (none), of the sum (sum) or of the mean
    // (mean: the library divides by the number of non-ignored tokens).
    if (cfg.grad)
      lce.loss_and_grad(hidden, weight, bias, targets, loss, grad_hidden, grad_weight, grad_bias, T(1));
    else
      lce.forward(hidden, weight, bias, targets, loss);
    const Computed result{lce.reduced_loss(), lce.num_valid()};
    Kokkos::fence();
    return result;
  };
  steps.download = [&] {
    hidden = weight = Matrix();
    bias = InVector();
    h_loss = to_host(loss);
    h_grad_hidden = to_host(grad_hidden);
    h_grad_weight = to_host(grad_weight);
    h_grad_bias = to_host(grad_bias);
    return h_loss.data();
  };
  steps.output_bytes = cfg.grad ? ((n + v) * h + (input.bias ? v : 0)) * std::int64_t(sizeof(T)) : 0;
  steps.create = [&](H5File& out) {
    if (cfg.grad) {
      out.create_dataset("/grad_hidden", {n, h}, little_endian_type<T>());
      out.create_dataset("/grad_weight", {v, h}, little_endian_type<T>());
      if (input.bias) out.create_dataset("/grad_bias", {v}, little_endian_type<T>());
    }
    out.write_attribute("hidden_dtype", to_string(dtype_of<Scalar>()));
    out.write_attribute("bias", input.bias ? "/bias" : "none");
    out.write_attribute("sequence_parallel", cfg.sequence_parallel ? "yes" : "no");
    out.write_attribute("chunk_rows", std::to_string(chunk_rows));
  };
  steps.write = [&](H5File& out) {
    if (!cfg.grad) return;
    // Each rank writes its share of /grad_hidden's rows: the rows it holds (sequence-parallel), or the same
    // share of the gradient every rank has.
    const T* mine = h_grad_hidden.data() + (cfg.sequence_parallel ? 0 : my_first * h);
    out.write_rows<T>("/grad_hidden", my_first, my_rows, max_rows, h, mine);
    out.write_rows<T>("/grad_weight", part.begin(), vl, max_vl, h, h_grad_weight.data());
    if (input.bias) out.write_range<T>("/grad_bias", part.begin(), vl, h_grad_bias.data());
  };
  steps.describe = [&] {
    return std::to_string(n) + " tokens x " + std::to_string(h) + " hidden x " + std::to_string(v) + " vocabulary (" +
           to_string(dtype_of<Scalar>()) + (input.bias ? ", with a bias" : "") + ", " + ranks_text(comm) +
           (cfg.sequence_parallel ? ", sequence-parallel" : "") + ", " + std::to_string(chunk_rows) +
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
                          std::max<std::size_t>(4, element_size(input.type))),
        false);
  dispatch(input.type, [&](auto tag) { run_linear<typename decltype(tag)::type>(comm, cfg, in, input, part); });
  return 0;
#else
  // Every rank throws the same error: exit status 1 everywhere.
  throw Error(
      "linear: this build of vpce has no Kokkos Kernels (vpce::LinearCrossEntropy needs it): "
      "reconfigure with Kokkos Kernels installed (KokkosKernels_ROOT), or use 'vpce loss' on the logits");
#endif
}

}  // namespace vpce::tool
