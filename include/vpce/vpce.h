/* vpce C API: vocab-parallel cross entropy from C and (through ISO_C_BINDING, see vpce.f90) Fortran.
 *
 * Array arguments are host pointers, or with options.memory_space = VPCE_MEMORY_DEVICE pointers to the
 * memory of Kokkos' default execution space (e.g. CUDA device memory: the handle then runs there, with no
 * copy through the host; inputs must be ready when a call starts, e.g. after the caller's own asynchronous
 * work on them has been waited for, and outputs are complete when it returns); scalars returned through a
 * pointer (vpce_partition, vpce_num_valid, the reduced losses) are always on the host. Arrays are row-major
 * (C order): logits N x V_local, the gradient the same, targets/loss/grad_loss/lse N. The loss, lse and
 * grad_loss are double for VPCE_FLOAT64 logits and float otherwise. The gradient is float (double for
 * VPCE_FLOAT64) or, with options.grad_in_logits_type set and 16-bit logits, in the logits' own 16-bit type.
 *
 * Every call returns a vpce_status; on failure vpce_last_error() gives the message (per thread). Calls
 * marked "collective" must be made by every rank of the communicator; they fail on every rank alike. */
#ifndef VPCE_VPCE_H
#define VPCE_VPCE_H

#include <mpi.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { VPCE_SUCCESS = 0, VPCE_ERROR_INPUT = 1, VPCE_ERROR_INTERNAL = 2 } vpce_status;
typedef enum { VPCE_FLOAT32 = 0, VPCE_FLOAT64 = 1, VPCE_BFLOAT16 = 2, VPCE_FLOAT16 = 3 } vpce_dtype;
typedef enum { VPCE_STRATEGY_FUSED = 0, VPCE_STRATEGY_SEED = 1 } vpce_strategy;
typedef enum { VPCE_MODE_RECOMPUTE = 0, VPCE_MODE_STASH_SOFTMAX = 1 } vpce_mode;
typedef enum { VPCE_REDUCTION_NONE = 0, VPCE_REDUCTION_SUM = 1, VPCE_REDUCTION_MEAN = 2 } vpce_reduction;
typedef enum { VPCE_MEMORY_HOST = 0, VPCE_MEMORY_DEVICE = 1 } vpce_memory_space;

/* vpce::Options; fill with vpce_options_default() first. */
typedef struct {
  int strategy;            /* vpce_strategy */
  int mode;                /* vpce_mode */
  int nan_is_error;        /* 1: NaN/+inf logits are an error (default); 0: they propagate */
  int64_t ignore_index;    /* default -100 */
  int reduction;           /* vpce_reduction */
  double label_smoothing;  /* [0, 1] */
  double z_loss;           /* >= 0 */
  double logit_scale;      /* > 0, default 1 */
  double softcap;          /* >= 0, 0: off */
  int grad_in_logits_type; /* 16-bit logits only: write the gradient as 16-bit */
  int entropy;             /* 1: keep each row's entropy for vpce_entropy() (default 0) */
  double entropy_weight;   /* adds entropy_weight * entropy to each row's loss (finite; may be < 0) */
  int probability_targets; /* 1: the calls take target probabilities (vpce_forward_probs, ...), not ids */
  int memory_space;        /* vpce_memory_space of every array argument of the handle's calls (default
                              host); VPCE_MEMORY_DEVICE needs vpce_has_device() */
} vpce_options;

typedef struct vpce_handle_s* vpce_handle;

void vpce_options_default(vpce_options* options);

/* Kokkos for C and Fortran programs: vpce_initialize() initialises Kokkos unless the program already did
 * (call it after MPI_Init, before vpce_create); vpce_finalize() finalises Kokkos only if vpce_initialize()
 * initialised it (call it after the last vpce_destroy, before MPI_Finalize). Where neither OMP_PROC_BIND nor
 * OMP_PLACES is set, vpce_initialize() sets OMP_PROC_BIND=false first (what the OpenMP runtime does then
 * anyway: threads unbound), so that Kokkos' OpenMP backend does not warn; set them in the job's environment
 * to bind threads (e.g. OMP_PROC_BIND=spread OMP_PLACES=threads). */
vpce_status vpce_initialize(void);
vpce_status vpce_finalize(void);
/* 1 if this build of vpce has a device backend (Kokkos' default execution space is CUDA, HIP, SYCL, ...:
 * options.memory_space = VPCE_MEMORY_DEVICE works), else 0. */
int vpce_has_device(void);

/* Collective. This rank owns `local_vocab` columns, ranks in order (an uneven split is fine); the
 * communicator is duplicated. `options` may be NULL (defaults). */
vpce_status vpce_create(MPI_Comm comm, int64_t local_vocab, vpce_dtype dtype, const vpce_options* options,
                        vpce_handle* handle);
/* The same from Fortran's integer communicator handle. */
vpce_status vpce_create_f(MPI_Fint comm, int64_t local_vocab, int dtype, const vpce_options* options,
                          vpce_handle* handle);
vpce_status vpce_destroy(vpce_handle handle);

/* This rank's first global column, its width, and the global vocabulary size. */
vpce_status vpce_partition(vpce_handle handle, int64_t* begin, int64_t* local_vocab, int64_t* vocab);

/* Collective. Class weights (PyTorch's `weight`): this rank's local_vocab values for its own columns, in the
 * loss's type, finite and >= 0; the mean then divides by the valid targets' weights (vpce/cross_entropy.hpp,
 * set_class_weights). NULL removes them (every rank must pass NULL then; a rank that owns no columns passes
 * any other pointer to set them). */
