! Fortran interface to vpce's C API (include/vpce/vpce.h) through ISO_C_BINDING.
! Compile this file with your program (or into a module library); link against vpce.
! Arrays are passed as C pointers: a Fortran array logits(V_local, N) (column-major) is the C array
! logits[N][V_local], so rows of the C API are columns here. With options%memory_space = VPCE_MEMORY_DEVICE
! they are device addresses, e.g. c_loc of an array inside OpenACC's host_data use_device (see
! examples/fortran_openacc_example.f90).
module vpce
  use, intrinsic :: iso_c_binding
  implicit none
  private

  integer(c_int), parameter, public :: VPCE_SUCCESS = 0, VPCE_ERROR_INPUT = 1, VPCE_ERROR_INTERNAL = 2
  integer(c_int), parameter, public :: VPCE_FLOAT32 = 0, VPCE_FLOAT64 = 1, VPCE_BFLOAT16 = 2, VPCE_FLOAT16 = 3
  integer(c_int), parameter, public :: VPCE_STRATEGY_FUSED = 0, VPCE_STRATEGY_SEED = 1
  integer(c_int), parameter, public :: VPCE_MODE_RECOMPUTE = 0, VPCE_MODE_STASH_SOFTMAX = 1
  integer(c_int), parameter, public :: VPCE_REDUCTION_NONE = 0, VPCE_REDUCTION_SUM = 1, VPCE_REDUCTION_MEAN = 2
  integer(c_int), parameter, public :: VPCE_MEMORY_HOST = 0, VPCE_MEMORY_DEVICE = 1

  type, bind(c), public :: vpce_options
    integer(c_int) :: strategy
    integer(c_int) :: mode
    integer(c_int) :: nan_is_error
    integer(c_int64_t) :: ignore_index
    integer(c_int) :: reduction
    real(c_double) :: label_smoothing
    real(c_double) :: z_loss
    real(c_double) :: logit_scale
    real(c_double) :: softcap
    integer(c_int) :: grad_in_logits_type
    integer(c_int) :: entropy
    real(c_double) :: entropy_weight
    integer(c_int) :: probability_targets
    integer(c_int) :: memory_space  ! VPCE_MEMORY_DEVICE: the arrays are device pointers (vpce_has_device() == 1)
  end type vpce_options

  public :: vpce_initialize, vpce_finalize, vpce_has_device, vpce_options_default, vpce_create_f, vpce_destroy
  public :: vpce_partition, vpce_forward, vpce_backward, vpce_loss_and_grad, vpce_lse, vpce_reduced_loss
  public :: vpce_num_valid
  public :: vpce_entropy, vpce_logprob, vpce_z_loss_terms, vpce_set_class_weights
  public :: vpce_forward_probs, vpce_loss_and_grad_probs
  public :: vpce_linear_create_f, vpce_linear_destroy, vpce_linear_forward, vpce_linear_backward
  public :: vpce_linear_loss_and_grad, vpce_linear_reduced_loss
  public :: vpce_last_error

  interface
    integer(c_int) function vpce_initialize() bind(c, name="vpce_initialize")
      import :: c_int
    end function
    integer(c_int) function vpce_finalize() bind(c, name="vpce_finalize")
      import :: c_int
    end function
    integer(c_int) function vpce_has_device() bind(c, name="vpce_has_device")
      import :: c_int
    end function
    subroutine vpce_options_default(options) bind(c, name="vpce_options_default")
      import :: vpce_options
      type(vpce_options), intent(out) :: options
    end subroutine
    integer(c_int) function vpce_create_f(comm, local_vocab, dtype, options, handle) bind(c, name="vpce_create_f")
      import :: c_int, c_int64_t, c_ptr, vpce_options
      integer(c_int), value :: comm
      integer(c_int64_t), value :: local_vocab
      integer(c_int), value :: dtype
      type(vpce_options), intent(in) :: options
      type(c_ptr), intent(out) :: handle
    end function
    integer(c_int) function vpce_destroy(handle) bind(c, name="vpce_destroy")
      import :: c_int, c_ptr
      type(c_ptr), value :: handle
    end function
    integer(c_int) function vpce_partition(handle, begin, local_vocab, vocab) bind(c, name="vpce_partition")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: handle
      integer(c_int64_t), intent(out) :: begin, local_vocab, vocab
    end function
    integer(c_int) function vpce_forward(handle, n_tokens, logits, targets, loss) bind(c, name="vpce_forward")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: handle
      integer(c_int64_t), value :: n_tokens
      type(c_ptr), value :: logits, targets, loss
    end function
    integer(c_int) function vpce_backward(handle, grad_loss, grad_scale, grad) bind(c, name="vpce_backward")
      import :: c_int, c_double, c_ptr
      type(c_ptr), value :: handle, grad_loss
      real(c_double), value :: grad_scale
      type(c_ptr), value :: grad
    end function
    integer(c_int) function vpce_loss_and_grad(handle, n_tokens, logits, targets, loss, grad, grad_loss, grad_scale) &
        bind(c, name="vpce_loss_and_grad")
      import :: c_int, c_int64_t, c_double, c_ptr
      type(c_ptr), value :: handle
      integer(c_int64_t), value :: n_tokens
      type(c_ptr), value :: logits, targets, loss, grad, grad_loss
      real(c_double), value :: grad_scale
    end function
    integer(c_int) function vpce_lse(handle, lse) bind(c, name="vpce_lse")
      import :: c_int, c_ptr
      type(c_ptr), value :: handle, lse
    end function
    integer(c_int) function vpce_forward_probs(handle, n_tokens, logits, target_probs, loss) &
        bind(c, name="vpce_forward_probs")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: handle, logits, target_probs, loss
      integer(c_int64_t), value :: n_tokens
    end function
    integer(c_int) function vpce_loss_and_grad_probs(handle, n_tokens, logits, target_probs, loss, grad, grad_loss, &
                                                     grad_scale) bind(c, name="vpce_loss_and_grad_probs")
      import :: c_int, c_int64_t, c_ptr, c_double
      type(c_ptr), value :: handle, logits, target_probs, loss, grad, grad_loss
      integer(c_int64_t), value :: n_tokens
      real(c_double), value :: grad_scale
    end function
    integer(c_int) function vpce_set_class_weights(handle, local_weights) bind(c, name="vpce_set_class_weights")
      import :: c_int, c_ptr
      type(c_ptr), value :: handle, local_weights
    end function
    integer(c_int) function vpce_entropy(handle, entropy) bind(c, name="vpce_entropy")
      import :: c_int, c_ptr
      type(c_ptr), value :: handle, entropy
    end function
    integer(c_int) function vpce_logprob(handle, logprob) bind(c, name="vpce_logprob")
      import :: c_int, c_ptr
      type(c_ptr), value :: handle, logprob
    end function
    integer(c_int) function vpce_z_loss_terms(handle, z_loss) bind(c, name="vpce_z_loss_terms")
      import :: c_int, c_ptr
      type(c_ptr), value :: handle, z_loss
    end function
    integer(c_int) function vpce_reduced_loss(handle, loss) bind(c, name="vpce_reduced_loss")
      import :: c_int, c_double, c_ptr
      type(c_ptr), value :: handle
      real(c_double), intent(out) :: loss
    end function
    integer(c_int) function vpce_num_valid(handle, num_valid) bind(c, name="vpce_num_valid")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: handle
      integer(c_int64_t), intent(out) :: num_valid
    end function
    ! The fused LM head (vpce.h, vpce_linear_*): hidden(H, n_rows), weight(H, local_vocab), bias(local_vocab)
    ! or c_null_ptr, targets/loss(n_tokens); sequence_parallel = 1: hidden holds this rank's tokens only.
    integer(c_int) function vpce_linear_create_f(comm, local_vocab, hidden_size, dtype, options, chunk_rows, &
                                                 sequence_parallel, head) bind(c, name="vpce_linear_create_f")
      import :: c_int, c_int64_t, c_ptr, vpce_options
      integer(c_int), value :: comm
      integer(c_int64_t), value :: local_vocab, hidden_size
      integer(c_int), value :: dtype
      type(vpce_options), intent(in) :: options
      integer(c_int64_t), value :: chunk_rows
      integer(c_int), value :: sequence_parallel
      type(c_ptr), intent(out) :: head
    end function
    integer(c_int) function vpce_linear_destroy(head) bind(c, name="vpce_linear_destroy")
      import :: c_int, c_ptr
      type(c_ptr), value :: head
    end function
    integer(c_int) function vpce_linear_forward(head, n_rows, n_tokens, hidden, weight, bias, targets, loss) &
        bind(c, name="vpce_linear_forward")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: head
      integer(c_int64_t), value :: n_rows, n_tokens
      type(c_ptr), value :: hidden, weight, bias, targets, loss
    end function
    integer(c_int) function vpce_linear_backward(head, grad_loss, grad_scale, grad_hidden, grad_weight, grad_bias, &
                                                 accumulate) bind(c, name="vpce_linear_backward")
      import :: c_int, c_double, c_ptr
      type(c_ptr), value :: head, grad_loss
      real(c_double), value :: grad_scale
      type(c_ptr), value :: grad_hidden, grad_weight, grad_bias
      integer(c_int), value :: accumulate
    end function
    integer(c_int) function vpce_linear_loss_and_grad(head, n_rows, n_tokens, hidden, weight, bias, targets, loss, &
                                                      grad_hidden, grad_weight, grad_bias, grad_loss, grad_scale, &
                                                      accumulate) bind(c, name="vpce_linear_loss_and_grad")
      import :: c_int, c_int64_t, c_double, c_ptr
      type(c_ptr), value :: head
      integer(c_int64_t), value :: n_rows, n_tokens
      type(c_ptr), value :: hidden, weight, bias, targets, loss, grad_hidden, grad_weight, grad_bias, grad_loss
      real(c_double), value :: grad_scale
      integer(c_int), value :: accumulate
    end function
    integer(c_int) function vpce_linear_reduced_loss(head, loss) bind(c, name="vpce_linear_reduced_loss")
      import :: c_int, c_double, c_ptr
      type(c_ptr), value :: head
      real(c_double), intent(out) :: loss
    end function
    type(c_ptr) function vpce_last_error_c() bind(c, name="vpce_last_error")
      import :: c_ptr
    end function
  end interface

contains

  !> The message of the last failed call as a Fortran string.
  function vpce_last_error() result(msg)
    character(len=:), allocatable :: msg
    character(kind=c_char), pointer :: chars(:)
    integer :: n
    interface
      integer(c_size_t) function c_strlen(s) bind(c, name="strlen")
        import :: c_size_t, c_ptr
        type(c_ptr), value :: s
      end function
    end interface
    type(c_ptr) :: p
    p = vpce_last_error_c()
    n = int(c_strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate(character(len=n) :: msg)
    msg = transfer(chars(1:n), msg)
  end function

end module vpce
