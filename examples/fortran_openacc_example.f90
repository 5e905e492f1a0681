! The C API on arrays an OpenACC program keeps on the device: the logits are copied in once (!$acc data), and
! inside !$acc host_data use_device c_loc gives their device addresses, which a handle created with
! options%memory_space = VPCE_MEMORY_DEVICE takes as they are (vpce runs on the device, no copy through the
! host). That needs a vpce built with a device backend (vpce_has_device() == 1) and an OpenACC device, the same
! GPU as vpce's; otherwise (e.g. gfortran -fopenacc on a CPU, where OpenACC runs on the host) the handle takes
! the host arrays. Either way the loss and gradient are checked against their closed form: every logit is 0
! but the target's, a_i, so loss_i = log(V - 1 + exp(a_i)) - a_i. Run: mpirun -np 2 ./vpce_example_fortran_openacc
program vpce_fortran_openacc_example
  use, intrinsic :: iso_c_binding
  use mpi
  use openacc
  use vpce
  implicit none
  integer, parameter :: n = 6
  integer(c_int64_t), parameter :: vocab = 11
  integer :: ierr, rank, nranks, i, fail, any_fail
  integer(c_int64_t) :: j, begin, local, v, local_wanted
  logical :: on_device
  type(vpce_options) :: opt
  type(c_ptr) :: h
  real(c_double), allocatable, target :: logits(:, :), grad(:, :)
  integer(c_int64_t), target :: targets(n)
  real(c_double), target :: loss(n)
  real(c_double) :: a, s, p, worst
  integer(c_int) :: st

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  ierr = vpce_initialize()
  local_wanted = vocab / nranks
  if (rank == 0) local_wanted = vocab - (nranks - 1) * (vocab / nranks)

  on_device = vpce_has_device() == 1 .and. acc_get_num_devices(acc_device_not_host) > 0
  call vpce_options_default(opt)
  opt%memory_space = merge(VPCE_MEMORY_DEVICE, VPCE_MEMORY_HOST, on_device)
  if (vpce_create_f(MPI_COMM_WORLD, local_wanted, VPCE_FLOAT64, opt, h) /= VPCE_SUCCESS) then
    print *, vpce_last_error()
    call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
  end if
  ierr = vpce_partition(h, begin, local, v)

  allocate(logits(local, n), grad(local, n))  ! column i is token i's slice
  logits = 0
  do i = 1, n
    targets(i) = mod(int(i, c_int64_t) * 4, vocab)
    if (targets(i) >= begin .and. targets(i) < begin + local) logits(targets(i) - begin + 1, i) = target_logit(i)
  end do

  st = loss_and_grad(logits, grad)
  if (st /= VPCE_SUCCESS) then
    print *, vpce_last_error()
    call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
  end if

  ! The closed form: softmax 1 / s off the target, exp(a) / s on it, with s = V - 1 + exp(a).
  worst = 0
  do i = 1, n
    a = target_logit(i)
    s = real(vocab - 1, c_double) + exp(a)
    worst = max(worst, abs(log(s) - a - loss(i)))
    do j = 1, local
      p = 1 / s
      if (begin + j - 1 == targets(i)) p = exp(a) / s - 1
      worst = max(worst, abs(p - grad(j, i)))
    end do
  end do

  fail = 0
  if (worst > 1e-12_c_double) fail = 1
  call MPI_Allreduce(fail, any_fail, 1, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(a, a, a, i0, a, es9.2, a)', 'Fortran + OpenACC: ', &
                       trim(merge('device', 'host  ', on_device)), ' arrays, ', nranks, &
                       ' ranks, max |loss, gradient - closed form| = ', worst, &
                       merge(' ok    ', ' FAILED', any_fail == 0)
  deallocate(logits, grad)
  ierr = vpce_destroy(h)
  ierr = vpce_finalize()
  call MPI_Finalize(ierr)
  if (any_fail /= 0) stop 1

contains
  ! The loss and gradient, on the device arrays when on_device. Explicit-shape dummies: use_device takes no
  ! allocatable (gfortran 12).
  integer(c_int) function loss_and_grad(x, g) result(status)
    real(c_double), intent(in), target :: x(local, n)
    real(c_double), intent(out), target :: g(local, n)
    !$acc data copyin(x, targets) create(loss, g)
    if (on_device) then
      !$acc host_data use_device(x, targets, loss, g)
      status = vpce_loss_and_grad(h, int(n, c_int64_t), c_loc(x), c_loc(targets), c_loc(loss), c_loc(g), &
                                  c_null_ptr, 1.0_c_double)
      !$acc end host_data
      !$acc update self(loss, g)
    else
      status = vpce_loss_and_grad(h, int(n, c_int64_t), c_loc(x), c_loc(targets), c_loc(loss), c_loc(g), &
                                  c_null_ptr, 1.0_c_double)
    end if
    !$acc end data
  end function
  ! The target's logit of token i (every other logit is 0).
  real(c_double) function target_logit(i)
    integer, intent(in) :: i
    target_logit = 0.5_c_double * i
  end function
end program
