// vpce._vpce: the Python module's native part, over vpce's C API (vpce/vpce.h). Arrays come in through
// nanobind's ndarray (any DLPack producer: numpy, PyTorch, CuPy, JAX) and go to the library as raw pointers:
// nothing is copied. The checks of a call's arguments are agreed on by every rank before the call (one small
// all-reduce), so that a bad argument on one rank fails on every rank with the same vpce.Error, never a hang.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "vpce/communicator.hpp"
#include "vpce/error.hpp"
#include "vpce/vpce.h"

namespace nb = nanobind;

namespace {

/// Raised as vpce.Error in Python.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(vpce_status s) {
  if (s != VPCE_SUCCESS) throw Failure(vpce_last_error());
}

using In = nb::ndarray<nb::ro>;  // an input: read-only arrays are fine
using Out = nb::ndarray<>;

nb::dlpack::dtype dl_type(nb::dlpack::dtype_code code, int bits) {
  return nb::dlpack::dtype{static_cast<std::uint8_t>(code), static_cast<std::uint8_t>(bits), 1};
}

nb::dlpack::dtype dl_type(vpce_dtype t) {
  using C = nb::dlpack::dtype_code;
  switch (t) {
    case VPCE_FLOAT64:
      return dl_type(C::Float, 64);
    case VPCE_BFLOAT16:
      return dl_type(C::Bfloat, 16);
    case VPCE_FLOAT16:
      return dl_type(C::Float, 16);
    default:
      return dl_type(C::Float, 32);
  }
}

std::string type_name(nb::dlpack::dtype t) {
  using C = nb::dlpack::dtype_code;
  std::string kind;
  switch (static_cast<C>(t.code)) {
    case C::Int:
      kind = "int";
      break;
    case C::UInt:
      kind = "uint";
      break;
    case C::Float:
      kind = "float";
      break;
    case C::Bfloat:
      kind = "bfloat";
      break;
    case C::Complex:
      kind = "complex";
      break;
    case C::Bool:
      return "bool";
  }
  return kind + std::to_string(t.bits);
}

template <class A>
std::string shape_of(const A& a) {
  std::string s = "(";
  for (std::size_t d = 0; d < a.ndim(); ++d) s += (d ? ", " : "") + std::to_string(a.shape(d));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

/// Row-major and dense (dimensions of extent 1 may have any stride; an empty array has nothing to place).
template <class A>
bool c_contiguous(const A& a) {
  if (a.size() == 0) return true;
  std::int64_t expect = 1;
  for (std::size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expect) return false;
    expect *= static_cast<std::int64_t>(a.shape(d));
  }
  return true;
}

/// The array's data. An empty array's may be NULL, which the C API reads as a missing array (N rows of an
/// empty vocabulary slice are not missing): a valid address then, never read or written.
template <class A>
void* data(const A& a) {
  static std::int64_t nothing = 0;
  return a.size() == 0 ? &nothing : const_cast<void*>(static_cast<const void*>(a.data()));
}

/// The first failed check of a call's arguments on this rank ("" when all pass).
struct Checks {
  std::string error;
  void require(bool ok, const std::string& message) {
    if (!ok && error.empty()) error = message;
  }
};

class CrossEntropy {
 public:
  CrossEntropy(int comm_f, std::int64_t local_vocab, int dtype, const vpce_options& opt)
      : m_comm(MPI_Comm_f2c(comm_f)),
        m_dtype(static_cast<vpce_dtype>(dtype)),
        m_local(local_vocab),
        m_grad_16(opt.grad_in_logits_type != 0 && (m_dtype == VPCE_BFLOAT16 || m_dtype == VPCE_FLOAT16)),
        m_device(opt.memory_space == VPCE_MEMORY_DEVICE),
        m_probs(opt.probability_targets != 0) {
    check(vpce_create(m_comm.comm(), local_vocab, m_dtype, &opt, &m_handle));
  }
  ~CrossEntropy() { close(); }
  CrossEntropy(const CrossEntropy&) = delete;
  CrossEntropy& operator=(const CrossEntropy&) = delete;

  /// Frees the library's handle (idempotent): before Kokkos is finalised at exit.
  void close() {
    if (m_handle != nullptr) vpce_destroy(m_handle);
    m_handle = nullptr;
  }

