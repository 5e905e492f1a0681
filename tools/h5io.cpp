#include "h5io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <type_traits>

#include "tool.hpp"
#include "vpce/error.hpp"

namespace vpce::tool {

void agree(const Communicator& comm, const std::string& local_error, bool tag_rank) {
  // A rank with an error waits a bounded time for the others: they may be stuck in a collective it left (an
  // MPI-IO transfer that failed on this rank only), and then it ends the job.
  const auto a = comm.agree(local_error, {}, [&](MPI_Request* request) {
    if (!local_error.empty())
      wait_or_abort(request, local_error, 1);
    else
      VPCE_MPI_CHECK(MPI_Wait(request, MPI_STATUS_IGNORE));
  });
  if (a.failed()) throw Error(tag_rank ? a.text() : a.message);
}

namespace {

herr_t collect_error(unsigned /*n*/, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  out->push_back(e && e->desc ? e->desc : "");
  return 0;
}

template <class T>
hid_t native_type() {
  if constexpr (std::is_same_v<T, float>)
    return H5T_NATIVE_FLOAT;
  else if constexpr (std::is_same_v<T, double>)
    return H5T_NATIVE_DOUBLE;
  else if constexpr (std::is_same_v<T, std::uint16_t>)
    return H5T_NATIVE_UINT16;
  else {
    static_assert(std::is_same_v<T, std::int64_t>, "float, double, uint16 or int64 only");
    return H5T_NATIVE_INT64;
  }
}

template <class T>
hid_t file_type() {
  if constexpr (std::is_same_v<T, float>)
    return H5T_IEEE_F32LE;
  else if constexpr (std::is_same_v<T, double>)
    return H5T_IEEE_F64LE;
  else if constexpr (std::is_same_v<T, std::uint16_t>)
    return H5T_STD_U16LE;
  else
    return H5T_STD_I64LE;
}

std::string with_detail(const std::string& what) {
  const std::string d = h5_error_detail();
  return d.empty() ? what : what + " (HDF5: " + d + ")";
}

}  // namespace

std::string h5_error_detail() {
  std::vector<std::string> msgs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &msgs);
  H5Eclear2(H5E_DEFAULT);
  // Upward: from where the error was detected to the API call. The innermost entry names the cause
  // (e.g. the MPI-IO or system error); skip empty ones.
  for (const auto& m : msgs)
    if (!m.empty()) return m;
  return {};
}

std::string shape_string(const std::vector<std::int64_t>& dims) {
  if (dims.empty()) return "a scalar";
  std::string s;
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? " x " : "") + std::to_string(dims[i]);
  return s;
}

std::int64_t io_block_bytes() {
  if (const char* env = std::getenv("VPCE_IO_BLOCK_BYTES")) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (end != env && *end == '\0' && v > 0) return v;
  }
  return std::int64_t(1) << 30;
}

H5Handle& H5Handle::operator=(H5Handle&& o) noexcept {
  if (this != &o) {
    reset();
    m_id = o.m_id;
    m_close = o.m_close;
    o.m_id = H5I_INVALID_HID;
  }
  return *this;
}

bool H5Handle::reset() noexcept {
  bool ok = true;
  if (m_id >= 0 && m_close) ok = m_close(m_id) >= 0;
  m_id = H5I_INVALID_HID;
  return ok;
}

void H5File::fail(const std::string& what) const { throw Error(m_display + ": " + what); }

H5File H5File::open_read(const std::string& path, const Communicator& comm) {
  H5File f(comm, path);
  std::string err;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    err = path + ": " + (errno == ENOENT ? std::string("no such file") : std::strerror(errno));
  } else if (S_ISDIR(st.st_mode)) {
    err = path + ": is a directory, not an HDF5 file";
  } else if (!S_ISREG(st.st_mode)) {
    // Opening a FIFO would wait for a writer forever; devices and sockets are no HDF5 files either.
    err = path + ": is " +
          (S_ISFIFO(st.st_mode)   ? "a FIFO"
           : S_ISCHR(st.st_mode)  ? "a character device"
           : S_ISBLK(st.st_mode)  ? "a block device"
           : S_ISSOCK(st.st_mode) ? "a socket"
                                  : "not a regular file") +
          ", not an HDF5 file";
  } else if (::access(path.c_str(), R_OK) != 0) {
    err = path + ": cannot be read: " + std::strerror(errno);
  }
  agree(comm, err);

  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!fapl.valid() || H5Pset_fapl_mpio(fapl.get(), comm.comm(), MPI_INFO_NULL) < 0)
    err = with_detail(path + ": cannot set up MPI-IO file access");
  if (err.empty()) {
    f.m_file = H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
    if (!f.m_file.valid()) err = with_detail(path + ": not an HDF5 file, or it cannot be opened");
  }
  if (err.empty()) {
    f.m_dxpl = H5Handle(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
    if (!f.m_dxpl.valid() || H5Pset_dxpl_mpio(f.m_dxpl.get(), H5FD_MPIO_COLLECTIVE) < 0)
      err = with_detail(path + ": cannot set up collective transfers");
  }
  agree(comm, err);
  return f;
}

