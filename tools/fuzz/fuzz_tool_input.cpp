/// \file fuzz_tool_input.cpp
/// \brief libFuzzer harness of the `vpce` tool's input side: command lines of `vpce loss` (parse_loss_args, the
/// option conversions of Args) and HDF5 input files built from the fuzz bytes (odd shapes and huge declared
/// dimensions, every kind of dtype, the `dtype` attribute in every form, groups and dangling links in place of
/// datasets, files cut at a fuzz-chosen byte), fed to what `vpce loss` does before computing: H5File::open_read,
/// check_loss_input, size_error, reading the logits' columns and the targets, targets_error.
///
/// One process, MPI initialised once (MPI_COMM_WORLD of size 1). What counts as a bug (a crash for libFuzzer):
/// a sanitizer report (AddressSanitizer, UndefinedBehaviorSanitizer), any exception other than vpce::Error
/// (UsageError for command lines), an error message that repeats the "vpce: " prefix, is printed on more than
/// one line or does not name the input file, an HDF5 object left open, or a result that breaks what the tool
/// relies on (e.g. a partition that does not add up to V, a negative N). The first input byte chooses the mode; see
/// README.md next to this file.

#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "h5io.hpp"
#include "linear_input.hpp"
#include "loss_input.hpp"
#include "tool.hpp"
#include "vpce/communicator.hpp"
#include "vpce/dtype.hpp"
#include "vpce/error.hpp"

using namespace vpce;
using namespace vpce::tool;

