// Probes of the host kernels' inner loops for the vectorisation check (check_vectorized.py): each
// function below runs one of the real row kernels (kernels.hpp) on one row of a fixed width, a multiple of
// every vector length, so that every inner loop the compiler vectorises is whole vector iterations with no
// scalar remainder loop. An inner loop left scalar then shows as scalar floating-point arithmetic inside an
// innermost loop of the object code. Compiled only (never linked or run), with the kernels' own flags.
#include <cstdint>

#include "vpce/half.hpp"
#include "vpce/impl/kernels.hpp"

// With VPCE_PROBE_COPY=3, 4 or 5 (the checker's targets x86-64-v3-copy, x86-64-v4-copy, x86-64-v4-bf16-copy,
// compiled for no CPU in particular) each probe is compiled as the copy of the row loops for that level that
// such a build picks at run time (impl/isa.hpp, VPCE_HOST_CLONES): with the level's target and host policy.
#if defined(VPCE_PROBE_COPY)
#if !VPCE_HOST_CLONES
#error "VPCE_PROBE_COPY: this compiler and target make no run-time dispatched copies"
#endif
#if VPCE_PROBE_COPY == 3
#define VPCE_PROBE_LEVEL v3
#define VPCE_PROBE_TARGET target(VPCE_TARGET_V3),
#elif VPCE_PROBE_COPY == 4
#define VPCE_PROBE_LEVEL v4
#define VPCE_PROBE_TARGET target(VPCE_TARGET_V4),
#else
#define VPCE_PROBE_LEVEL v4bf16
#define VPCE_PROBE_TARGET target(VPCE_TARGET_V4_BF16),
#endif
#else
#define VPCE_PROBE_LEVEL build
#define VPCE_PROBE_TARGET
#endif

namespace {

using HostInner = vpce::impl::HostInner<vpce::impl::Isa::VPCE_PROBE_LEVEL>;
using vpce::impl::RowPtr;
using vpce::impl::Source;
using vpce::impl::Store;
using Tf = vpce::impl::Transform;
using vpce::impl::Write;
using Host = Kokkos::HostSpace;

constexpr std::int64_t width = 2 * vpce::impl::chunk_cols;  // two chunks of the one-pass statistics

// Settings the kernels branch on at run time, unknown to the compiler here (volatile), so that every branch's
// loops are compiled: with and without the entropy's sum, an entropy weight, class weights, target
// probabilities.
volatile bool g_entropy = true;
volatile float g_entropy_weight = 0.1f;
const void* volatile g_class_weights = nullptr;

template <class S, class T>
vpce::impl::KernelArgs<S, T, Host> args(const S* x, const std::int64_t* targets) {
  vpce::impl::KernelArgs<S, T, Host> a;
  a.x = x;
  a.ld_x = width;
  a.n = width;
  a.targets = Kokkos::View<const std::int64_t*, Host>(targets, 1);
  a.p.alpha = T(0.1);  // label smoothing on: the sum-of-logits loops are compiled too
  a.p.entropy = g_entropy;
  a.p.beta = T(g_entropy_weight);
  a.p.weights = static_cast<const T*>(g_class_weights);
  return a;
}

template <class T>
using Stats = vpce::impl::RowStats<T>;
/// One record with every value (the probabilities' sums and the entropy's h included): the kernels' loops
/// with and without them are all compiled (which one runs is decided at run time).
constexpr vpce::impl::RecordLayout full_layout{true, true};
static_assert(full_layout.width() * 1 == 7, "a RowStats is the full record");
template <class T>
vpce::impl::Records<T, Host> records(Stats<std::remove_const_t<T>>* r) {
  return {Kokkos::View<T*, Host>(reinterpret_cast<T*>(r), full_layout.width()), full_layout};
}
template <class T>
vpce::impl::Records<T, Host> records(const Stats<std::remove_const_t<T>>* r) {
  return {Kokkos::View<T*, Host>(reinterpret_cast<T*>(r), full_layout.width()), full_layout};
}
template <class T>
using ChunkMax = Kokkos::View<T**, Kokkos::LayoutRight, Host>;

// Statistics of one row: max and exp-and-sum loops, with the exps stored into y when y is set (G == T). With
// `Folded`, label smoothing's form that sums x in the exps' pass. The two forms LocalStats::row() picks from,
// each inlined: row() itself would also compile its out-of-line call of the folded form (LocalStats::row_folded,
// for a width known at run time), which is checked here inlined (and was 45% of this file's object code).
template <class S, class T, Tf Xf, bool Folded = false>
void stats(const S* x, const std::int64_t* targets, Stats<T>* out, T* y, T* chunk_max) {
  const vpce::impl::LocalStats<S, T, Host, Xf> f(args<S, T>(x, targets), records<T>(out), RowPtr<T>{y, width, 0},
                                                 ChunkMax<T>(chunk_max, 1, 2));
  f.template row_as<Folded>(HostInner{}, 0, vpce::impl::NoPace{});
}

// Loss and gradient (or stash) of one row, from the logits or from stored exps; with `Stream`, written
// through a buffer with streaming stores.
template <class S, class T, class G, Write What, Source From, Tf Xf, bool Stream = false>
void finalize(const S* x, const std::int64_t* targets, const Stats<T>* stats, T* loss, T* lse, G* y, const T* chunk_max,
              T* stash_target, const T* e) {
  const vpce::impl::Finalize<S, T, G, Host, What, From, Xf> f(
      args<S, T>(x, targets), records<const T>(stats),
      vpce::impl::LossOut<T, Host>{Kokkos::View<T*, Host>(loss, 1), Kokkos::View<T*, Host>(lse, 1)},
      RowPtr<G>{y, width, 0}, vpce::impl::GradScale<T, Host>{{}, T(1)}, Kokkos::View<T*, Host>(stash_target, 1),
      vpce::impl::StoredExps<T, Host>{{e, width, 0},
                                      Kokkos::View<const T**, Kokkos::LayoutRight, Host>(chunk_max, 1, 2)},
      Stream ? Store::streaming : Store::plain);
  f.row(HostInner{}, 0);
}

// The sums of a row's target probabilities q (width columns, like the logits).
template <class S, class T, Tf Xf>
void prob_sums(const S* x, const S* q, Stats<T>* out) {
  auto a = args<S, T>(x, nullptr);
  a.probs = true;
  a.q = q;
  a.ld_q = width;
  vpce::impl::row_probability_sums<Xf>(HostInner{}, a, 0, &out->t, &out->q, &out->wq);
}

// The seed strategy's two statistics passes.
template <class S, class T, Tf Xf>
void seed(const S* x, const std::int64_t* targets, T* out) {
  Kokkos::View<T**, Kokkos::LayoutLeft, Host> o(out, 1, 4);
  vpce::impl::LocalMax<S, T, Host, Xf>(args<S, T>(x, targets), o).row(HostInner{}, 0);
  vpce::impl::LocalSumGather<S, T, Host, Xf>(args<S, T>(x, targets), o).row(HostInner{}, 0);
}

// backward() from the stash.
template <class T, class G, bool Stream = false>
void from_stash(const T* q, const std::int64_t* targets, const T* stash_target, G* y) {
  const vpce::impl::BackwardFromStash<T, G, Host> f(
      args<T, T>(q, targets), Kokkos::View<const T*, Host>(stash_target, 1), RowPtr<G>{y, width, 0},
      vpce::impl::GradScale<T, Host>{{}, T(1)}, Stream ? Store::streaming : Store::plain);
  f.row(HostInner{}, 0);
}

}  // namespace

