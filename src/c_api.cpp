// The C API: a handle holds a CrossEntropy on the host execution space, or (VPCE_MEMORY_DEVICE) on the default
// one, over unmanaged Views of the caller's pointers.
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>

#include "vpce/definitions.hpp"  // CrossEntropy on the host space: not the default one in a device build
#include "vpce/dtype.hpp"
#include "vpce/vpce.h"
#include "vpce/vpce.hpp"

namespace {

thread_local std::string g_last_error;
bool g_we_initialized_kokkos = false;

using Host = Kokkos::DefaultHostExecutionSpace;
using Device = Kokkos::DefaultExecutionSpace;
using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
/// A device backend (CUDA, HIP, SYCL, ...): the default space's memory is not the host's. Without one no
/// handle is built on Device (agreed_options rejects VPCE_MEMORY_DEVICE), so nothing is instantiated twice.
constexpr bool kHaveDevice = !std::is_same_v<Device::memory_space, Kokkos::HostSpace>;

/// f(type_tag<the execution space a handle of these options runs on>).
template <class F>
void with_space(const vpce_options* o, const F& f) {
  if constexpr (kHaveDevice) {
    if (o && o->memory_space == VPCE_MEMORY_DEVICE) return f(vpce::type_tag<Device>{});
  }
  f(vpce::type_tag<Host>{});
}

struct HandleBase {
  virtual ~HandleBase() = default;
  /// With `probs` set (the target probabilities, N x V_local in the logits' type), `targets` is not used.
  virtual void forward(std::int64_t n, const void* logits, const std::int64_t* targets, const void* probs,
                       void* loss) = 0;
  virtual void backward(const void* grad_loss, double scale, void* grad) = 0;
  virtual void loss_and_grad(std::int64_t n, const void* logits, const std::int64_t* targets, const void* probs,
                             void* loss, void* grad, const void* grad_loss, double scale) = 0;
  virtual void lse(void* out) const = 0;
  /// set_class_weights() from this rank's V_local values; NULL: clear_class_weights().
  virtual void class_weights(const void* local) = 0;
  /// entropy(), logprob() or z_loss_terms() of the last call into out.
  virtual void row_output(vpce::impl::RowOutput what, void* out) const = 0;
  virtual double reduced_loss() const = 0;
  virtual std::int64_t num_valid() const = 0;
  virtual const vpce::VocabPartition& partition() const = 0;
};

template <class S, class Exec>
struct Handle final : HandleBase {
  using CE = vpce::CrossEntropy<S, Exec>;
  using T = typename CE::compute_type;
  using MS = typename CE::memory_space;  // the caller's pointers'
  Handle(const vpce::Communicator& comm, std::int64_t local_vocab, const vpce::Options& opt, bool grad_16)
      : part(vpce::VocabPartition::from_local_size(local_vocab, comm)), ce(comm, part, opt), grad_16bit(grad_16) {}

  // A NULL pointer becomes an empty View: the library's collective shape checks then fail on every rank
  // alike (a local check here could leave the other ranks waiting in the collective).
  static std::size_t rows(std::int64_t n, const void* p) { return p ? std::size_t(n < 0 ? 0 : n) : 0; }
  Kokkos::View<const S**, Kokkos::LayoutRight, MS, Unmanaged> logits_view(std::int64_t n, const void* p) const {
    using V = Kokkos::View<const S**, Kokkos::LayoutRight, MS, Unmanaged>;
    return V(static_cast<const S*>(p), rows(n, p), p ? std::size_t(part.local_size()) : 0);
  }
  template <class G>
  Kokkos::View<G**, Kokkos::LayoutRight, MS, Unmanaged> grad_view(std::int64_t n, void* p) const {
    using V = Kokkos::View<G**, Kokkos::LayoutRight, MS, Unmanaged>;
    return V(static_cast<G*>(p), rows(n, p), p ? std::size_t(part.local_size()) : 0);
  }
  Kokkos::View<const T*, MS, Unmanaged> grad_loss_view(std::int64_t n, const void* p) const {
    return Kokkos::View<const T*, MS, Unmanaged>(static_cast<const T*>(p), rows(n, p));
  }