namespace {

Communicator* g_comm = nullptr;
std::string g_path;  // the file each input is written to

[[noreturn]] void bug(const std::string& what) {
  std::fprintf(stderr, "fuzz_tool_input: BUG: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

/// `msg`: an Error's message(), or a message the tool would put in one (the prefix is Error's).
void check_message(const std::string& msg, const std::string& must_contain) {
  if (msg.rfind("vpce:", 0) == 0) bug("a message with its own 'vpce:' prefix (Error::what() adds it): " + msg);
  const std::string printed = printed_message(msg);
  if (printed.find_first_of("\n\r") != std::string::npos) bug("a printed message of several lines: " + printed);
  if (!must_contain.empty() && msg.find(must_contain) == std::string::npos)
    bug("message does not name '" + must_contain + "': " + msg);
}

// ------------------------------------------------------------------------------------------- command lines

// clang-format off
const char* const tokens[] = {
    "--input", "--output", "--grad", "--grad-dtype", "--lse", "--strategy", "--mode", "--partition", "--ignore-index",
    "--reduction", "--label-smoothing", "--z-loss", "--logit-scale", "--softcap", "--quiet", "-h", "--help", "--",
    "-", "--grad=", "--partition=", "--input=", "--=", "in.h5", "out.h5", "fused", "seed", "stash", "recompute",
    "float32", "logits", "none", "sum", "mean", "0", "1", "-1", "0.5", "1.5", "1e-5", "-0", "+0", "nan", "-nan",
    "inf", "-inf", "infinity", "1e308", "1e309", "-1e309", "1e-400", "0x1p-3", "0x", " 1", "1 ", "", "5,5",
    "23,0", ",", "1,", ",1", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
    "-9223372036854775809", "9223372036854775807,1", "18446744073709551615", "--kokkos-num-threads=2", "abc",
    "--chunk-rows", "--chunk-rows=", "linear",
};
// clang-format on

void fuzz_args(FuzzedDataProvider& fdp) {
  const int nranks = fdp.ConsumeIntegralInRange<int>(1, 5);
  const int count = fdp.ConsumeIntegralInRange<int>(0, 14);
  std::vector<std::string> argv;
  for (int k = 0; k < count && fdp.remaining_bytes() > 0; ++k) {
    const unsigned pick = fdp.ConsumeIntegralInRange<unsigned>(0, sizeof tokens / sizeof tokens[0] + 3);
    if (pick < sizeof tokens / sizeof tokens[0]) {
      argv.emplace_back(tokens[pick]);
    } else if (pick == sizeof tokens / sizeof tokens[0]) {  // glue two tokens: "--partition=5,5", "1,-1"
      std::string a = tokens[fdp.ConsumeIntegralInRange<unsigned>(0, sizeof tokens / sizeof tokens[0] - 1)];
      a += tokens[fdp.ConsumeIntegralInRange<unsigned>(0, sizeof tokens / sizeof tokens[0] - 1)];
      argv.push_back(a);
    } else {
      std::string a = fdp.ConsumeRandomLengthString(40);
      a.erase(std::remove(a.begin(), a.end(), '\0'), a.end());  // a C command line holds no NUL
      argv.push_back(a);
    }
  }
  try {
    const LossConfig cfg = parse_loss_args(argv, nranks);
    if (cfg.help) return;
    // What a parse that succeeds guarantees to the rest of the tool.
    if (cfg.input.empty() || cfg.output.empty()) bug("empty --input or --output accepted");
    if (!(cfg.label_smoothing >= 0 && cfg.label_smoothing <= 1)) bug("label smoothing outside [0, 1] accepted");
    if (!(std::isfinite(cfg.z_loss) && cfg.z_loss >= 0)) bug("bad --z-loss accepted");
    if (!(std::isfinite(cfg.logit_scale) && cfg.logit_scale > 0)) bug("bad --logit-scale accepted");
    if (!(std::isfinite(cfg.softcap) && cfg.softcap >= 0)) bug("bad --softcap accepted");
    if (cfg.mode != "fused" && cfg.mode != "stash" && cfg.mode != "recompute") bug("bad --mode accepted");
    if (!cfg.grad_dtype.empty() && (!cfg.grad || (cfg.grad_dtype != "float32" && cfg.grad_dtype != "logits")))
      bug("bad --grad-dtype accepted");
    if (cfg.have_partition) {
      if (static_cast<int>(cfg.partition.size()) != nranks) bug("a partition of the wrong length accepted");
      for (auto s : cfg.partition)
        if (s < 0) bug("a negative partition size accepted");
    }
  } catch (const UsageError& e) {
    check_message(e.message(), "(see 'vpce loss --help')");
  }
  // The same line as `vpce linear`'s.
  try {
    const LinearConfig cfg = parse_linear_args(argv, nranks);
    if (!cfg.help) {
      if (cfg.input.empty() || cfg.output.empty()) bug("linear: empty --input or --output accepted");
      if (cfg.chunk_rows < 0) bug("linear: a negative --chunk-rows accepted");
      if (!(cfg.label_smoothing >= 0 && cfg.label_smoothing <= 1)) bug("linear: label smoothing outside [0, 1]");
      if (!(std::isfinite(cfg.z_loss) && cfg.z_loss >= 0)) bug("linear: bad --z-loss accepted");
      if (!(std::isfinite(cfg.logit_scale) && cfg.logit_scale > 0)) bug("linear: bad --logit-scale accepted");
      if (!(std::isfinite(cfg.softcap) && cfg.softcap >= 0)) bug("linear: bad --softcap accepted");
      if (cfg.have_partition && static_cast<int>(cfg.partition.size()) != nranks)
        bug("linear: a partition of the wrong length accepted");
    }
  } catch (const UsageError& e) {
    check_message(e.message(), "(see 'vpce linear --help')");
  }
  // The conversions of the other commands' options (Args::get_int / get_double with their ranges).
  try {
    Args args("bench", {{"tokens", true}, {"reps", true}, {"json", true}, {"x", true}, {"flag", false}}, argv);
    if (args.help()) return;
    const std::int64_t t = args.get_int("tokens", 4096, 1, std::int64_t(1) << 40);
    if (t < 1 || t > (std::int64_t(1) << 40)) bug("get_int out of its range");
    const double x = args.get_double("x", 0.5);
    if (args.has("x") && std::isinf(x) && args.get("x").find_first_of("iI") == std::string::npos)
      bug("get_double accepted an overflowing number: " + args.get("x"));
  } catch (const UsageError& e) {
    check_message(e.message(), "(see 'vpce bench --help')");
  }
}

// ------------------------------------------------------------------------------------------- HDF5 files

/// A datatype for a dataset or attribute, chosen by the fuzzer (the caller closes it).
hid_t make_type(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 22)) {
    case 0:
      return H5Tcopy(H5T_STD_I8LE);
    case 1:
      return H5Tcopy(H5T_STD_U8LE);
    case 2:
      return H5Tcopy(H5T_STD_I16LE);
    case 3:
      return H5Tcopy(H5T_STD_U16LE);
    case 4:
      return H5Tcopy(H5T_STD_U16BE);
    case 5:
      return H5Tcopy(H5T_STD_I32LE);
    case 6:
      return H5Tcopy(H5T_STD_U32BE);
    case 7:
      return H5Tcopy(H5T_STD_I64LE);
    case 8:
      return H5Tcopy(H5T_STD_I64BE);
    case 9:
      return H5Tcopy(H5T_STD_U64LE);
    case 10:
      return H5Tcopy(H5T_IEEE_F32LE);
    case 11:
      return H5Tcopy(H5T_IEEE_F32BE);
    case 12:
      return H5Tcopy(H5T_IEEE_F64LE);
    case 13: {  // IEEE half precision (HDF5 1.10 has no predefined one)
      hid_t t = H5Tcopy(H5T_IEEE_F32LE);
      H5Tset_fields(t, 15, 10, 5, 0, 10);
      H5Tset_size(t, 2);
      H5Tset_ebias(t, 15);
      return t;
    }
    case 14: {  // fixed-length string
      hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, fdp.ConsumeIntegralInRange<int>(1, 12));
      return t;
    }
    case 15: {  // variable-length string
      hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, H5T_VARIABLE);
      return t;
    }
    case 16: {  // compound {float32, int64}
      hid_t t = H5Tcreate(H5T_COMPOUND, 12);
      H5Tinsert(t, "a", 0, H5T_IEEE_F32LE);
      H5Tinsert(t, "b", 4, H5T_STD_I64LE);
      return t;
    }
    case 17: {  // enum (h5py's bool)
      hid_t t = H5Tenum_create(H5T_STD_I8LE);
      signed char f = 0, tr = 1;
      H5Tenum_insert(t, "FALSE", &f);
      H5Tenum_insert(t, "TRUE", &tr);
      return t;
    }
    case 18: {  // array of 2 float32
      const hsize_t d[1] = {2};
      return H5Tarray_create2(H5T_IEEE_F32LE, 1, d);
    }
    case 19:
      return H5Tcreate(H5T_OPAQUE, 4);
    case 20:
      return H5Tcopy(H5T_STD_B16LE);  // bitfield
    case 21:
      return H5Tcopy(H5T_IEEE_F64BE);
    default: {  // float with odd precision: 4 bytes, 24 bits used
      hid_t t = H5Tcopy(H5T_IEEE_F32LE);
      H5Tset_precision(t, 24);
      return t;
    }
  }
}