// flatten: the row kernels are inlined, so that the constant width reaches every inner loop.
#define VPCE_PROBE extern "C" __attribute__((VPCE_PROBE_TARGET noinline, used, flatten))

// One probe per (storage type, transform): S the logits' type, T the compute type, G the gradient's.
#define VPCE_PROBES(NAME, S, T, G)                                                                                     \
  VPCE_PROBE void vpce_probe_stats_##NAME(const S* x, const std::int64_t* t, Stats<T>* o, T* cm) {                     \
    stats<S, T, Tf::none>(x, t, o, nullptr, cm);                                                                       \
  }                                                                                                                    \
  VPCE_PROBE void vpce_probe_stats_scale_##NAME(const S* x, const std::int64_t* t, Stats<T>* o, T* cm) {               \
    stats<S, T, Tf::scale>(x, t, o, nullptr, cm);                                                                      \
  }                                                                                                                    \
  VPCE_PROBE void vpce_probe_stats_softcap_##NAME(const S* x, const std::int64_t* t, Stats<T>* o, T* cm) {             \
    stats<S, T, Tf::softcap>(x, t, o, nullptr, cm);                                                                    \
  }                                                                                                                    \
  VPCE_PROBE void vpce_probe_stats_folded_##NAME(const S* x, const std::int64_t* t, Stats<T>* o, T* cm) {              \
    stats<S, T, Tf::none, true>(x, t, o, nullptr, cm);                                                                 \
  }                                                                                                                    \
  VPCE_PROBE void vpce_probe_stats_folded_softcap_##NAME(const S* x, const std::int64_t* t, Stats<T>* o, T* cm) {      \
    stats<S, T, Tf::softcap, true>(x, t, o, nullptr, cm);                                                              \
  }                                                                                                                    \
  VPCE_PROBE void vpce_probe_grad_##NAME(const S* x, const std::int64_t* t, const Stats<T>* s, T* l, T* e, G* y,       \
                                         const T* cm, T* st) {                                                         \
    finalize<S, T, G, Write::grad, Source::logits, Tf::none>(x, t, s, l, e, y, cm, st, nullptr);                       \
  }                                                                                                                    \
  VPCE_PROBE void vpce_probe_grad_scale_##NAME(const S* x, const std::int64_t* t, const Stats<T>* s, T* l, T* e, G* y, \
                                               const T* cm, T* st) {                                                   \
    finalize<S, T, G, Write::grad, Source::logits, Tf::scale>(x, t, s, l, e, y, cm, st, nullptr);                      \
  }                                                                                                                    \
  VPCE_PROBE void vpce_probe_grad_softcap_##NAME(const S* x, const std::int64_t* t, const Stats<T>* s, T* l, T* e,     \
                                                 G* y, const T* cm, T* st) {                                           \
    finalize<S, T, G, Write::grad, Source::logits, Tf::softcap>(x, t, s, l, e, y, cm, st, nullptr);                    \
  }                                                                                                                    \
  VPCE_PROBE void vpce_probe_prob_sums_##NAME(const S* x, const S* q, Stats<T>* o) {                                   \
    prob_sums<S, T, Tf::none>(x, q, o);                                                                                \
  }                                                                                                                    \
  VPCE_PROBE void vpce_probe_seed_##NAME(const S* x, const std::int64_t* t, T* o) { seed<S, T, Tf::none>(x, t, o); }   \
  VPCE_PROBE void vpce_probe_seed_softcap_##NAME(const S* x, const std::int64_t* t, T* o) {                            \
    seed<S, T, Tf::softcap>(x, t, o);                                                                                  \
  }                                                                                                                    \
  VPCE_PROBE void vpce_probe_from_stash_##NAME(const T* q, const std::int64_t* t, const T* st, G* y) {                 \
    from_stash<T, G>(q, t, st, y);                                                                                     \
  }                                                                                                                    \
  VPCE_PROBE void vpce_probe_from_stash_stream_##NAME(const T* q, const std::int64_t* t, const T* st, G* y) {          \
    from_stash<T, G, true>(q, t, st, y);                                                                               \
  }                                                                                                                    \
  VPCE_PROBE void vpce_probe_grad_stream_##NAME(const S* x, const std::int64_t* t, const Stats<T>* s, T* l, T* e,      \
                                                G* y, const T* cm, T* st) {                                            \
    finalize<S, T, G, Write::grad, Source::logits, Tf::none, true>(x, t, s, l, e, y, cm, st, nullptr);                 \
  }                                                                                                                    \
  VPCE_PROBE void vpce_probe_grad_stored_stream_##NAME(const S* x, const std::int64_t* t, const Stats<T>* s, T* l,     \
                                                       T* e, G* y, const T* cm, T* st, const T* ex) {                  \
    finalize<S, T, G, Write::grad, Source::stored_exp, Tf::none, true>(x, t, s, l, e, y, cm, st, ex);                  \
  }