  void forward(const In& logits, const In& targets, const Out& loss) {
    Checks c;
    const std::int64_t n = check_logits(c, logits);
    check_targets(c, targets, n);
    check_rows(c, "loss", loss, n, loss_type());
    agree(c);
    m_rows = n;
    nb::gil_scoped_release unlocked;
    if (m_probs) return check(vpce_forward_probs(handle(), n, data(logits), data(targets), data(loss)));
    check(vpce_forward(handle(), n, data(logits), static_cast<const std::int64_t*>(data(targets)), data(loss)));
  }

  void backward(const std::optional<In>& grad_loss, double scale, const Out& grad) {
    Checks c;
    if (grad_loss) check_rows(c, "grad_loss", *grad_loss, m_rows, loss_type());
    check_grad(c, grad, m_rows);
    agree(c);
    nb::gil_scoped_release unlocked;
    check(vpce_backward(handle(), grad_loss ? data(*grad_loss) : nullptr, scale, data(grad)));
  }

  void loss_and_grad(const In& logits, const In& targets, const Out& loss, const Out& grad,
                     const std::optional<In>& grad_loss, double scale) {
    Checks c;
    const std::int64_t n = check_logits(c, logits);
    check_targets(c, targets, n);
    check_rows(c, "loss", loss, n, loss_type());
    check_grad(c, grad, n);
    if (grad_loss) check_rows(c, "grad_loss", *grad_loss, n, loss_type());
    agree(c);
    m_rows = n;
    nb::gil_scoped_release unlocked;
    run_loss_and_grad(logits, targets, loss, grad, grad_loss ? data(*grad_loss) : nullptr, scale);
  }

  /// The benchmark's measure of what the Python layer adds: `reps` loss_and_grad calls (scale 1) made here,
  /// after checking the arguments once; the seconds they took.
  double time_loss_and_grad(const In& logits, const In& targets, const Out& loss, const Out& grad, int reps) {
    loss_and_grad(logits, targets, loss, grad, std::nullopt, 1.0);
    nb::gil_scoped_release unlocked;
    const double t0 = MPI_Wtime();
    for (int r = 0; r < reps; ++r) run_loss_and_grad(logits, targets, loss, grad, nullptr, 1.0);
    return MPI_Wtime() - t0;
  }

  /// A per-row output of the last call into `out` (N values of the loss's type): "lse", "entropy", "logprob"
  /// or "z_loss". Local: no agreement needed.
  void row_output(const std::string& what, const Out& out) {
    Checks c;
    check_rows(c, "out", out, m_rows, loss_type());
    if (!c.error.empty()) throw Failure("vpce: " + c.error);
    vpce_status (*get)(vpce_handle, void*) = what == "lse"       ? vpce_lse
                                             : what == "entropy" ? vpce_entropy
                                             : what == "logprob" ? vpce_logprob
                                             : what == "z_loss"  ? vpce_z_loss_terms
                                                                 : nullptr;
    if (get == nullptr) throw Failure("vpce: unknown row output " + what);
    check(get(handle(), data(out)));
  }

  /// Collective: class weights from this rank's V_local values (the loss's type), or none (every rank).
  void set_class_weights(const std::optional<In>& weights) {
    Checks c;
    if (weights) {
      check_array(c, "weights", *weights, loss_type());
      c.require(std::int64_t(weights->size()) == m_local, "weights has " + std::to_string(weights->size()) +
                                                              " values, expected V_local = " + std::to_string(m_local));
    }
    agree(c);
    nb::gil_scoped_release unlocked;
    check(vpce_set_class_weights(handle(), weights ? data(*weights) : nullptr));
  }

  double reduced_loss() const {
    double l = 0;
    check(vpce_reduced_loss(handle(), &l));
    return l;
  }

  std::tuple<std::int64_t, std::int64_t, std::int64_t> partition() const {
    std::int64_t begin = 0, local = 0, vocab = 0;
    check(vpce_partition(handle(), &begin, &local, &vocab));
    return {begin, local, vocab};
  }

  std::int64_t rows() const { return m_rows; }

  std::int64_t num_valid() const {
    std::int64_t n = 0;
    check(vpce_num_valid(handle(), &n));
    return n;
  }