hsize_t pick_dim(FuzzedDataProvider& fdp) {
  static const hsize_t dims[] = {0,
                                 1,
                                 2,
                                 3,
                                 5,
                                 7,
                                 16,
                                 33,
                                 std::uint64_t(1) << 31,
                                 std::uint64_t(1) << 40,
                                 (std::uint64_t(1) << 62) + 1,
                                 std::uint64_t(1) << 63,
                                 std::numeric_limits<std::uint64_t>::max() - 1};
  return dims[fdp.ConsumeIntegralInRange<std::size_t>(0, sizeof dims / sizeof dims[0] - 1)];
}

void add_string_attribute(hid_t obj, const char* name, const std::string& value, bool variable) {
  hid_t t = H5Tcopy(H5T_C_S1);
  if (variable) {
    H5Tset_size(t, H5T_VARIABLE);
  } else {
    H5Tset_size(t, std::max<std::size_t>(1, value.size()));
    H5Tset_strpad(t, H5T_STR_NULLPAD);
  }
  hid_t s = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) {
    const char* p = value.c_str();
    if (variable)
      H5Awrite(a, t, &p);
    else
      H5Awrite(a, t, value.data());
    H5Aclose(a);
  }
  H5Sclose(s);
  H5Tclose(t);
}

/// The `dtype` attribute of /logits in one of many forms.
void add_dtype_attribute(FuzzedDataProvider& fdp, hid_t obj) {
  static const char* const values[] = {"bfloat16", "float16", "float8", "", "bfloat16   ", "BFLOAT16", "float16\0x"};
  const int form = fdp.ConsumeIntegralInRange<int>(0, 7);
  if (form <= 3) {
    const bool random = form == 3;
    const std::string v =
        random ? fdp.ConsumeRandomLengthString(24)
               : std::string(values[fdp.ConsumeIntegralInRange<std::size_t>(0, sizeof values / sizeof values[0] - 1)]);
    add_string_attribute(obj, "dtype", v, form == 1);
    return;
  }
  hid_t t = form == 4 ? H5Tcopy(H5T_STD_I64LE) : form == 5 ? H5Tcopy(H5T_IEEE_F32LE) : H5Tcopy(H5T_C_S1);
  if (form >= 6) H5Tset_size(t, 8);
  // An array of strings (form 6) or a string with a null dataspace (form 7); numbers as scalars.
  const hsize_t two[1] = {2};
  hid_t s = form == 6 ? H5Screate_simple(1, two, nullptr) : form == 7 ? H5Screate(H5S_NULL) : H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, "dtype", t, s, H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) {
    char buf[16] = "bfloat16float16";
    if (form != 7) H5Awrite(a, t, buf);
    H5Aclose(a);
  }
  H5Sclose(s);
  H5Tclose(t);
}