// The fused strategy's stored exps (statistics storing them in a scratch of T, finalize rescaling them) for
// every storage type, and the stash (full precision only). Where S is T, the statistics' probe also compiles
// the loops that store the exps over the logits (in place): y == x is decided at run time.
#define VPCE_PROBES_STORED(NAME, S, T, G)                                                                             \
  VPCE_PROBE void vpce_probe_stats_store_##NAME(const S* x, const std::int64_t* t, Stats<T>* o, T* y, T* cm) {        \
    stats<S, T, Tf::none>(x, t, o, y, cm);                                                                            \
  }                                                                                                                   \
  VPCE_PROBE void vpce_probe_stats_folded_store_##NAME(const S* x, const std::int64_t* t, Stats<T>* o, T* y, T* cm) { \
    stats<S, T, Tf::none, true>(x, t, o, y, cm);                                                                      \
  }                                                                                                                   \
  VPCE_PROBE void vpce_probe_grad_stored_##NAME(const S* x, const std::int64_t* t, const Stats<T>* s, T* l, T* e,     \
                                                G* y, const T* cm, T* st, const T* ex) {                              \
    finalize<S, T, G, Write::grad, Source::stored_exp, Tf::none>(x, t, s, l, e, y, cm, st, ex);                       \
  }
#define VPCE_PROBES_STASH(NAME, T)                                                                                \
  VPCE_PROBE void vpce_probe_stash_##NAME(const T* x, const std::int64_t* t, const Stats<T>* s, T* l, T* e, T* y, \
                                          const T* cm, T* st) {                                                   \
    finalize<T, T, T, Write::stash, Source::logits, Tf::none>(x, t, s, l, e, y, cm, st, nullptr);                 \
  }

VPCE_PROBES(f32, float, float, float)
VPCE_PROBES(f64, double, double, double)
VPCE_PROBES(bf16, vpce::bfloat16, float, vpce::bfloat16)
VPCE_PROBES(f16, vpce::float16, float, vpce::float16)
VPCE_PROBES_STORED(f32, float, float, float)
VPCE_PROBES_STORED(f64, double, double, double)
VPCE_PROBES_STORED(bf16, vpce::bfloat16, float, vpce::bfloat16)
VPCE_PROBES_STORED(f16, vpce::float16, float, vpce::float16)
VPCE_PROBES_STASH(f32, float)
VPCE_PROBES_STASH(f64, double)

// The checker's own control: a loop-carried recurrence no compiler can vectorise. check_vectorized.py must
// find it scalar, or its reading of the object code is broken.
VPCE_PROBE float vpce_control_scalar(const float* x, std::int64_t n) {
  float h = 0;
  for (std::int64_t j = 0; j < n; ++j) h = h * x[j] + 1.0f;
  return h;
}