H5File H5File::create(const std::string& path, const Communicator& comm, const std::string& display) {
  H5File f(comm, path);
  if (!display.empty()) f.m_display = display;
  std::string err;
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  // All the metadata of the tool's files (a few KiB) in one block at the start of the file, before the data:
  // reserve_space covers it.
  if (!fapl.valid() || H5Pset_fapl_mpio(fapl.get(), comm.comm(), MPI_INFO_NULL) < 0 ||
      H5Pset_meta_block_size(fapl.get(), hsize_t(64) * 1024) < 0)
    err = with_detail(f.m_display + ": cannot set up MPI-IO file access");
  if (err.empty()) {
    f.m_file = H5Handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
    if (!f.m_file.valid()) err = with_detail(f.m_display + ": cannot create " + (display.empty() ? "the file" : path));
  }
  if (err.empty()) {
    f.m_dxpl = H5Handle(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
    if (!f.m_dxpl.valid() || H5Pset_dxpl_mpio(f.m_dxpl.get(), H5FD_MPIO_COLLECTIVE) < 0)
      err = with_detail(f.m_display + ": cannot set up collective transfers");
  }
  agree(comm, err);
  return f;
}

DatasetInfo H5File::info(const std::string& name) const {
  DatasetInfo info;
  const std::string rel = name.size() > 1 && name[0] == '/' ? name.substr(1) : name;
  const htri_t exists = H5Lexists(m_file.get(), rel.c_str(), H5P_DEFAULT);
  H5Eclear2(H5E_DEFAULT);
  if (exists <= 0) return info;
  info.exists = true;
  H5Handle dset(H5Dopen2(m_file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) {
    H5Eclear2(H5E_DEFAULT);
    info.type_name = "not a dataset";
    return info;
  }
  H5Handle space(H5Dget_space(dset.get()), H5Sclose);
  info.null_space = space.valid() && H5Sget_simple_extent_type(space.get()) == H5S_NULL;
  const int nd = space.valid() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  if (nd > 0) {
    std::vector<hsize_t> d(nd);
    H5Sget_simple_extent_dims(space.get(), d.data(), nullptr);
    for (auto x : d) info.dims.push_back(static_cast<std::int64_t>(x));
  }
  H5Handle type(H5Dget_type(dset.get()), H5Tclose);
  const H5T_class_t cls = type.valid() ? H5Tget_class(type.get()) : H5T_NO_CLASS;
  info.type_size = type.valid() ? H5Tget_size(type.get()) : 0;
  const std::string bits = std::to_string(8 * info.type_size);
  switch (cls) {
    case H5T_FLOAT:
      info.kind = DatasetInfo::Kind::floating;
      info.type_name = "float" + bits;
      break;
    case H5T_INTEGER:
      info.kind = DatasetInfo::Kind::integer;
      info.type_name = (H5Tget_sign(type.get()) == H5T_SGN_NONE ? "uint" : "int") + bits;
      break;
    case H5T_STRING:
      info.type_name = "string";
      break;
    case H5T_ENUM:
      info.type_name = "enum (e.g. bool)";
      break;
    case H5T_COMPOUND:
      info.type_name = "compound";
      break;
    default:
      info.type_name = "a non-numeric type";
      break;
  }
  H5Eclear2(H5E_DEFAULT);
  return info;
}

AttributeInfo H5File::attribute(const std::string& dataset, const std::string& attr) const {
  AttributeInfo a;
  const htri_t exists = H5Aexists_by_name(m_file.get(), dataset.c_str(), attr.c_str(), H5P_DEFAULT);
  H5Eclear2(H5E_DEFAULT);
  if (exists <= 0) return a;
  a.exists = true;
  H5Handle at(H5Aopen_by_name(m_file.get(), dataset.c_str(), attr.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  H5Handle type(at.valid() ? H5Aget_type(at.get()) : H5I_INVALID_HID, H5Tclose);
  H5Handle space(at.valid() ? H5Aget_space(at.get()) : H5I_INVALID_HID, H5Sclose);
  if (!type.valid() || !space.valid()) {
    H5Eclear2(H5E_DEFAULT);
    a.type_name = "unreadable";
    return a;
  }
  const H5T_class_t cls = H5Tget_class(type.get());
  const hssize_t count = H5Sget_simple_extent_npoints(space.get());
  if (cls != H5T_STRING || count != 1) {
    const std::string bits = std::to_string(8 * H5Tget_size(type.get()));
    a.type_name = cls == H5T_STRING    ? "an array of " + std::to_string(count) + " strings"
                  : cls == H5T_INTEGER ? (H5Tget_sign(type.get()) == H5T_SGN_NONE ? "uint" : "int") + bits
                  : cls == H5T_FLOAT   ? "float" + bits
                                       : "not a string";
    H5Eclear2(H5E_DEFAULT);
    return a;
  }
  // h5py writes Python strings as variable-length UTF-8, numpy bytes as fixed-length: read either.
  H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
  herr_t rc = mem.valid() ? H5Tset_cset(mem.get(), H5Tget_cset(type.get())) : -1;
  if (H5Tis_variable_str(type.get()) > 0) {
    char* text = nullptr;
    if (rc >= 0) rc = H5Tset_size(mem.get(), H5T_VARIABLE);
    if (rc >= 0) rc = H5Aread(at.get(), mem.get(), &text);
    if (rc >= 0 && text) a.value = text;
    if (text) H5free_memory(text);
  } else {
    const std::size_t size = H5Tget_size(type.get());
    std::string buf(size + 1, '\0');
    if (rc >= 0) rc = H5Tset_size(mem.get(), size + 1);
    if (rc >= 0) rc = H5Tset_strpad(mem.get(), H5T_STR_NULLTERM);
    if (rc >= 0) rc = H5Aread(at.get(), mem.get(), buf.data());
    if (rc >= 0) a.value = buf.c_str();
  }
  H5Eclear2(H5E_DEFAULT);
  if (rc < 0) {
    a.type_name = "an unreadable string";
    return a;
  }
  while (!a.value.empty() && a.value.back() == ' ') a.value.pop_back();  // space-padded fixed-length strings
  a.is_string = true;
  return a;
}

template <class T>
void H5File::transfer_block(bool write, const std::string& name, const Block& b, T* buf) const {
  const char* verb = write ? "write" : "read";
  std::string err;
  H5Handle dset(H5Dopen2(m_file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) err = with_detail(m_display + ": cannot open dataset " + name);
  agree(m_comm, err);
  // The same number of collective transfers on every rank, set by the largest share (max_row_count rows of
  // max_col_count columns), each at most io_block_bytes() on that rank; a rank whose rows are done (or that has
  // none, or no columns) takes part with nothing selected.
  // Rows per transfer, as io_block_bytes() / (max_col_count * sizeof(T)) without forming that product, which
  // overflows for a declared shape of 0 rows x ~2^60 columns (no size check stops it: it holds no element).
  const std::int64_t block = std::max<std::int64_t>(
      1, io_block_bytes() / std::int64_t(sizeof(T)) / std::max<std::int64_t>(1, b.max_col_count));
  T dummy{};
  for (std::int64_t k0 = 0; k0 < b.max_row_count; k0 += block) {
    const std::int64_t rows = std::max<std::int64_t>(0, std::min(block, b.row_count - k0));
    H5Handle fspace(H5Dget_space(dset.get()), H5Sclose);
    H5Handle mspace;
    T* ptr = &dummy;
    herr_t rc = fspace.valid() ? 0 : -1;
    if (rc >= 0 && rows > 0 && b.col_count > 0) {
      const hsize_t start[2] = {hsize_t(b.row_begin + k0), hsize_t(b.col_begin)};
      const hsize_t count[2] = {hsize_t(rows), hsize_t(b.col_count)};
      rc = H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
      mspace = H5Handle(H5Screate_simple(2, count, nullptr), H5Sclose);
      ptr = buf + k0 * b.col_count;
    } else if (rc >= 0) {
      // Nothing of this rank in this transfer: it still takes part in the collective, with nothing selected.
      rc = H5Sselect_none(fspace.get());
      const hsize_t one[1] = {1};
      mspace = H5Handle(H5Screate_simple(1, one, nullptr), H5Sclose);
      if (mspace.valid() && rc >= 0) rc = H5Sselect_none(mspace.get());
    }
    if (rc >= 0 && !mspace.valid()) rc = -1;
    if (rc >= 0) {
      rc = write ? H5Dwrite(dset.get(), native_type<T>(), mspace.get(), fspace.get(), m_dxpl.get(), ptr)
                 : H5Dread(dset.get(), native_type<T>(), mspace.get(), fspace.get(), m_dxpl.get(), ptr);
    }
    if (rc < 0)
      err = with_detail(m_display + ": cannot " + verb + " rows " + std::to_string(b.row_begin + k0) + ".." +
                        std::to_string(b.row_begin + k0 + rows) + " of dataset " + name);
    agree(m_comm, err);
  }
}

template <class T>
void H5File::read_columns(const std::string& name, std::int64_t n_rows, std::int64_t col_begin, std::int64_t col_count,
                          std::int64_t max_col_count, T* buf) const {
  transfer_block<T>(false, name, Block{0, n_rows, n_rows, col_begin, col_count, max_col_count}, buf);
}

template <class T>
void H5File::write_columns(const std::string& name, std::int64_t n_rows, std::int64_t col_begin, std::int64_t col_count,
                           std::int64_t max_col_count, const T* buf) {
  transfer_block<T>(true, name, Block{0, n_rows, n_rows, col_begin, col_count, max_col_count}, const_cast<T*>(buf));
}

template <class T>
void H5File::read_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_count,
                       std::int64_t max_row_count, std::int64_t n_cols, T* buf) const {
  transfer_block<T>(false, name, Block{row_begin, row_count, max_row_count, 0, n_cols, n_cols}, buf);
}

template <class T>
void H5File::write_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_count,
                        std::int64_t max_row_count, std::int64_t n_cols, const T* buf) {
  transfer_block<T>(true, name, Block{row_begin, row_count, max_row_count, 0, n_cols, n_cols}, const_cast<T*>(buf));
}

template <class T>
void H5File::read_all(const std::string& name, std::int64_t n, T* buf) const {
  std::string err;
  H5Handle dset(H5Dopen2(m_file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) err = with_detail(m_display + ": cannot open dataset " + name);
  agree(m_comm, err);
  if (n == 0) return;
  if (H5Dread(dset.get(), native_type<T>(), H5S_ALL, H5S_ALL, m_dxpl.get(), buf) < 0)
    err = with_detail(m_display + ": cannot read dataset " + name);
  agree(m_comm, err);
}

template <class T>
void H5File::transfer_range(bool write, const std::string& name, std::int64_t begin, std::int64_t count, T* buf) const {
  std::string err;
  H5Handle dset(H5Dopen2(m_file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) err = with_detail(m_display + ": cannot open dataset " + name);
  agree(m_comm, err);
  H5Handle fspace(H5Dget_space(dset.get()), H5Sclose);
  const hsize_t start[1] = {hsize_t(begin)}, n[1] = {hsize_t(count > 0 ? count : 1)};
  H5Handle mspace(H5Screate_simple(1, n, nullptr), H5Sclose);
  T dummy{};
  herr_t rc = fspace.valid() && mspace.valid() ? 0 : -1;
  if (rc >= 0 && count > 0) {
    rc = H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, n, nullptr);
  } else if (rc >= 0) {  // nothing here: still part of the collective transfer, with nothing selected
    rc = H5Sselect_none(fspace.get());
    if (rc >= 0) rc = H5Sselect_none(mspace.get());
  }
  T* const ptr = count > 0 ? buf : &dummy;
  if (rc >= 0)
    rc = write ? H5Dwrite(dset.get(), native_type<T>(), mspace.get(), fspace.get(), m_dxpl.get(), ptr)
               : H5Dread(dset.get(), native_type<T>(), mspace.get(), fspace.get(), m_dxpl.get(), ptr);
  if (rc < 0)
    err = with_detail(m_display + ": cannot " + (write ? "write" : "read") + " entries " + std::to_string(begin) +
                      ".." + std::to_string(begin + count) + " of dataset " + name);
  agree(m_comm, err);
}

template <class T>
void H5File::read_range(const std::string& name, std::int64_t begin, std::int64_t count, T* buf) const {
  transfer_range<T>(false, name, begin, count, buf);
}

template <class T>
void H5File::write_range(const std::string& name, std::int64_t begin, std::int64_t count, const T* buf) {
  transfer_range<T>(true, name, begin, count, const_cast<T*>(buf));
}

template <class T>
void H5File::create_dataset(const std::string& name, const std::vector<std::int64_t>& dims) {
  create_dataset(name, dims, file_type<T>());
}

void H5File::create_dataset(const std::string& name, const std::vector<std::int64_t>& dims, hid_t file_type) {
  std::string err;
  std::vector<hsize_t> d(dims.begin(), dims.end());
  H5Handle space(H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr), H5Sclose);
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!space.valid() || !dcpl.valid() || H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER) < 0 ||
      H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY) < 0) {
    err = with_detail(m_display + ": cannot describe dataset " + name);
  }
  if (err.empty()) {
    H5Handle dset(H5Dcreate2(m_file.get(), name.c_str(), file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                  H5Dclose);
    if (!dset.valid()) err = with_detail(m_display + ": cannot create dataset " + name);
  }
  agree(m_comm, err);
}

template <class T>
void H5File::write_all(const std::string& name, std::int64_t n, const T* buf, int writer_rank) {
  std::string err;
  H5Handle dset(H5Dopen2(m_file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) err = with_detail(m_display + ": cannot open dataset " + name);
  agree(m_comm, err);
  if (n == 0) return;
  const bool mine = m_comm.rank() == writer_rank;
  H5Handle fspace(H5Dget_space(dset.get()), H5Sclose);
  const hsize_t count[1] = {hsize_t(mine ? n : 1)};
  H5Handle mspace(H5Screate_simple(1, count, nullptr), H5Sclose);
  herr_t rc = fspace.valid() && mspace.valid() ? 0 : -1;
  if (rc >= 0 && !mine) rc = std::min(H5Sselect_none(fspace.get()), H5Sselect_none(mspace.get()));
  T dummy{};
  if (rc >= 0)
    rc = H5Dwrite(dset.get(), native_type<T>(), mspace.get(), fspace.get(), m_dxpl.get(), mine ? buf : &dummy);
  if (rc < 0) err = with_detail(m_display + ": cannot write dataset " + name);
  agree(m_comm, err);
}

void H5File::write_attribute(const std::string& name, const std::string& value, const std::string& object) {
  std::string err;
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  herr_t rc = type.valid() && space.valid() ? 0 : -1;
  if (rc >= 0) rc = H5Tset_size(type.get(), std::max<std::size_t>(1, value.size()));
  if (rc >= 0) rc = H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  if (rc >= 0) {
    H5Handle attr(H5Acreate_by_name(m_file.get(), object.c_str(), name.c_str(), type.get(), space.get(), H5P_DEFAULT,
                                    H5P_DEFAULT, H5P_DEFAULT),
                  H5Aclose);
    rc = attr.valid() ? H5Awrite(attr.get(), type.get(), value.empty() ? "" : value.data()) : -1;
  }
  if (rc < 0)
    err =
        with_detail(m_display + ": cannot write attribute " + name + (object == "/" ? std::string() : " of " + object));
  agree(m_comm, err);
}

void H5File::reserve_space(std::int64_t bytes) {
  std::string err;
  const char* env = std::getenv("VPCE_TOOL_RESERVE");
  if (bytes <= 0 || (env && std::string(env) == "0")) return;
  if (m_comm.rank() == 0) {
    const int fd = ::open(m_path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      err = m_display + ": cannot open " + m_path + " to reserve its space: " + std::strerror(errno);
    } else {
      if (::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0 && errno != EOPNOTSUPP && errno != ENOSYS &&
          errno != EINVAL)
        err = m_display + ": cannot reserve its " + std::to_string(static_cast<long long>(bytes)) +
              " bytes on disk: " + std::strerror(errno);
      ::close(fd);
    }
  }
  agree(m_comm, err, false);
}

void H5File::close() {
  std::string err;
  m_dxpl.reset();
  if (!m_file.reset()) err = with_detail(m_display + ": closing the file failed");
  agree(m_comm, err);
}

void write_output(const Communicator& comm, const std::string& path, std::int64_t reserve_bytes,
                  const std::function<void(H5File&)>& fill) {
  long long pid = ::getpid();
  VPCE_MPI_CHECK(MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, comm.comm()));
  const std::string tmp = path + ".tmp." + std::to_string(pid);
  // If the job is ended by a signal (mpiexec terminates the other ranks when one dies), the ranks still alive
  // remove the temporary file: a killed job leaves neither OUT.h5 nor OUT.h5.tmp.* (unless every rank is
  // killed outright).
  const RemoveOnSignal remove_on_signal(tmp);
  std::optional<H5File> out_file;
  try {
    out_file.emplace(H5File::create(tmp, comm, path));
    H5File& out = *out_file;
    // A full disk is found here, before anything is allocated in the file.
    out.reserve_space(reserve_bytes);
    fill(out);
    fault_point("write");
    out.close();
    fault_point("rename");
    // The commit: rank 0 renames only once every rank has closed the file and is still there to say so (a rank
    // that died before this point leaves the others waiting here until mpiexec ends the job: no OUT.h5).
    agree(comm, std::string(), false);
    std::string err;
    if (comm.rank() == 0 && std::rename(tmp.c_str(), path.c_str()) != 0)
      err = path + ": cannot rename " + tmp + " to it: " + std::strerror(errno);
    agree(comm, err, false);
  } catch (...) {
    // Every rank gets here together (errors are agreed). Closing the file is collective, and a transfer that
    // failed on some ranks only can leave HDF5 in states that differ between the ranks, so that the close never
    // ends: the watchdog bounds it (it removes the file and ends the job).
    std::string what = path + ": writing failed";
    try {
      throw;
    } catch (const Error& e) {
      what = e.message();
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    {
      const CleanupWatchdog watchdog(what, tmp, abort_timeout());
      out_file.reset();
      MPI_Barrier(comm.comm());
    }
    if (comm.rank() == 0) std::remove(tmp.c_str());
    throw;
  }
}

template void H5File::read_columns<float>(const std::string&, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                          float*) const;
template void H5File::read_columns<double>(const std::string&, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                           double*) const;
template void H5File::read_columns<std::uint16_t>(const std::string&, std::int64_t, std::int64_t, std::int64_t,
                                                  std::int64_t, std::uint16_t*) const;
template void H5File::write_columns<std::uint16_t>(const std::string&, std::int64_t, std::int64_t, std::int64_t,
                                                   std::int64_t, const std::uint16_t*);
template void H5File::write_columns<float>(const std::string&, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                           const float*);
template void H5File::write_columns<double>(const std::string&, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                            const double*);
template void H5File::read_rows<float>(const std::string&, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                       float*) const;
template void H5File::read_rows<double>(const std::string&, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                        double*) const;
template void H5File::write_rows<float>(const std::string&, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                        const float*);
template void H5File::write_rows<double>(const std::string&, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                         const double*);
template void H5File::read_all<std::int64_t>(const std::string&, std::int64_t, std::int64_t*) const;
template void H5File::read_all<float>(const std::string&, std::int64_t, float*) const;
template void H5File::read_all<double>(const std::string&, std::int64_t, double*) const;
template void H5File::read_range<float>(const std::string&, std::int64_t, std::int64_t, float*) const;
template void H5File::read_range<double>(const std::string&, std::int64_t, std::int64_t, double*) const;
template void H5File::read_range<std::uint16_t>(const std::string&, std::int64_t, std::int64_t, std::uint16_t*) const;
template void H5File::write_range<float>(const std::string&, std::int64_t, std::int64_t, const float*);
template void H5File::write_range<double>(const std::string&, std::int64_t, std::int64_t, const double*);
template void H5File::read_rows<std::uint16_t>(const std::string&, std::int64_t, std::int64_t, std::int64_t,
                                               std::int64_t, std::uint16_t*) const;
template void H5File::create_dataset<float>(const std::string&, const std::vector<std::int64_t>&);
template void H5File::create_dataset<double>(const std::string&, const std::vector<std::int64_t>&);
template void H5File::create_dataset<std::uint16_t>(const std::string&, const std::vector<std::int64_t>&);
template void H5File::write_all<float>(const std::string&, std::int64_t, const float*, int);
template void H5File::write_all<double>(const std::string&, std::int64_t, const double*, int);

}  // namespace vpce::tool
