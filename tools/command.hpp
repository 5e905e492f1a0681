#pragma once
/// \file command.hpp
/// \brief What the computing commands (`vpce loss`, `vpce linear`) share: opening their input, the partition, the
/// HDF5 types and attributes of their outputs, and ONE command skeleton (run_command): allocate, read collectively,
/// check the targets, compute collectively, write the output through write_output's checked temporary file,
/// print the summary. A command gives its own steps (CommandSteps) and the skeleton calls them in order.

#include <hdf5.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>

#include "h5io.hpp"
#include "loss_input.hpp"
#include "tool.hpp"
#include "vpce/communicator.hpp"
#include "vpce/dtype.hpp"
#include "vpce/error.hpp"
#include "vpce/partition.hpp"

namespace vpce::tool {

/// Shortest text that reads back as the same double ("0.1", "1e-05").
std::string number_text(double x);

/// "1 rank", "3 ranks".
std::string ranks_text(const Communicator& comm);

/// The file type of an output dataset of S (16-bit types: their bits, tagged with a dtype attribute).
template <class S>
hid_t little_endian_type() {
  if constexpr (std::is_same_v<S, float>)
    return H5T_IEEE_F32LE;
  else if constexpr (std::is_same_v<S, double>)
    return H5T_IEEE_F64LE;
  else
    return H5T_STD_U16LE;
}

/// The root attributes of an output: vpce_version, input, strategy, ranks, reduction, ignore_index,
/// label_smoothing, z_loss, logit_scale, softcap, num_valid. Collective.
void write_common_attributes(H5File& out, const Communicator& comm, const LossOptions& cfg, std::int64_t n_valid);

/// What a computing command does before it reads its input's metadata: checks the fault switch's form and that
/// the output can be created, then opens the input. Collective (errors agreed).
H5File open_input(const Communicator& comm, const LossOptions& cfg);

/// The split of `v` vocabulary entries over the ranks: --partition's sizes, or even. Collective.
VocabPartition partition_of(const Communicator& comm, const LossOptions& cfg, std::int64_t v);

/// A View's allocation property: the label, no initialisation (every element is read or computed before use).
inline auto uninitialized(const char* label) {
  return Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label));
}

/// A host copy of the View `v` (the View itself where the host can read it; an empty View for an empty one).
template <class V>
typename V::HostMirror to_host(const V& v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  return h;
}

/// What a command's computation gives the skeleton.
struct Computed {
  double reduced_loss = 0;   ///< the library's reduced_loss(): the sum, or the mean, of the per-token losses
  std::int64_t n_valid = 0;  ///< tokens not ignored
};

/// A computing command's own steps, in the order run_command calls them (on every rank). LossT: the element type
/// of the output's /loss. The callbacks may hold references to the command's Views: the skeleton runs them all
/// before it returns.
template <class LossT>
struct CommandSteps {
  std::int64_t n = 0;  ///< tokens (rows; entries of /targets)
  std::int64_t v = 0;  ///< the vocabulary (the targets' range)

  /// Allocates the Views. Any exception from it becomes, on every rank, "INPUT: not enough memory for this
  /// rank's <memory_what> (<memory_bytes in GiB> GiB)".
  std::function<void()> allocate;
  std::string memory_what;
  double memory_bytes = 0;
  /// Reads the command's own datasets (this rank's share, collective transfers) into host memory and returns the
  /// host buffer of N entries that the skeleton reads /targets into (after them), or nullptr when the command
  /// reads no /targets (target probabilities).
  std::function<std::int64_t*(H5File& in)> read;
  /// Copies what was read to the Views (once the targets are checked).
  std::function<void()> upload;
  /// The library's computation (collective; complete when it returns). The skeleton prefixes the input's name to
  /// its errors (the same on every rank).
  std::function<Computed()> compute;
  /// Frees what the output does not need, copies the outputs to host memory and returns the N per-token losses.
  std::function<const LossT*()> download;
  /// Bytes of the output's datasets besides /loss (reserved on disk with /loss and room for the metadata).
  std::int64_t output_bytes = 0;
  /// Creates the command's datasets (after /loss) and writes its own root attributes (before the common ones).
  std::function<void(H5File& out)> create;
  /// Writes the command's datasets (after /loss).
  std::function<void(H5File& out)> write;
  /// What was computed, for the summary: "7 tokens x 23 vocabulary (float32, 2 ranks, ...)".
  std::function<std::string()> describe;
};