  /// f(the targets as the library takes them): the ids' View, or the probabilities' matrix.
  template <class F>
  void with_targets(std::int64_t n, const std::int64_t* targets, const void* probs, const F& f) const {
    if (probs != nullptr) return f(logits_view(n, probs));
    f(Kokkos::View<const std::int64_t*, MS, Unmanaged>(targets, rows(n, targets)));
  }
  void forward(std::int64_t n, const void* logits, const std::int64_t* targets, const void* probs,
               void* loss) override {
    with_targets(n, targets, probs, [&](const auto& t) {
      ce.forward(logits_view(n, logits), t, Kokkos::View<T*, MS, Unmanaged>(static_cast<T*>(loss), rows(n, loss)));
    });
    n_rows = n;
  }
  void backward(const void* grad_loss, double scale, void* grad) override {
    if constexpr (vpce::is_16bit_v<S>) {
      if (grad_16bit) {
        if (grad_loss)
          ce.backward(grad_loss_view(n_rows, grad_loss), grad_view<S>(n_rows, grad));
        else
          ce.backward(T(scale), grad_view<S>(n_rows, grad));
        return;
      }
    }
    if (grad_loss)
      ce.backward(grad_loss_view(n_rows, grad_loss), grad_view<T>(n_rows, grad));
    else
      ce.backward(T(scale), grad_view<T>(n_rows, grad));
  }
  void loss_and_grad(std::int64_t n, const void* logits, const std::int64_t* targets, const void* probs, void* loss,
                     void* grad, const void* grad_loss, double scale) override {
    const auto x = logits_view(n, logits);
    const Kokkos::View<T*, MS, Unmanaged> l(static_cast<T*>(loss), rows(n, loss));
    n_rows = n;
    with_targets(n, targets, probs, [&](const auto& t) {
      if constexpr (vpce::is_16bit_v<S>) {
        if (grad_16bit) {
          if (grad_loss)
            ce.loss_and_grad(x, t, l, grad_view<S>(n, grad), grad_loss_view(n, grad_loss));
          else
            ce.loss_and_grad(x, t, l, grad_view<S>(n, grad), T(scale));
          return;
        }
      }
      if (grad_loss)
        ce.loss_and_grad(x, t, l, grad_view<T>(n, grad), grad_loss_view(n, grad_loss));
      else
        ce.loss_and_grad(x, t, l, grad_view<T>(n, grad), T(scale));
    });
  }
  void lse(void* out) const override { copy_out(ce.lse(), out); }
  void class_weights(const void* local) override {
    if (local == nullptr) return ce.clear_class_weights();
    ce.set_class_weights(Kokkos::View<const T*, MS, Unmanaged>(static_cast<const T*>(local), part.local_size()));
  }
  void row_output(vpce::impl::RowOutput what, void* out) const override {
    switch (what) {
      case vpce::impl::RowOutput::entropy:
        return copy_out(ce.entropy(), out);
      case vpce::impl::RowOutput::logprob:
        return copy_out(ce.logprob(), out);
      case vpce::impl::RowOutput::z_loss:
        return copy_out(ce.z_loss_terms(), out);
    }
  }
  template <class V>
  static void copy_out(const V& v, void* out) {
    VPCE_THROW_IF(out == nullptr && v.extent(0) > 0, "the output array is NULL");
    Kokkos::deep_copy(Kokkos::View<T*, MS, Unmanaged>(static_cast<T*>(out), v.extent(0)), v);
  }
  double reduced_loss() const override { return ce.reduced_loss(); }
  std::int64_t num_valid() const override { return ce.num_valid(); }
  const vpce::VocabPartition& partition() const override { return part; }