 private:
  vpce_handle handle() const {
    if (m_handle == nullptr) throw Failure("vpce: this CrossEntropy is closed");
    return m_handle;
  }
  /// The C API's loss_and_grad on checked arguments (m_rows rows).
  void run_loss_and_grad(const In& logits, const In& targets, const Out& loss, const Out& grad, void* grad_loss,
                         double scale) const {
    if (m_probs)
      return check(vpce_loss_and_grad_probs(handle(), m_rows, data(logits), data(targets), data(loss), data(grad),
                                            grad_loss, scale));
    check(vpce_loss_and_grad(handle(), m_rows, data(logits), static_cast<const std::int64_t*>(data(targets)),
                             data(loss), data(grad), grad_loss, scale));
  }
  nb::dlpack::dtype loss_type() const { return dl_type(m_dtype == VPCE_FLOAT64 ? VPCE_FLOAT64 : VPCE_FLOAT32); }
  nb::dlpack::dtype grad_type() const { return m_grad_16 ? dl_type(m_dtype) : loss_type(); }

  template <class A>
  void check_array(Checks& c, const char* what, const A& a, nb::dlpack::dtype type) const {
    // Host memory (pinned too) for a host handle; a device's for a device handle (the one Kokkos runs on).
    const bool host = a.device_type() == nb::device::cpu::value || a.device_type() == nb::device::cuda_host::value;
    c.require(host != m_device,
              std::string(what) + (m_device ? " is in host memory (this CrossEntropy takes device arrays)"
                                            : " is not in host memory (this CrossEntropy takes host arrays)"));
    c.require(a.dtype() == type, std::string(what) + " is " + type_name(a.dtype()) + ", expected " + type_name(type));
    c.require(c_contiguous(a), std::string(what) + " of shape " + shape_of(a) + " is not C-contiguous");
  }
  /// logits [..., V_local]: returns N, the product of the leading extents.
  std::int64_t check_logits(Checks& c, const In& x) const {
    check_array(c, "logits", x, dl_type(m_dtype));
    c.require(x.ndim() >= 1 && std::int64_t(x.shape(x.ndim() - 1)) == m_local,
              "logits has shape " + shape_of(x) + ", expected [..., " + std::to_string(m_local) +
                  "] (this rank's vocabulary)");
    return x.ndim() >= 1 ? leading(x) : 0;
  }
  /// The product of all extents but the last.
  static std::int64_t leading(const In& x) {
    std::int64_t n = 1;
    for (std::size_t d = 0; d + 1 < x.ndim(); ++d) n *= std::int64_t(x.shape(d));
    return n;
  }
  /// An array of N values (any shape).
  template <class A>
  void check_rows(Checks& c, const char* what, const A& a, std::int64_t n, nb::dlpack::dtype type) const {
    check_array(c, what, a, type);
    c.require(std::int64_t(a.size()) == n,
              std::string(what) + " has " + std::to_string(a.size()) + " values, expected N = " + std::to_string(n));
  }
  /// Target ids (N int64 values), or with probability targets an array of the logits' type and shape.
  void check_targets(Checks& c, const In& t, std::int64_t n) const {
    if (!m_probs) return check_rows(c, "targets", t, n, dl_type(nb::dlpack::dtype_code::Int, 64));
    check_array(c, "target probabilities", t, dl_type(m_dtype));
    c.require(t.ndim() >= 1 && std::int64_t(t.shape(t.ndim() - 1)) == m_local && std::int64_t(t.size()) == n * m_local,
              "target probabilities have shape " + shape_of(t) + ", expected the logits' (N = " + std::to_string(n) +
                  " rows of " + std::to_string(m_local) + ")");
  }
  void check_grad(Checks& c, const Out& g, std::int64_t n) const {
    check_array(c, "grad", g, grad_type());
    c.require(g.ndim() >= 1 && std::int64_t(g.shape(g.ndim() - 1)) == m_local && std::int64_t(g.size()) == n * m_local,
              "grad has shape " + shape_of(g) + ", expected N x " + std::to_string(m_local) + " values, [..., " +
                  std::to_string(m_local) + "] (N = " + std::to_string(n) + ")");
  }
  void agree(const Checks& c) const {
    try {
      m_comm.agree_or_throw(c.error);
    } catch (const vpce::Error& e) {
      throw Failure(e.what());
    }
  }

