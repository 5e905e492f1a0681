#pragma once
/// \file h5io.hpp
/// \brief Parallel HDF5 (MPI-IO, collective transfers) reading and writing for the `vpce` tool.
///
/// Every function here is collective over the communicator unless it says otherwise, and decides its errors
/// collectively: if any rank fails, every rank throws the same vpce::Error (message "FILE: ..."), so no
/// rank is left waiting in a collective that the others skipped.

#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "vpce/communicator.hpp"
#include "vpce/dtype.hpp"
#include "vpce/error.hpp"

namespace vpce::tool {

/// Collective agreement on an error found by some ranks only: if any rank's `local_error` is not empty, every
/// rank throws vpce::Error with the message of the lowest such rank (tagged "(found on rank r)" when not every rank
/// found an error and `tag_rank` is true; checks made by one rank for all pass false).
void agree(const Communicator& comm, const std::string& local_error, bool tag_rank = true);

/// Runs `f` on every rank; an exception it throws on any rank becomes the same vpce::Error on every rank.
template <class F>
void collectively(const Communicator& comm, F&& f);

/// The message of the innermost entry of HDF5's error stack (empty if none), then clears the stack.
std::string h5_error_detail();

/// An HDF5 identifier closed with the matching H5?close when it goes out of scope.
class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer closer) : m_id(id), m_close(closer) {}
  H5Handle(H5Handle&& o) noexcept : m_id(o.m_id), m_close(o.m_close) { o.m_id = H5I_INVALID_HID; }
  H5Handle& operator=(H5Handle&& o) noexcept;
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  ~H5Handle() { reset(); }
  hid_t get() const noexcept { return m_id; }
  bool valid() const noexcept { return m_id >= 0; }
  /// Closes now; returns false if H5?close failed.
  bool reset() noexcept;

 private:
  hid_t m_id = H5I_INVALID_HID;
  Closer m_close = nullptr;
};

/// What a dataset holds, read from the file's metadata (no collective needed: every rank reads the same).
struct DatasetInfo {
  bool exists = false;
  std::vector<std::int64_t> dims;  ///< empty for a scalar or a null dataspace
  bool null_space = false;         ///< a null dataspace (no elements, not even one: h5py.Empty)
  enum class Kind { floating, integer, other } kind = Kind::other;
  std::size_t type_size = 0;  ///< bytes per element
  std::string type_name;      ///< float32, float64, int64, uint8, string, ...
};

/// A string attribute of a dataset, read from the file's metadata (not collective).
struct AttributeInfo {
  bool exists = false;
  bool is_string = false;  ///< fixed- or variable-length string (then `value` holds it, padding removed)
  std::string value;
  std::string type_name;  ///< what it is when not a string (e.g. "int64")
};

/// The element H5File reads and writes for data of type S (float, double, vpce::bfloat16, vpce::float16): S
/// itself, or for the 16-bit types their bits (std::uint16_t; the dataset's dtype attribute says which).
template <class S>
using file_element_t = std::conditional_t<is_16bit(dtype_of<S>()), std::uint16_t, S>;

/// Human-readable shape, "7 x 23".
std::string shape_string(const std::vector<std::int64_t>& dims);

/// An HDF5 file opened on every rank of a communicator with the MPI-IO driver.
class H5File {
 public:
  /// Opens an existing file read-only. Errors (missing, a directory, not HDF5) name the file.
  static H5File open_read(const std::string& path, const Communicator& comm);
  /// Creates (truncates) a file for writing; messages name it `display` (e.g. the final name of a temporary).
  static H5File create(const std::string& path, const Communicator& comm, const std::string& display = {});

  const std::string& path() const noexcept { return m_path; }
  /// The name used in messages (the path the user gave).
  const std::string& display_name() const noexcept { return m_display; }

  /// Metadata of a dataset by absolute name ("/logits"); not collective.
  DatasetInfo info(const std::string& name) const;
  /// The attribute `attr` of the existing dataset `dataset`; not collective.
  AttributeInfo attribute(const std::string& dataset, const std::string& attr) const;