  vpce::VocabPartition part;
  CE ce;
  bool grad_16bit;
  std::int64_t n_rows = 0;
};

/// The fused LM head's handle: a LinearCrossEntropy on the host or the default execution space (with Kokkos
/// Kernels).
struct LinearBase {
  virtual ~LinearBase() = default;
  /// grad: also the gradients (loss_and_grad); else the loss only (forward).
  virtual void run(std::int64_t rows, std::int64_t n, const void* hidden, const void* weight, const void* bias,
                   const std::int64_t* targets, void* loss, bool grad, void* grad_hidden, void* grad_weight,
                   void* grad_bias, const void* grad_loss, double scale, bool accumulate) = 0;
  virtual void backward(const void* grad_loss, double scale, void* grad_hidden, void* grad_weight, void* grad_bias,
                        bool accumulate) = 0;
  virtual double reduced_loss() const = 0;
};

#if defined(VPCE_HAVE_KOKKOSKERNELS)
template <class S, class Exec>
struct Linear final : LinearBase {
  using LCE = vpce::LinearCrossEntropy<S, Exec>;
  using T = typename LCE::compute_type;
  using MS = typename LCE::memory_space;  // the caller's pointers'
  template <class E>
  using Mat = Kokkos::View<E**, Kokkos::LayoutRight, MS, Unmanaged>;
  template <class E>
  using Vec = Kokkos::View<E*, MS, Unmanaged>;
  Linear(const vpce::Communicator& comm, std::int64_t local_vocab, std::int64_t hidden, const vpce::Options& opt,
         const vpce::LinearOptions& lin)
      : part(vpce::VocabPartition::from_local_size(local_vocab, comm)), lce(comm, part, hidden, opt, lin) {}

  // NULL pointers become empty Views (the library's collective shape checks then fail on every rank alike);
  // a NULL bias is no bias.
  static std::size_t count(std::int64_t n, const void* p) { return p ? std::size_t(n < 0 ? 0 : n) : 0; }
  template <class E, class P>
  Mat<E> mat(std::int64_t rows, P* p) const {
    return Mat<E>(static_cast<E*>(p), count(rows, p), p ? std::size_t(lce.hidden_size()) : 0);
  }
  template <class E, class P>
  static Vec<E> vec(std::int64_t n, P* p) {
    return Vec<E>(static_cast<E*>(p), count(n, p));
  }

  void run(std::int64_t rows, std::int64_t n, const void* hidden, const void* weight, const void* bias,
           const std::int64_t* targets, void* loss, bool grad, void* grad_hidden, void* grad_weight, void* grad_bias,
           const void* grad_loss, double scale, bool accumulate) override {
    const std::int64_t v = part.local_size();
    const auto h = mat<const S>(rows, hidden);
    const auto w = mat<const S>(v, weight);
    const auto b = vec<const S>(v, bias);
    const auto t = vec<const std::int64_t>(n, targets);
    const auto l = vec<T>(n, loss);
    n_rows = rows;
    if (!grad) return lce.forward(h, w, b, t, l);
    const auto gh = mat<T>(rows, grad_hidden);
    const auto gw = mat<T>(v, grad_weight);
    const auto gb = vec<T>(v, grad_bias);
    if (grad_loss != nullptr)
      lce.loss_and_grad(h, w, b, t, l, gh, gw, gb, vec<const T>(n, grad_loss), accumulate);
    else
      lce.loss_and_grad(h, w, b, t, l, gh, gw, gb, T(scale), accumulate);
  }
  void backward(const void* grad_loss, double scale, void* grad_hidden, void* grad_weight, void* grad_bias,
                bool accumulate) override {
    const std::int64_t v = part.local_size();
    const auto gh = mat<T>(n_rows, grad_hidden);
    const auto gw = mat<T>(v, grad_weight);
    const auto gb = vec<T>(v, grad_bias);
    if (grad_loss != nullptr)
      lce.backward(vec<const T>(lce.lse().extent(0), grad_loss), gh, gw, gb, accumulate);
    else
      lce.backward(T(scale), gh, gw, gb, accumulate);
  }
  double reduced_loss() const override { return lce.reduced_loss(); }

