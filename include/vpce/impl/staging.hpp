#pragma once
/// \file staging.hpp
/// \brief Where MPI sees a buffer, and the all-reduces on it: the one place that knows about host staging,
/// fences and GPU-aware MPI (VPCE_ENABLE_GPU_AWARE_MPI). As in kokkos-comm: one trait (mpi_space_t), two
/// helpers (StagedPart::to_mpi / from_mpi), and collectives that fence the execution space once, inside.

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "vpce/config.hpp"
#include "vpce/error.hpp"
#include "vpce/impl/collective.hpp"
#include "vpce/impl/compat.hpp"

namespace vpce::impl {

#if defined(VPCE_ENABLE_GPU_AWARE_MPI)
inline constexpr bool gpu_aware_mpi = true;
#else
inline constexpr bool gpu_aware_mpi = false;
#endif

/// Who applies an all-reduce's operation: MPI's built-in ops can work on device memory with a GPU-aware
/// MPI; vpce's own op (the records' merge) is a host function, so its buffers are always in host memory.
enum class MpiOp { builtin, host_function };

/// Host memory for MPI: pinned with CUDA, so that the copies to and from the device are fast.
#if defined(KOKKOS_ENABLE_CUDA)
using pinned_host_space = Kokkos::CudaHostPinnedSpace;
#else
using pinned_host_space = Kokkos::HostSpace;
#endif

/// The memory MPI works on for a buffer in MemSpace: MemSpace itself when the host can access it, or when
/// MPI is GPU-aware and the op is built in; else host memory.
template <class MemSpace, MpiOp Op>
using mpi_space_t = std::conditional_t<Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible ||
                                           (gpu_aware_mpi && Op == MpiOp::builtin),
                                       MemSpace, pinned_host_space>;

/// The same part of a buffer and of MPI's side of it. to_mpi/from_mpi copy it across (asynchronously on
/// the execution space), and do nothing when both are the same memory.
template <class View, class MpiView>
struct StagedPart {
  View view;
  MpiView mpi;
  template <class ExecSpace>
  void to_mpi(const ExecSpace& exec) const {
    if (view.data() != mpi.data()) Kokkos::deep_copy(exec, mpi, view);
  }
  template <class ExecSpace>
  void from_mpi(const ExecSpace& exec) const {
    if (view.data() != mpi.data()) Kokkos::deep_copy(exec, view, mpi);
  }
};

/// A buffer and where MPI sees it (mpi_space_t): the buffer itself, or a mirror of it.
template <class View, MpiOp Op = MpiOp::builtin>
class Staged {
 public:
  using mpi_space = mpi_space_t<typename View::memory_space, Op>;
  using mpi_view = decltype(mirror_view_no_init(std::declval<mpi_space>(), std::declval<View>()));

  Staged() = default;
  explicit Staged(const View& v) : m_view(v), m_mpi(mirror_view_no_init(mpi_space(), v)) {}

  const View& view() const noexcept { return m_view; }
  const mpi_view& mpi() const noexcept { return m_mpi; }
  /// The part of both that Kokkos::subview(view, args...) selects.
  template <class... Args>
  auto part(Args... args) const {
    auto v = Kokkos::subview(m_view, args...);
    auto m = Kokkos::subview(m_mpi, args...);
    return StagedPart<decltype(v), decltype(m)>{v, m};
  }

 private:
  View m_view;
  mpi_view m_mpi;
};

/// In-place all-reduce of a staged part (contiguous) with a built-in op: copied to MPI's side, one fence,
/// MPI, copied back (asynchronously on exec: fence before reading it on the host).
template <class ExecSpace, class Part>
void allreduce(const ExecSpace& exec, const Part& part, MPI_Op op, MPI_Comm comm) {
  part.to_mpi(exec);
  fence(exec, "vpce::before_allreduce");
  allreduce_builtin(part.mpi.data(), std::int64_t(part.mpi.span()), op, comm);
  part.from_mpi(exec);
}

/// A started all-reduce of records; finish() completes it and copies the merged records back. Records
/// are never touched while it is in flight.
template <class Part>
class PendingReduction {
 public:
  using T = typename decltype(Part::mpi)::non_const_value_type;
  PendingReduction(const Part& part, StartedReduction<T> started) : m_part(part), m_started(std::move(started)) {}
  template <class ExecSpace>
  void finish(const ExecSpace& exec) {
    m_started.finish();
    m_part.from_mpi(exec);
  }

 private:
  Part m_part;
  StartedReduction<T> m_started;
};

/// Starts the in-place all-reduce of a staged part of records with the records' merge (StatsReduction):
/// copied to MPI's side (host memory), one fence, MPI_Iallreduce.
template <class ExecSpace, class Part, class T>
PendingReduction<Part> start_allreduce(const ExecSpace& exec, const Part& part, const StatsReduction<T>& op,
                                       MPI_Comm comm) {
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename decltype(part.mpi)::memory_space>::accessible,
                "the records' merge runs on the host: stage them with MpiOp::host_function");
  part.to_mpi(exec);
  fence(exec, "vpce::before_allreduce");
  return PendingReduction<Part>(part, op.start(part.mpi.data(), std::int64_t(part.mpi.extent(0)) / op.width(), comm));
}

/// The same, completed before it returns.
template <class ExecSpace, class Part, class T>
void allreduce(const ExecSpace& exec, const Part& part, const StatsReduction<T>& op, MPI_Comm comm) {
  start_allreduce(exec, part, op, comm).finish(exec);
}

/// In-place all-gather of a buffer's parts (MPI_Allgatherv in `type` units): `mine` is this rank's part,
/// already in place in `all`; counts and displs say where each rank's part lies. One fence, MPI, the
/// gathered part copied back (asynchronously on exec).
template <class ExecSpace, class MinePart, class AllPart>
void allgatherv_in_place(const ExecSpace& exec, const MinePart& mine, const AllPart& all,
                         const std::vector<int>& counts, const std::vector<int>& displs, MPI_Datatype type,
                         MPI_Comm comm) {
  mine.to_mpi(exec);
  fence(exec, "vpce::before_allgather");
  VPCE_MPI_CHECK(
      MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all.mpi.data(), counts.data(), displs.data(), type, comm));
  all.from_mpi(exec);
}

/// Sums `send` (every rank's, the same length) over the ranks and leaves rank r its `counts[r]` values of
/// the sum, in order, in `recv` (MPI_Reduce_scatter): one fence, MPI, recv copied back (asynchronously).
template <class ExecSpace, class SendPart, class RecvPart>
void reduce_scatter_sum(const ExecSpace& exec, const SendPart& send, const RecvPart& recv,
                        const std::vector<int>& counts, MPI_Comm comm) {
  using T = typename decltype(send.mpi)::non_const_value_type;
  send.to_mpi(exec);
  fence(exec, "vpce::before_reduce_scatter");
  VPCE_MPI_CHECK(MPI_Reduce_scatter(send.mpi.data(), recv.mpi.data(), counts.data(), mpi_datatype<T>(), MPI_SUM, comm));
  recv.from_mpi(exec);
}

}  // namespace vpce::impl