vpce_status vpce_set_class_weights(vpce_handle handle, const void* local_weights);

/* Collective. Per-token loss; keeps what backward needs (recompute mode: the logits must stay unchanged). */
vpce_status vpce_forward(vpce_handle handle, int64_t n_tokens, const void* logits, const int64_t* targets, void* loss);
/* Gradient of the last forward: of sum_i grad_loss[i] * loss_i if grad_loss is not NULL (reduction none),
 * else of grad_scale * (the sum, or with reduction mean the mean, of the losses). No communication. */
vpce_status vpce_backward(vpce_handle handle, const void* grad_loss, double grad_scale, void* grad);
/* Collective. Loss and gradient in one call; grad may be the logits' own buffer. */
vpce_status vpce_loss_and_grad(vpce_handle handle, int64_t n_tokens, const void* logits, const int64_t* targets,
                               void* loss, void* grad, const void* grad_loss, double grad_scale);
/* The same with target probabilities (options.probability_targets): N x local_vocab, row-major, in the
 * logits' type, each row >= 0 summing to 1 over the global vocabulary (vpce/options.hpp). */
vpce_status vpce_forward_probs(vpce_handle handle, int64_t n_tokens, const void* logits, const void* target_probs,
                               void* loss);
vpce_status vpce_loss_and_grad_probs(vpce_handle handle, int64_t n_tokens, const void* logits, const void* target_probs,
                                     void* loss, void* grad, const void* grad_loss, double grad_scale);
/* lse per row of the last call (N values), and the reduced loss (sum for reduction none). */
vpce_status vpce_lse(vpce_handle handle, void* lse);
/* Per row of the last forward/loss_and_grad (N values, the loss's type), no communication: the entropy of
 * the softmax over the global vocabulary (needs options.entropy or an entropy_weight); the target's
 * log-softmax (0 for ignored rows); the z-loss term z_loss * lse^2 the loss includes (0 for ignored rows). */
vpce_status vpce_entropy(vpce_handle handle, void* entropy);
vpce_status vpce_logprob(vpce_handle handle, void* logprob);
vpce_status vpce_z_loss_terms(vpce_handle handle, void* z_loss);
vpce_status vpce_reduced_loss(vpce_handle handle, double* loss);
/* The number of rows of the last call whose target is not ignore_index (the mean's divisor without class
 * weights). */
vpce_status vpce_num_valid(vpce_handle handle, int64_t* num_valid);

/* The fused LM head (vpce::LinearCrossEntropy, vpce/linear_cross_entropy.hpp): the loss of the logits
 * hidden x weight^T + bias without ever holding them whole. Needs vpce built with Kokkos Kernels; without it
 * vpce_linear_create fails (VPCE_ERROR_INPUT) saying so. Arrays are row-major, in `dtype`, on the host or
 * (options.memory_space) the device:
 * hidden n_rows x hidden_size (all n_tokens tokens, or with sequence_parallel this rank's slice of them, rank
 * 0's rows first), weight local_vocab x hidden_size (this rank's rows), bias local_vocab or NULL; targets and
 * loss n_tokens. loss, grad_loss and the gradients (grad_hidden like hidden, grad_weight like weight,
 * grad_bias like bias: NULL without a bias) are double for VPCE_FLOAT64 and float otherwise (16-bit inputs
 * are multiplied in float). chunk_rows: rows of logits at a time, 0 for the library's default (64 MiB). */
typedef struct vpce_linear_s* vpce_linear;
/* Collective. options as for vpce_create (mode, grad_in_logits_type and probability_targets are not used;
 * probability_targets set is an error). */
vpce_status vpce_linear_create(MPI_Comm comm, int64_t local_vocab, int64_t hidden_size, vpce_dtype dtype,
                               const vpce_options* options, int64_t chunk_rows, int sequence_parallel,
                               vpce_linear* head);
vpce_status vpce_linear_create_f(MPI_Fint comm, int64_t local_vocab, int64_t hidden_size, int dtype,
                                 const vpce_options* options, int64_t chunk_rows, int sequence_parallel,
                                 vpce_linear* head);
vpce_status vpce_linear_destroy(vpce_linear head);
/* Collective. Per-token loss; keeps the pointers for vpce_linear_backward (the arrays must stay unchanged). */
vpce_status vpce_linear_forward(vpce_linear head, int64_t n_rows, int64_t n_tokens, const void* hidden,
                                const void* weight, const void* bias, const int64_t* targets, void* loss);
/* Collective. Gradients of the last forward: of sum_i grad_loss[i] * loss_i if grad_loss is not NULL
 * (reduction none), else of grad_scale * the reduced loss; accumulate: add to grad_weight and grad_bias. */
vpce_status vpce_linear_backward(vpce_linear head, const void* grad_loss, double grad_scale, void* grad_hidden,
                                 void* grad_weight, void* grad_bias, int accumulate);
/* Collective. Loss and gradients in one pass (the training step). */
vpce_status vpce_linear_loss_and_grad(vpce_linear head, int64_t n_rows, int64_t n_tokens, const void* hidden,
                                      const void* weight, const void* bias, const int64_t* targets, void* loss,
                                      void* grad_hidden, void* grad_weight, void* grad_bias, const void* grad_loss,
                                      double grad_scale, int accumulate);
/* The reduced loss of the last call (sum for reduction none). */
vpce_status vpce_linear_reduced_loss(vpce_linear head, double* loss);
/* The message of this thread's last failed call ("" if none). */
const char* vpce_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* VPCE_VPCE_H */
