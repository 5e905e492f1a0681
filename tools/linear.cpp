/// \file linear.cpp
/// \brief `vpce linear`: the LM head fused with the loss (vpce::LinearCrossEntropy) on HDF5 files.

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
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
  using LCE = LinearCrossEntropy<Scalar>;
  using mem = typename LCE::memory_space;
  using Matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, mem>;
  const std::int64_t n = input.n, h = input.h, v = input.v, vl = part.local_size();
  std::int64_t max_vl = 0;
  for (int r = 0; r < comm.size(); ++r) max_vl = std::max(max_vl, part.local_size(r));
  const bool reduced = cfg.reduction != Reduction::none;

  Matrix hidden, weight, grad_hidden, grad_weight;
  Kokkos::View<std::int64_t*, mem> targets;
  Kokkos::View<Scalar*, mem> loss;
  auto alloc = [](const char* label) { return Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)); };
  collectively(comm, [&] {
    try {
      hidden = Matrix(alloc("vpce::tool::hidden"), n, h);
      weight = Matrix(alloc("vpce::tool::weight"), vl, h);
      targets = decltype(targets)(alloc("vpce::tool::targets"), n);
      loss = decltype(loss)(alloc("vpce::tool::loss"), n);
      if (cfg.grad) {
        grad_hidden = Matrix(alloc("vpce::tool::grad_hidden"), n, h);
        grad_weight = Matrix(alloc("vpce::tool::grad_weight"), vl, h);
      }
    } catch (const std::exception&) {
      const double bytes = (double(n) + double(vl)) * double(h) * double(sizeof(Scalar)) * (cfg.grad ? 2 : 1) +
                           double(n) * 16;
      std::ostringstream msg;
      msg.precision(3);
      msg << cfg.input << ": not enough memory for this rank's " << n << " x " << h << " hidden states and "
          << vl << " x " << h << " weight rows" << (cfg.grad ? " and their gradients" : "") << " ("
          << bytes / double(1 << 30) << " GiB)";
      throw Error(msg.str());
    }
  });

  // Read: all of /hidden and /targets, this rank's rows of /weight. (Host mirrors are the Views themselves on CPUs.)
  {
    auto h_hidden = Kokkos::create_mirror_view(hidden);
    auto h_weight = Kokkos::create_mirror_view(weight);
    auto h_targets = Kokkos::create_mirror_view(targets);
    in.read_rows<Scalar>("/hidden", 0, n, n, h, h_hidden.data());
    in.read_rows<Scalar>("/weight", part.begin(), vl, max_vl, h, h_weight.data());
    in.read_all<std::int64_t>("/targets", n, h_targets.data());
    in.close();
    fault_point("read");
    agree(comm, targets_error(cfg.input, h_targets.data(), n, v, cfg.ignore_index));
    Kokkos::deep_copy(hidden, h_hidden);
    Kokkos::deep_copy(weight, h_weight);
    Kokkos::deep_copy(targets, h_targets);
  }

  // Compute. Library errors (NaN hidden states, ...) are the same on every rank; name the input file in them.
  double reduced_loss = 0;
  std::int64_t n_valid = 0, chunk_rows = 0;
  fault_point("collective");
  collectively(comm, [&] {
    try {
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
      reduced_loss = lce.reduced_loss();
      n_valid = lce.num_valid();
      Kokkos::fence();
    } catch (const Error& e) {
      throw Error(cfg.input + ": " + e.message());
    } catch (const std::exception& e) {
      throw Error(cfg.input + ": " + e.what());
    }
  });
  hidden = Matrix();
  weight = Matrix();
  auto h_loss = Kokkos::create_mirror_view(loss);
  Kokkos::deep_copy(h_loss, loss);
  auto h_grad_hidden = Kokkos::create_mirror_view(grad_hidden);
  Kokkos::deep_copy(h_grad_hidden, grad_hidden);
  auto h_grad_weight = Kokkos::create_mirror_view(grad_weight);
  Kokkos::deep_copy(h_grad_weight, grad_weight);

  // grad_hidden is the same on every rank: each writes an even share of its rows.
  const int size = comm.size(), rank = comm.rank();
  const std::int64_t base = n / size, extra = n % size;
  const std::int64_t my_rows = base + (rank < extra ? 1 : 0);
  const std::int64_t my_first = rank * base + std::min<std::int64_t>(rank, extra);
  const std::int64_t max_rows = base + (extra ? 1 : 0);
  const std::int64_t elem = sizeof(Scalar);
  const std::int64_t reserve =
      std::int64_t(128) * 1024 + (reduced ? 1 : n) * elem + (cfg.grad ? (n + v) * h * elem : 0);
  write_output(comm, cfg.output, reserve, [&](H5File& out) {
    out.create_dataset("/loss", {reduced ? 1 : n}, little_endian_type<Scalar>());
    if (cfg.grad) {
      out.create_dataset("/grad_hidden", {n, h}, little_endian_type<Scalar>());
      out.create_dataset("/grad_weight", {v, h}, little_endian_type<Scalar>());
    }
    out.write_attribute("hidden_dtype", dtype_name<Scalar>());
    out.write_attribute("chunk_rows", std::to_string(chunk_rows));
    write_common_attributes(out, comm, cfg, n_valid);
    if (reduced) {
      const Scalar value = Scalar(reduced_loss);
      out.write_all<Scalar>("/loss", 1, &value, 0);
    } else {
      out.write_all<Scalar>("/loss", n, h_loss.data(), 0);
    }
    if (cfg.grad) {
      out.write_rows<Scalar>("/grad_hidden", my_first, my_rows, max_rows, h, h_grad_hidden.data() + my_first * h);
      out.write_rows<Scalar>("/grad_weight", part.begin(), vl, max_vl, h, h_grad_weight.data());
    }
  });

  if (!cfg.quiet) {
    std::ostringstream msg;
    msg.precision(6);
    msg << cfg.output << ": " << n << " tokens x " << h << " hidden x " << v << " vocabulary (" << dtype_name<Scalar>()
        << ", " << comm.size() << " rank" << (comm.size() > 1 ? "s" : "") << ", " << chunk_rows
        << " rows per chunk, strategy " << to_string(cfg.strategy) << (cfg.grad ? ", with gradients" : ", loss only")
        << "): ";
    if (cfg.reduction == Reduction::none)
      msg << "mean loss " << (n_valid > 0 ? reduced_loss / double(n_valid) : 0.0);
    else
      msg << to_string(cfg.reduction) << " of the losses " << reduced_loss;
    if (n_valid != n) msg << " (" << n_valid << " tokens not ignored)";
    msg << "\n";
    print0(comm, msg.str());
  }
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
  check_fault_setting();
  check_writable(comm, cfg.output, "output");
  H5File in = H5File::open_read(cfg.input, comm);
  const LinearInput input = check_linear_input(comm, in, cfg);
  const VocabPartition part = cfg.have_partition ? VocabPartition::from_sizes(cfg.partition, comm, input.v)
                                                 : VocabPartition::even(input.v, comm);
  std::int64_t max_vl = 0;
  for (int r = 0; r < comm.size(); ++r) max_vl = std::max(max_vl, part.local_size(r));
  const std::size_t elem = input.type == HiddenType::float64 ? 8 : 4;
  agree(comm, linear_size_error(cfg.input, input.n, input.h, input.v, max_vl, cfg.chunk_rows, elem), false);
  if (input.type == HiddenType::float64)
    run_linear<double>(comm, cfg, in, input, part);
  else
    run_linear<float>(comm, cfg, in, input, part);
  return 0;
#else
  // Every rank throws the same error: exit status 1 everywhere.
  throw Error("linear: this build of vpce has no Kokkos Kernels (vpce::LinearCrossEntropy needs it): "
              "reconfigure with Kokkos Kernels installed (KokkosKernels_ROOT), or use 'vpce loss' on the logits");
#endif
}

}  // namespace vpce::tool