  vpce::VocabPartition part;
  LCE lce;
  std::int64_t n_rows = 0;
};
#endif

template <class F>
vpce_status guarded(F&& f) {
  try {
    f();
    g_last_error.clear();
    return VPCE_SUCCESS;
  } catch (const vpce::Error& e) {
    g_last_error = e.what();
    return VPCE_ERROR_INPUT;
  } catch (const std::exception& e) {
    g_last_error = std::string("vpce: ") + e.what();
    return VPCE_ERROR_INTERNAL;
  }
}

vpce::Options to_options(const vpce_options* o) {
  vpce_options d;
  vpce_options_default(&d);
  if (!o) o = &d;
  VPCE_THROW_IF(o->strategy < 0 || o->strategy > 1, "options.strategy must be VPCE_STRATEGY_FUSED or _SEED");
  VPCE_THROW_IF(o->mode < 0 || o->mode > 1, "options.mode must be VPCE_MODE_RECOMPUTE or _STASH_SOFTMAX");
  VPCE_THROW_IF(o->reduction < 0 || o->reduction > 2, "options.reduction must be VPCE_REDUCTION_NONE, _SUM or _MEAN");
  VPCE_THROW_IF(o->memory_space < 0 || o->memory_space > 1, "options.memory_space must be VPCE_MEMORY_HOST or _DEVICE");
  VPCE_THROW_IF(o->memory_space == VPCE_MEMORY_DEVICE && !kHaveDevice,
                std::string("options.memory_space is VPCE_MEMORY_DEVICE, but this build of vpce has no device backend "
                            "(Kokkos::DefaultExecutionSpace is ") +
                    Device::name() + ")");
  vpce::Options opt;
  opt.strategy = o->strategy == VPCE_STRATEGY_SEED ? vpce::Strategy::seed : vpce::Strategy::fused;
  opt.mode = o->mode == VPCE_MODE_STASH_SOFTMAX ? vpce::Mode::stash_softmax : vpce::Mode::recompute;
  opt.non_finite = o->nan_is_error ? vpce::NonFinite::error : vpce::NonFinite::propagate;
  opt.ignore_index = o->ignore_index;
  opt.reduction = static_cast<vpce::Reduction>(o->reduction);
  opt.label_smoothing = o->label_smoothing;
  opt.z_loss = o->z_loss;
  opt.logit_scale = o->logit_scale;
  opt.softcap = o->softcap;
  opt.entropy = o->entropy != 0;
  opt.entropy_weight = o->entropy_weight;
  opt.probability_targets = o->probability_targets != 0;
  return opt;
}

/// The options and dtype of a create call, checked on every rank: argument errors must fail on every rank
/// alike, so they are agreed on before anything collective.
vpce::Options agreed_options(const vpce::Communicator& c, const vpce_options* options, vpce_dtype dtype) {
  std::string err;
  vpce::Options opt;
  try {
    opt = to_options(options);
    VPCE_THROW_IF(dtype < VPCE_FLOAT32 || dtype > VPCE_FLOAT16, "unknown dtype " + std::to_string(int(dtype)));
  } catch (const vpce::Error& e) {
    err = e.message();
  }
  c.agree_or_throw(err, {{"the dtype", std::int64_t(dtype)}});
  return opt;
}

// vpce_dtype's values are vpce::DType's: a checked vpce_dtype converts with a cast.
static_assert(int(vpce::DType::float32) == VPCE_FLOAT32 && int(vpce::DType::float64) == VPCE_FLOAT64 &&
              int(vpce::DType::bfloat16) == VPCE_BFLOAT16 && int(vpce::DType::float16) == VPCE_FLOAT16);

}  // namespace