  /// Reads rows [0, n_rows) and columns [col_begin, col_begin + col_count) of the 2-D dataset `name` into
  /// `buf` (row-major, n_rows x col_count); `max_col_count` is the largest col_count over the ranks (it sets
  /// the number of collective transfers, which must be the same everywhere). T: float, double or std::uint16_t
  /// (HDF5 converts from the file's type and byte order).
  template <class T>
  void read_columns(const std::string& name, std::int64_t n_rows, std::int64_t col_begin, std::int64_t col_count,
                    std::int64_t max_col_count, T* buf) const;
  /// Reads rows [row_begin, row_begin + row_count) of the 2-D dataset `name` (all its `n_cols` columns) into
  /// `buf` (row-major); `max_row_count` is the largest row_count over the ranks (it sets the number of collective
  /// transfers). A rank may have 0 rows. T: float, double or std::uint16_t.
  template <class T>
  void read_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_count, std::int64_t max_row_count,
                 std::int64_t n_cols, T* buf) const;
  /// Reads the whole 1-D dataset `name` (n entries) on every rank. T: float, double or std::int64_t.
  template <class T>
  void read_all(const std::string& name, std::int64_t n, T* buf) const;
  /// Reads entries [begin, begin + count) of the 1-D dataset `name` into `buf`, each rank its own range (count
  /// may be 0), in one collective transfer. T: float, double or std::uint16_t.
  template <class T>
  void read_range(const std::string& name, std::int64_t begin, std::int64_t count, T* buf) const;
  /// Writes entries [begin, begin + count) of the 1-D dataset `name` from `buf`; as read_range.
  template <class T>
  void write_range(const std::string& name, std::int64_t begin, std::int64_t count, const T* buf);

  /// Creates a dataset of T (float/double/std::uint16_t, little-endian in the file) with the given shape
  /// (contiguous, no fill).
  template <class T>
  void create_dataset(const std::string& name, const std::vector<std::int64_t>& dims);
  /// The same with an explicit file type (e.g. H5T_IEEE_F32LE for a float32 dataset written from doubles:
  /// HDF5 converts on the way out).
  void create_dataset(const std::string& name, const std::vector<std::int64_t>& dims, hid_t file_type);
  /// Writes the 1-D dataset `name` (n entries) from `buf`, which only `writer_rank` needs to hold.
  template <class T>
  void write_all(const std::string& name, std::int64_t n, const T* buf, int writer_rank);
  /// Writes this rank's columns of the 2-D dataset `name`; arguments as in read_columns (T converted to the
  /// dataset's type).
  template <class T>
  void write_columns(const std::string& name, std::int64_t n_rows, std::int64_t col_begin, std::int64_t col_count,
                     std::int64_t max_col_count, const T* buf);
  /// Writes this rank's rows of the 2-D dataset `name`; arguments as in read_rows.
  template <class T>
  void write_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_count, std::int64_t max_row_count,
                  std::int64_t n_cols, const T* buf);
  /// A string attribute on the root group, or on the object `object` (e.g. a dataset, "/grad_logits"); the
  /// same value on every rank.
  void write_attribute(const std::string& name, const std::string& value, const std::string& object = "/");

  /// Makes the file on disk `bytes` long (rank 0, fallocate), so that a full disk, a quota or a file-size limit
  /// is found here, alike on every rank, before anything is allocated or written in the file: a transfer that
  /// fails on some ranks only can leave HDF5 in states that differ between the ranks (the others then wait in a
  /// collective), and closing a file whose allocated size cannot be written fails (and HDF5 1.10 may crash when
  /// it terminates). Call it right after create() with the size the file will have (its metadata lies in the
  /// first 64 KiB block). Nothing is done where the file system cannot reserve space, or with
  /// VPCE_TOOL_RESERVE=0. Collective (error agreed).
  void reserve_space(std::int64_t bytes);

  /// Closes the file on every rank and checks that it closed everywhere (data flushed).
  void close();

 private:
  H5File(const Communicator& comm, std::string path) : m_comm(comm), m_path(std::move(path)), m_display(m_path) {}
  /// This rank's block of a 2-D dataset: rows [row_begin, row_begin + row_count) x columns [col_begin,
  /// col_begin + col_count), and the largest row and column counts over the ranks.
  struct Block {
    std::int64_t row_begin, row_count, max_row_count, col_begin, col_count, max_col_count;
  };
  /// The one transfer of the read_/write_ columns and rows: ceil(max_row_count / R) collective transfers on every
  /// rank, R the rows of max_col_count columns that fit in io_block_bytes(); a rank with nothing left selects none.
  template <class T>
  void transfer_block(bool write, const std::string& name, const Block& block, T* buf) const;
  /// read_range / write_range: entries [begin, begin + count) of a 1-D dataset, in one collective transfer.
  template <class T>
  void transfer_range(bool write, const std::string& name, std::int64_t begin, std::int64_t count, T* buf) const;
  [[noreturn]] void fail(const std::string& what) const;

  Communicator m_comm;
  std::string m_path;
  std::string m_display;
  H5Handle m_file;
  H5Handle m_dxpl;  // collective MPI-IO transfers
};

/// Writes the HDF5 file `path` the way every command writes its output: under the temporary name
/// PATH.tmp.<pid of rank 0> (removed on SIGTERM/SIGINT/SIGHUP), of which rank 0 first reserves `reserve_bytes`
/// on disk (H5File::reserve_space), then `fill` creates and writes its datasets and attributes, then the file is
/// closed and rank 0 renames it to `path` once every rank has confirmed (the fault points "write" and "rename"
/// of the test switch lie between). On any error (agreed: `fill` must use collective, error-agreeing calls) the
/// temporary file is closed under a watchdog and removed, `path` is left as it was, and the error is rethrown.
/// Collective.
void write_output(const Communicator& comm, const std::string& path, std::int64_t reserve_bytes,
                  const std::function<void(H5File&)>& fill);

/// Bytes per collective transfer of a column block (env VPCE_IO_BLOCK_BYTES overrides, for tests): large
/// files move in several transfers, each below MPI-IO's 2 GiB count limit.
std::int64_t io_block_bytes();

// ---------------------------------------------------------------------------------------------------------

template <class F>
void collectively(const Communicator& comm, F&& f) {
  std::string err;
  try {
    f();
  } catch (const Error& e) {
    err = e.message();
  } catch (const std::exception& e) {
    err = e.what();
    if (err.empty()) err = "unknown error";
  }
  agree(comm, err);
}

}  // namespace vpce::tool