/// THE skeleton of a computing command, around `steps`: allocate (an out-of-memory error names what did not fit),
/// read the command's datasets and /targets, close the input, fault point "read", the targets' check, upload,
/// fault point "collective", compute, download, then write_output (temporary name, reserved space, the /loss
/// dataset — the reduced loss, or the per-token losses —, the command's datasets and attributes, the common
/// attributes, agreed rename) and the summary on rank 0 (unless --quiet). Collective; errors agreed.
template <class LossT>
void run_command(const Communicator& comm, const LossOptions& cfg, H5File& in, const CommandSteps<LossT>& steps) {
  const std::int64_t n = steps.n;
  const bool reduced = cfg.reduction != Reduction::none;
  collectively(comm, [&] {
    try {
      steps.allocate();
    } catch (const std::exception&) {
      // Kokkos' message is a paragraph: say what did not fit instead.
      std::ostringstream msg;
      msg.precision(3);
      msg << cfg.input << ": not enough memory for this rank's " << steps.memory_what << " ("
          << steps.memory_bytes / double(1 << 30) << " GiB)";
      throw Error(msg.str());
    }
  });

  // Read: the command's datasets, then all the targets (every rank). The host buffers are the Views themselves on
  // CPUs.
  std::int64_t* const h_targets = steps.read(in);
  if (h_targets != nullptr) in.read_all<std::int64_t>("/targets", n, h_targets);
  in.close();
  fault_point("read");
  if (h_targets != nullptr) agree(comm, targets_error(cfg.input, h_targets, n, steps.v, cfg.ignore_index));
  steps.upload();

  // Compute. Library errors (NaN logits, ...) are the same on every rank; name the input file in them.
  Computed result;
  fault_point("collective");
  collectively(comm, [&] {
    try {
      result = steps.compute();
    } catch (const Error& e) {
      throw Error(cfg.input + ": " + e.message());
    } catch (const std::exception& e) {
      throw Error(cfg.input + ": " + e.what());
    }
  });
  const LossT* const h_loss = steps.download();

  // Write under a temporary name; rename when every rank has closed it. A full disk is found before anything is
  // allocated in the file: the metadata block, the datasets, and room for the small-data block and rounding.
  const std::int64_t reserve =
      std::int64_t(128) * 1024 + (reduced ? 1 : n) * std::int64_t(sizeof(LossT)) + steps.output_bytes;
  write_output(comm, cfg.output, reserve, [&](H5File& out) {
    out.create_dataset("/loss", {reduced ? 1 : n}, little_endian_type<LossT>());
    steps.create(out);
    write_common_attributes(out, comm, cfg, result.n_valid);
    if (reduced) {
      const LossT value = LossT(result.reduced_loss);
      out.write_all<LossT>("/loss", 1, &value, 0);
    } else {
      out.write_all<LossT>("/loss", n, h_loss, 0);
    }
    steps.write(out);
  });

  if (!cfg.quiet) {
    std::ostringstream msg;
    msg.precision(6);
    msg << cfg.output << ": " << steps.describe() << ": ";
    if (cfg.reduction == Reduction::none)
      msg << "mean loss " << (result.n_valid > 0 ? result.reduced_loss / double(result.n_valid) : 0.0);
    else
      msg << to_string(cfg.reduction) << " of the losses " << result.reduced_loss;
    if (result.n_valid != n) msg << " (" << result.n_valid << " tokens not ignored)";
    msg << "\n";
    print0(comm, msg.str());
  }
}

}  // namespace vpce::tool