struct vpce_handle_s {
  std::unique_ptr<HandleBase> impl;
};

struct vpce_linear_s {
  std::unique_ptr<LinearBase> impl;
};

extern "C" {

void vpce_options_default(vpce_options* o) {
  if (!o) return;
  const vpce::Options d;
  o->strategy = VPCE_STRATEGY_FUSED;
  o->mode = VPCE_MODE_RECOMPUTE;
  o->nan_is_error = 1;
  o->ignore_index = d.ignore_index;
  o->reduction = VPCE_REDUCTION_NONE;
  o->label_smoothing = d.label_smoothing;
  o->z_loss = d.z_loss;
  o->logit_scale = d.logit_scale;
  o->softcap = d.softcap;
  o->grad_in_logits_type = 0;
  o->entropy = d.entropy ? 1 : 0;
  o->entropy_weight = d.entropy_weight;
  o->probability_targets = 0;
  o->memory_space = VPCE_MEMORY_HOST;
}

vpce_status vpce_initialize(void) {
  return guarded([&] {
    if (Kokkos::is_initialized()) return;
#if defined(KOKKOS_ENABLE_OPENMP)
    // Kokkos 3.4's OpenMP backend prints four lines of advice per rank when OMP_PROC_BIND is unset. With
    // neither it nor OMP_PLACES set the OpenMP runtime binds no thread: say so, and nothing is printed. A value
    // the user set is never replaced (and only the job's environment can bind: the runtime has read it).
    if (std::getenv("OMP_PROC_BIND") == nullptr && std::getenv("OMP_PLACES") == nullptr)
      setenv("OMP_PROC_BIND", "false", 0);  // NOLINT(concurrency-mt-unsafe): before any thread of ours runs
#endif
    Kokkos::initialize();
    g_we_initialized_kokkos = true;
  });
}

vpce_status vpce_finalize(void) {
  return guarded([&] {
    if (!g_we_initialized_kokkos) return;
    Kokkos::finalize();
    g_we_initialized_kokkos = false;
  });
}

int vpce_has_device(void) { return kHaveDevice ? 1 : 0; }

vpce_status vpce_create(MPI_Comm comm, int64_t local_vocab, vpce_dtype dtype, const vpce_options* options,
                        vpce_handle* handle) {
  return guarded([&] {
    VPCE_THROW_IF(handle == nullptr, "handle is NULL");
    *handle = nullptr;
    VPCE_THROW_IF(!Kokkos::is_initialized(), "Kokkos is not initialised: call vpce_initialize() first");
    const vpce::Communicator c(comm);
    const vpce::Options opt = agreed_options(c, options, dtype);
    const bool g16 = options && options->grad_in_logits_type;
    auto h = std::make_unique<vpce_handle_s>();
    vpce::dispatch(static_cast<vpce::DType>(dtype), [&](auto tag) {
      with_space(options, [&](auto space) {
        using H = Handle<typename decltype(tag)::type, typename decltype(space)::type>;
        h->impl = std::make_unique<H>(c, local_vocab, opt, g16);
      });
    });
    *handle = h.release();
  });
}

vpce_status vpce_create_f(MPI_Fint comm, int64_t local_vocab, int dtype, const vpce_options* options,
                          vpce_handle* handle) {
  return vpce_create(MPI_Comm_f2c(comm), local_vocab, static_cast<vpce_dtype>(dtype), options, handle);
}

vpce_status vpce_destroy(vpce_handle handle) {
  return guarded([&] { delete handle; });
}

#define VPCE_CHECK_HANDLE(h) VPCE_THROW_IF((h) == nullptr || !(h)->impl, "the handle is NULL or destroyed")

vpce_status vpce_partition(vpce_handle h, int64_t* begin, int64_t* local_vocab, int64_t* vocab) {
  return guarded([&] {
    VPCE_CHECK_HANDLE(h);
    const auto& p = h->impl->partition();
    if (begin) *begin = p.begin();
    if (local_vocab) *local_vocab = p.local_size();
    if (vocab) *vocab = p.vocab_size();
  });
}

vpce_status vpce_forward(vpce_handle h, int64_t n, const void* logits, const int64_t* targets, void* loss) {
  return guarded([&] {
    VPCE_CHECK_HANDLE(h);
    h->impl->forward(n, logits, targets, nullptr, loss);
  });
}

vpce_status vpce_forward_probs(vpce_handle h, int64_t n, const void* logits, const void* target_probs, void* loss) {
  return guarded([&] {
    VPCE_CHECK_HANDLE(h);
    VPCE_THROW_IF(target_probs == nullptr && n > 0, "target_probs is NULL");
    h->impl->forward(n, logits, nullptr, target_probs, loss);
  });
}

vpce_status vpce_backward(vpce_handle h, const void* grad_loss, double grad_scale, void* grad) {
  return guarded([&] {
    VPCE_CHECK_HANDLE(h);
    h->impl->backward(grad_loss, grad_scale, grad);
  });
}

vpce_status vpce_loss_and_grad(vpce_handle h, int64_t n, const void* logits, const int64_t* targets, void* loss,
                               void* grad, const void* grad_loss, double grad_scale) {
  return guarded([&] {
    VPCE_CHECK_HANDLE(h);
    h->impl->loss_and_grad(n, logits, targets, nullptr, loss, grad, grad_loss, grad_scale);
  });
}

vpce_status vpce_loss_and_grad_probs(vpce_handle h, int64_t n, const void* logits, const void* target_probs, void* loss,
                                     void* grad, const void* grad_loss, double grad_scale) {
  return guarded([&] {
    VPCE_CHECK_HANDLE(h);
    VPCE_THROW_IF(target_probs == nullptr && n > 0, "target_probs is NULL");
    h->impl->loss_and_grad(n, logits, nullptr, target_probs, loss, grad, grad_loss, grad_scale);
  });
}

vpce_status vpce_lse(vpce_handle h, void* lse) {
  return guarded([&] {
    VPCE_CHECK_HANDLE(h);
    h->impl->lse(lse);
  });
}

vpce_status vpce_set_class_weights(vpce_handle h, const void* local_weights) {
  return guarded([&] {
    VPCE_CHECK_HANDLE(h);
    h->impl->class_weights(local_weights);
  });
}

vpce_status vpce_entropy(vpce_handle h, void* entropy) {
  return guarded([&] {
    VPCE_CHECK_HANDLE(h);
    h->impl->row_output(vpce::impl::RowOutput::entropy, entropy);
  });
}

vpce_status vpce_logprob(vpce_handle h, void* logprob) {
  return guarded([&] {
    VPCE_CHECK_HANDLE(h);
    h->impl->row_output(vpce::impl::RowOutput::logprob, logprob);
  });
}

vpce_status vpce_z_loss_terms(vpce_handle h, void* z_loss) {
  return guarded([&] {
    VPCE_CHECK_HANDLE(h);
    h->impl->row_output(vpce::impl::RowOutput::z_loss, z_loss);
  });
}

vpce_status vpce_num_valid(vpce_handle h, int64_t* num_valid) {
  return guarded([&] {
    VPCE_CHECK_HANDLE(h);
    VPCE_THROW_IF(num_valid == nullptr, "num_valid is NULL");
    *num_valid = h->impl->num_valid();
  });
}

vpce_status vpce_reduced_loss(vpce_handle h, double* loss) {
  return guarded([&] {
    VPCE_CHECK_HANDLE(h);
    VPCE_THROW_IF(loss == nullptr, "loss is NULL");
    *loss = h->impl->reduced_loss();
  });
}

vpce_status vpce_linear_create(MPI_Comm comm, int64_t local_vocab, int64_t hidden_size, vpce_dtype dtype,
                               const vpce_options* options, int64_t chunk_rows, int sequence_parallel,
                               vpce_linear* head) {
  return guarded([&] {
    VPCE_THROW_IF(head == nullptr, "head is NULL");
    *head = nullptr;
    VPCE_THROW_IF(!Kokkos::is_initialized(), "Kokkos is not initialised: call vpce_initialize() first");
#if defined(VPCE_HAVE_KOKKOSKERNELS)
    const vpce::Communicator c(comm);
    const vpce::Options opt = agreed_options(c, options, dtype);
    vpce::LinearOptions lin;
    lin.chunk_rows = chunk_rows;
    lin.sequence_parallel = sequence_parallel != 0;
    auto h = std::make_unique<vpce_linear_s>();
    vpce::dispatch(static_cast<vpce::DType>(dtype), [&](auto tag) {
      with_space(options, [&](auto space) {
        using L = Linear<typename decltype(tag)::type, typename decltype(space)::type>;
        h->impl = std::make_unique<L>(c, local_vocab, hidden_size, opt, lin);
      });
    });
    *head = h.release();
#else
    (void)comm, (void)local_vocab, (void)hidden_size, (void)dtype, (void)options, (void)chunk_rows,
        (void)sequence_parallel;
    throw vpce::Error("vpce_linear_create: this build of vpce has no Kokkos Kernels (the fused LM head needs it)");
#endif
  });
}

vpce_status vpce_linear_create_f(MPI_Fint comm, int64_t local_vocab, int64_t hidden_size, int dtype,
                                 const vpce_options* options, int64_t chunk_rows, int sequence_parallel,
                                 vpce_linear* head) {
  return vpce_linear_create(MPI_Comm_f2c(comm), local_vocab, hidden_size, static_cast<vpce_dtype>(dtype), options,
                            chunk_rows, sequence_parallel, head);
}

vpce_status vpce_linear_destroy(vpce_linear head) {
  return guarded([&] { delete head; });
}

#define VPCE_CHECK_HEAD(h) VPCE_THROW_IF((h) == nullptr || !(h)->impl, "the LM head handle is NULL or destroyed")

vpce_status vpce_linear_forward(vpce_linear head, int64_t n_rows, int64_t n_tokens, const void* hidden,
                                const void* weight, const void* bias, const int64_t* targets, void* loss) {
  return guarded([&] {
    VPCE_CHECK_HEAD(head);
    head->impl->run(n_rows, n_tokens, hidden, weight, bias, targets, loss, false, nullptr, nullptr, nullptr, nullptr,
                    1.0, false);
  });
}

vpce_status vpce_linear_backward(vpce_linear head, const void* grad_loss, double grad_scale, void* grad_hidden,
                                 void* grad_weight, void* grad_bias, int accumulate) {
  return guarded([&] {
    VPCE_CHECK_HEAD(head);
    head->impl->backward(grad_loss, grad_scale, grad_hidden, grad_weight, grad_bias, accumulate != 0);
  });
}

vpce_status vpce_linear_loss_and_grad(vpce_linear head, int64_t n_rows, int64_t n_tokens, const void* hidden,
                                      const void* weight, const void* bias, const int64_t* targets, void* loss,
                                      void* grad_hidden, void* grad_weight, void* grad_bias, const void* grad_loss,
                                      double grad_scale, int accumulate) {
  return guarded([&] {
    VPCE_CHECK_HEAD(head);
    head->impl->run(n_rows, n_tokens, hidden, weight, bias, targets, loss, true, grad_hidden, grad_weight, grad_bias,
                    grad_loss, grad_scale, accumulate != 0);
  });
}

vpce_status vpce_linear_reduced_loss(vpce_linear head, double* loss) {
  return guarded([&] {
    VPCE_CHECK_HEAD(head);
    VPCE_THROW_IF(loss == nullptr, "loss is NULL");
    *loss = head->impl->reduced_loss();
  });
}

const char* vpce_last_error(void) { return g_last_error.c_str(); }

}  // extern "C"