  vpce::Communicator m_comm;
  vpce_dtype m_dtype;
  std::int64_t m_local;
  bool m_grad_16;
  bool m_device;
  bool m_probs;  // targets are probabilities, [..., V_local] in the logits' type
  vpce_handle m_handle = nullptr;
  std::int64_t m_rows = 0;
};

}  // namespace

NB_MODULE(_vpce, m) {
  m.doc() = "vpce's native part (the Python API is the vpce package)";
  // Registers the type (vpce.Error, a RuntimeError) and the translation of Failure into it.
  const nb::exception<Failure> error_type(m, "Error", PyExc_RuntimeError);
  // Handles alive at exit (e.g. in a module's global) are closed by the package's atexit hook, before Kokkos
  // is finalised; nanobind's report of them as leaks would be noise in every such program's output.
  nb::set_leak_warnings(false);

  m.def(
      "initialize", [] { check(vpce_initialize()); }, "Initialises Kokkos unless the program already did.");
  m.def(
      "finalize", [] { check(vpce_finalize()); }, "Finalises Kokkos if initialize() initialised it.");

  nb::class_<CrossEntropy>(m, "CrossEntropy")
      .def(
          "__init__",
          [](CrossEntropy* self, int comm_f, std::int64_t local_vocab, int dtype, int strategy, int mode,
             bool nan_is_error, std::int64_t ignore_index, int reduction, double label_smoothing, double z_loss,
             double logit_scale, double softcap, bool grad_in_logits_type, bool entropy, double entropy_weight,
             bool probability_targets, bool device) {
            vpce_options o;
            vpce_options_default(&o);
            o.strategy = strategy;
            o.mode = mode;
            o.nan_is_error = nan_is_error ? 1 : 0;
            o.ignore_index = ignore_index;
            o.reduction = reduction;
            o.label_smoothing = label_smoothing;
            o.z_loss = z_loss;
            o.logit_scale = logit_scale;
            o.softcap = softcap;
            o.grad_in_logits_type = grad_in_logits_type ? 1 : 0;
            o.entropy = entropy ? 1 : 0;
            o.entropy_weight = entropy_weight;
            o.probability_targets = probability_targets ? 1 : 0;
            o.memory_space = device ? VPCE_MEMORY_DEVICE : VPCE_MEMORY_HOST;
            nb::gil_scoped_release unlocked;  // collective: other Python threads may run meanwhile
            new (self) CrossEntropy(comm_f, local_vocab, dtype, o);
          },
          nb::arg("comm_f"), nb::arg("local_vocab"), nb::arg("dtype"), nb::arg("strategy"), nb::arg("mode"),
          nb::arg("nan_is_error"), nb::arg("ignore_index"), nb::arg("reduction"), nb::arg("label_smoothing"),
          nb::arg("z_loss"), nb::arg("logit_scale"), nb::arg("softcap"), nb::arg("grad_in_logits_type"),
          nb::arg("entropy"), nb::arg("entropy_weight"), nb::arg("probability_targets"), nb::arg("device"))
      .def("close", &CrossEntropy::close)
      .def("forward", &CrossEntropy::forward, nb::arg("logits"), nb::arg("targets"), nb::arg("loss"))
      .def("backward", &CrossEntropy::backward, nb::arg("grad_loss").none(), nb::arg("scale"), nb::arg("grad"))
      .def("loss_and_grad", &CrossEntropy::loss_and_grad, nb::arg("logits"), nb::arg("targets"), nb::arg("loss"),
           nb::arg("grad"), nb::arg("grad_loss").none(), nb::arg("scale"))
      .def("row_output", &CrossEntropy::row_output, nb::arg("what"), nb::arg("out"))
      .def("set_class_weights", &CrossEntropy::set_class_weights, nb::arg("weights").none())
      .def("time_loss_and_grad", &CrossEntropy::time_loss_and_grad, nb::arg("logits"), nb::arg("targets"),
           nb::arg("loss"), nb::arg("grad"), nb::arg("reps"))
      .def("reduced_loss", &CrossEntropy::reduced_loss)
      .def("partition", &CrossEntropy::partition)
      .def("rows", &CrossEntropy::rows)
      .def("num_valid", &CrossEntropy::num_valid);
  m.def(
      "has_device", [] { return vpce_has_device() != 0; }, "Whether this build has a device backend (CUDA, ...).");
}