/// Creates /name in `file` as the fuzzer says: nothing, a group, a dangling soft link, a committed datatype, or a
/// dataset of a fuzz-chosen type, shape and layout (data written when small).
void add_object(FuzzedDataProvider& fdp, hid_t file, const char* name, bool is_logits) {
  const int what = fdp.ConsumeIntegralInRange<int>(0, 9);
  if (what == 0) return;
  if (what == 1) {
    hid_t g = H5Gcreate2(file, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g >= 0) H5Gclose(g);
    return;
  }
  if (what == 2) {
    H5Lcreate_soft("/nowhere", file, name, H5P_DEFAULT, H5P_DEFAULT);
    return;
  }
  if (what == 3) {
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    H5Tcommit2(file, name, t, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Tclose(t);
    return;
  }
  // A dataset. Usually of the type the tool wants (so the fuzzer gets past the type checks), else any type.
  hid_t type;
  const int typical = fdp.ConsumeIntegralInRange<int>(0, 3);
  if (typical == 0)
    type = make_type(fdp);
  else if (is_logits)
    type = H5Tcopy(typical == 1 ? H5T_IEEE_F32LE : typical == 2 ? H5T_STD_U16LE : H5T_IEEE_F64BE);
  else
    type = H5Tcopy(typical == 1 ? H5T_STD_I64LE : typical == 2 ? H5T_STD_I32BE : H5T_STD_U8LE);
  const int space_kind = fdp.ConsumeIntegralInRange<int>(0, 9);
  int rank = is_logits ? 2 : 1;
  if (space_kind == 0) rank = 0;
  if (space_kind == 1) rank = 3;
  if (space_kind == 2) rank = is_logits ? 1 : 2;
  std::vector<hsize_t> dims(rank);
  const bool small = fdp.ConsumeBool();
  std::uint64_t total = 1;
  bool overflow = false;
  for (auto& d : dims) {
    d = small ? fdp.ConsumeIntegralInRange<hsize_t>(0, 9) : pick_dim(fdp);
    if (d != 0 && total > std::numeric_limits<std::uint64_t>::max() / d) overflow = true;
    total *= d;
  }
  hid_t space = space_kind == 3 ? H5Screate(H5S_NULL)
                : rank == 0     ? H5Screate(H5S_SCALAR)
                                : H5Screate_simple(rank, dims.data(), nullptr);
  if (space_kind == 3 || rank == 0) total = space_kind == 3 ? 0 : 1;
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  // Huge declared shapes need a chunked layout (nothing allocated until written); small ones take any layout.
  const int layout = total > 4096 || overflow ? 1 : fdp.ConsumeIntegralInRange<int>(0, 2);
  if (layout == 1 && rank > 0 && space_kind != 3) {
    std::vector<hsize_t> chunk(rank);
    for (int k = 0; k < rank; ++k) chunk[k] = std::max<hsize_t>(1, std::min<hsize_t>(dims[k], 16));
    H5Pset_chunk(dcpl, rank, chunk.data());
    if (fdp.ConsumeBool()) H5Pset_deflate(dcpl, 1);
  } else if (layout == 2 && total * H5Tget_size(type) < 60000) {
    H5Pset_layout(dcpl, H5D_COMPACT);
  }
  hid_t dset = H5Dcreate2(file, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (dset >= 0) {
    const std::size_t bytes = overflow ? 0 : std::size_t(total) * H5Tget_size(type);
    if (bytes > 0 && total <= 4096 && H5Tis_variable_str(type) <= 0 && H5Tget_class(type) != H5T_STRING) {
      // The data: fuzz bytes, repeated (raw bits: NaN, inf, out-of-range targets all come up).
      std::vector<unsigned char> data(bytes);
      const std::string pattern = fdp.ConsumeRandomLengthString(64);
      for (std::size_t k = 0; k < bytes; ++k) data[k] = pattern.empty() ? 0 : pattern[k % pattern.size()];
      H5Dwrite(dset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
    }
    if (is_logits && fdp.ConsumeIntegralInRange<int>(0, 3) != 0) add_dtype_attribute(fdp, dset);
    H5Dclose(dset);
  }
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Tclose(type);
}

/// Builds g_path from the fuzz bytes; returns false if the file could not be made.
bool build_file(FuzzedDataProvider& fdp, bool linear) {
  const int kind = fdp.ConsumeIntegralInRange<int>(0, 15);
  if (kind == 0) {  // not HDF5 at all (empty, text, or a fuzz-chosen prefix of an HDF5 signature)
    std::FILE* f = std::fopen(g_path.c_str(), "wb");
    if (!f) return false;
    const std::string junk = fdp.ConsumeRandomLengthString(64);
    if (fdp.ConsumeBool()) std::fwrite("\x89HDF\r\n\x1a\n", 1, 8, f);
    std::fwrite(junk.data(), 1, junk.size(), f);
    std::fclose(f);
    return true;
  }
  hid_t file = H5Fcreate(g_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) return false;
  if (linear) {  // `vpce linear`'s /hidden, /weight, /targets (the 2-D ones made like /logits)
    add_object(fdp, file, "hidden", true);
    add_object(fdp, file, "weight", true);
    add_object(fdp, file, "targets", false);
  } else {
    const bool logits_first = fdp.ConsumeBool();
    if (logits_first) add_object(fdp, file, "logits", true);
    add_object(fdp, file, "targets", false);
    if (!logits_first) add_object(fdp, file, "logits", true);
  }
  if (fdp.ConsumeIntegralInRange<int>(0, 7) == 0) add_object(fdp, file, "extra", false);
  H5Fclose(file);
  H5Eclear2(H5E_DEFAULT);
  if (kind == 1 || kind == 2) {  // cut at a fuzz-chosen byte
    std::FILE* f = std::fopen(g_path.c_str(), "rb");
    if (!f) return false;
    std::fseek(f, 0, SEEK_END);
    const long size = std::ftell(f);
    std::fclose(f);
    const long cut = fdp.ConsumeIntegralInRange<long>(0, std::max(0L, size - 1));
    if (truncate(g_path.c_str(), cut) != 0) return false;
  }
  return true;
}

void fuzz_linear_file(FuzzedDataProvider& fdp);

void fuzz_file(FuzzedDataProvider& fdp) {
  if (fdp.ConsumeIntegralInRange<int>(0, 2) == 0) {
    fuzz_linear_file(fdp);
    return;
  }
  if (!build_file(fdp, false)) return;
  LossConfig cfg;
  cfg.input = g_path;
  cfg.output = g_path + ".out";
  cfg.ignore_index = fdp.ConsumeBool() ? -100 : fdp.ConsumeIntegral<std::int64_t>();
  if (fdp.ConsumeIntegralInRange<int>(0, 3) == 0) {  // a --partition of 1 to 4 sizes (as parse_loss_args gives)
    cfg.have_partition = true;
    const int parts = fdp.ConsumeIntegralInRange<int>(1, 4);
    for (int k = 0; k < parts; ++k) {
      const std::int64_t size = fdp.ConsumeBool() ? std::int64_t(fdp.ConsumeIntegralInRange<int>(0, 40))
                                                  : fdp.ConsumeIntegralInRange<std::int64_t>(0, INT64_MAX);
      cfg.partition.push_back(size);
      cfg.partition_text += (k ? "," : "") + std::to_string(size);
    }
  }
  // The slice of the columns a rank of a bigger job would read.
  const int ranks = fdp.ConsumeIntegralInRange<int>(1, 4);
  const int my = fdp.ConsumeIntegralInRange<int>(0, ranks - 1);
  try {
    H5File in = H5File::open_read(g_path, *g_comm);
    LossInput input;
    try {
      input = check_loss_input(*g_comm, in, cfg);
    } catch (const UsageError& e) {
      check_message(e.message(), g_path);
      if (!cfg.have_partition) bug("UsageError without --partition: " + std::string(e.what()));
      return;
    }
    if (input.n < 0 || input.v < 1)
      bug("check_loss_input accepted N = " + std::to_string(input.n) + ", V = " + std::to_string(input.v));
    if (cfg.have_partition) {
      __int128 sum = 0;
      for (auto p : cfg.partition) sum += p;
      if (sum != input.v) bug("a partition that does not add up to V accepted: " + cfg.partition_text);
    }
    // An even partition of V over `ranks` ranks, as VocabPartition::even makes it.
    const std::int64_t base = input.v / ranks, extra = input.v % ranks;
    const std::int64_t cols = base + (my < extra ? 1 : 0);
    const std::int64_t begin = my * base + std::min<std::int64_t>(my, extra);
    const std::int64_t max_cols = base + (extra ? 1 : 0);
    const std::string size_err = size_error(g_path, input.n, input.v, max_cols, element_size(input.type));
    if (!size_err.empty()) {
      check_message(size_err, g_path);
      return;
    }
    // Reading, as run_loss does, when it fits in a fuzzer's memory.
    if (input.n > 4096 || input.n * cols > (1 << 18)) return;
    std::vector<std::int64_t> targets(std::size_t(input.n) + 1);
    const std::size_t elems = std::size_t(input.n * cols) + 1;
    dispatch(input.type, [&](auto tag) {
      using E = file_element_t<typename decltype(tag)::type>;
      std::vector<E> buf(elems);
      in.read_columns<E>("/logits", input.n, begin, cols, max_cols, buf.data());
    });
    in.read_all<std::int64_t>("/targets", input.n, targets.data());
    in.close();
    const std::string terr = targets_error(g_path, targets.data(), input.n, input.v, cfg.ignore_index);
    if (!terr.empty()) check_message(terr, g_path);
  } catch (const UsageError& e) {
    bug("UsageError from the file checks: " + std::string(e.what()));
  } catch (const Error& e) {
    check_message(e.message(), g_path);
  }
}

/// A --partition of 1 to 4 sizes (as parse_loss_options gives), or none.
void fuzz_partition(FuzzedDataProvider& fdp, LossOptions* cfg) {
  if (fdp.ConsumeIntegralInRange<int>(0, 3) != 0) return;
  cfg->have_partition = true;
  const int parts = fdp.ConsumeIntegralInRange<int>(1, 4);
  for (int k = 0; k < parts; ++k) {
    const std::int64_t size = fdp.ConsumeBool() ? std::int64_t(fdp.ConsumeIntegralInRange<int>(0, 40))
                                                : fdp.ConsumeIntegralInRange<std::int64_t>(0, INT64_MAX);
    cfg->partition.push_back(size);
    cfg->partition_text += (k ? "," : "") + std::to_string(size);
  }
}

/// What `vpce linear` does before computing: check_linear_input, linear_size_error, reading /hidden (all rows),
/// this rank's rows of /weight and /targets, targets_error.
void fuzz_linear_file(FuzzedDataProvider& fdp) {
  if (!build_file(fdp, true)) return;
  LinearConfig cfg;
  cfg.input = g_path;
  cfg.output = g_path + ".out";
  cfg.ignore_index = fdp.ConsumeBool() ? -100 : fdp.ConsumeIntegral<std::int64_t>();
  cfg.chunk_rows = fdp.ConsumeBool() ? 0 : fdp.ConsumeIntegralInRange<std::int64_t>(0, INT64_MAX);
  fuzz_partition(fdp, &cfg);
  const int ranks = fdp.ConsumeIntegralInRange<int>(1, 4);
  const int my = fdp.ConsumeIntegralInRange<int>(0, ranks - 1);
  try {
    H5File in = H5File::open_read(g_path, *g_comm);
    LinearInput input;
    try {
      input = check_linear_input(*g_comm, in, cfg);
    } catch (const UsageError& e) {
      check_message(e.message(), g_path);
      if (!cfg.have_partition) bug("UsageError without --partition: " + std::string(e.what()));
      return;
    }
    if (input.n < 0 || input.h < 1 || input.v < 1)
      bug("check_linear_input accepted N = " + std::to_string(input.n) + ", H = " + std::to_string(input.h) +
          ", V = " + std::to_string(input.v));
    if (cfg.have_partition) {
      __int128 sum = 0;
      for (auto p : cfg.partition) sum += p;
      if (sum != input.v) bug("a partition that does not add up to V accepted: " + cfg.partition_text);
    }
    const std::int64_t base = input.v / ranks, extra = input.v % ranks;
    const std::int64_t rows = base + (my < extra ? 1 : 0);
    const std::int64_t begin = my * base + std::min<std::int64_t>(my, extra);
    const std::int64_t max_rows = base + (extra ? 1 : 0);
    const std::string size_err =
        linear_size_error(g_path, input.n, input.h, input.v, max_rows, cfg.chunk_rows, element_size(input.type));
    if (!size_err.empty()) {
      check_message(size_err, g_path);
      return;
    }
    if (input.n > 4096 || input.n * input.h > (1 << 18) || rows * input.h > (1 << 18)) return;
    std::vector<std::int64_t> targets(std::size_t(input.n) + 1);
    dispatch(input.type, [&](auto tag) {  // as `vpce linear` reads them: 16-bit types as their bits
      using FileElem = file_element_t<typename decltype(tag)::type>;
      std::vector<FileElem> hb(std::size_t(input.n * input.h) + 1), wb(std::size_t(rows * input.h) + 1);
      in.read_rows<FileElem>("/hidden", 0, input.n, input.n, input.h, hb.data());
      in.read_rows<FileElem>("/weight", begin, rows, max_rows, input.h, wb.data());
    });
    in.read_all<std::int64_t>("/targets", input.n, targets.data());
    in.close();
    const std::string terr = targets_error(g_path, targets.data(), input.n, input.v, cfg.ignore_index);
    if (!terr.empty()) check_message(terr, g_path);
  } catch (const UsageError& e) {
    bug("UsageError from the file checks: " + std::string(e.what()));
  } catch (const Error& e) {
    check_message(e.message(), g_path);
  }
}

void finalize() {
  if (!g_path.empty()) std::remove(g_path.c_str());
  delete g_comm;
  g_comm = nullptr;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Open MPI's own handlers of SIGABRT, SIGBUS, SIGFPE and SIGSEGV would keep libFuzzer from installing its own
  // (and from saving the input that crashed).
  setenv("OMPI_MCA_opal_signal", "", 0);
  set_mpi_io_defaults();  // as the tool does
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  g_comm = new Communicator(MPI_COMM_WORLD);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // as the tool does
  const char* dir = std::getenv("VPCE_FUZZ_WORKDIR");
  g_path = std::string(dir && *dir ? dir : "/tmp") + "/vpce-fuzz-input." + std::to_string(::getpid()) + ".h5";
  std::atexit(finalize);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  if (fdp.ConsumeIntegralInRange<int>(0, 3) == 0)
    fuzz_args(fdp);
  else
    fuzz_file(fdp);
  std::remove(g_path.c_str());
  // Every HDF5 object the tool's code opened is closed again (H5Handle), whatever failed.
  const ssize_t open_objects = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  if (open_objects != 0) bug(std::to_string(open_objects) + " HDF5 objects left open");
  return 0;
}
