! The C API from Fortran: double-precision logits, each rank owning a slice of the vocabulary, checked
! against the whole-vocabulary loss, entropy and target log-prob computed here; then the fused LM head
! (vpce_linear_*: logits = hidden^T weight + bias, never formed) against its loss and grad_hidden computed
! here (skipped, and said, in a build without Kokkos Kernels). Run: mpirun -np 2 ./vpce_example_fortran
program vpce_fortran_example
  use, intrinsic :: iso_c_binding
  use mpi
  use vpce
  implicit none
  integer, parameter :: n = 8, hs = 4
  integer(c_int64_t), parameter :: vocab = 97
  integer :: ierr, rank, nranks, i, fail, any_fail
  integer(c_int64_t) :: j, begin, local, v, local_wanted
  type(vpce_options) :: opt
  type(c_ptr) :: h
  real(c_double), allocatable, target :: logits(:, :), grad(:, :)
  integer(c_int64_t), target :: targets(n)
  real(c_double), target :: loss(n), entropy(n), logprob(n)
  real(c_double) :: m, s, sx, ref, worst
  type(c_ptr) :: head
  real(c_double), allocatable, target :: hidden(:, :), weight(:, :), bias(:), ghid(:, :), gw(:, :), gb(:)
  real(c_double) :: p_j, dh(hs)
  integer :: k

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  ierr = vpce_initialize()
  local_wanted = vocab / nranks
  if (rank == 0) local_wanted = vocab - (nranks - 1) * (vocab / nranks)

  call vpce_options_default(opt)
  opt%entropy = 1  ! keep each row's entropy
  if (vpce_create_f(MPI_COMM_WORLD, local_wanted, VPCE_FLOAT64, opt, h) /= VPCE_SUCCESS) then
    print *, vpce_last_error()
    call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
  end if
  ierr = vpce_partition(h, begin, local, v)

  allocate(logits(local, n), grad(local, n))   ! column i is token i's slice
  do i = 1, n
    targets(i) = mod(int(i, c_int64_t) * 31, vocab)
    do j = 1, local
      logits(j, i) = z(i, begin + j - 1)
    end do
  end do
  if (vpce_loss_and_grad(h, int(n, c_int64_t), c_loc(logits), c_loc(targets), c_loc(loss), c_loc(grad), &
                         c_null_ptr, 1.0_c_double) /= VPCE_SUCCESS) then
    print *, vpce_last_error()
    call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
  end if
  if (vpce_entropy(h, c_loc(entropy)) /= VPCE_SUCCESS .or. vpce_logprob(h, c_loc(logprob)) /= VPCE_SUCCESS) then
    print *, vpce_last_error()
    call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
  end if

  worst = 0
  do i = 1, n
    m = -huge(1.0_c_double)
    do j = 0, vocab - 1
      m = max(m, z(i, j))
    end do
    s = 0
    sx = 0
    do j = 0, vocab - 1
      s = s + exp(z(i, j) - m)
      sx = sx + exp(z(i, j) - m) * z(i, j)
    end do
    ref = m + log(s) - z(i, targets(i))
    worst = max(worst, abs(ref - loss(i)), abs(-ref - logprob(i)), abs(m + log(s) - sx / s - entropy(i)))
  end do

  ! The fused LM head: hidden(hs, n) the same on every rank, this rank's columns of weight(hs, V) and bias.
  allocate(hidden(hs, n), weight(hs, local), bias(local), ghid(hs, n), gw(hs, local), gb(local))
  do i = 1, n
    do k = 1, hs
      hidden(k, i) = hv(k, i)
    end do
  end do
  do j = 1, local
    bias(j) = bv(begin + j - 1)
    do k = 1, hs
      weight(k, j) = wv(k, begin + j - 1)
    end do
  end do
  if (vpce_linear_create_f(MPI_COMM_WORLD, local, int(hs, c_int64_t), VPCE_FLOAT64, opt, 3_c_int64_t, 0, head) &
      /= VPCE_SUCCESS) then
    if (rank == 0) print *, 'LM head: ', vpce_last_error()
    if (index(vpce_last_error(), 'no Kokkos Kernels') == 0) worst = 1
  else
    if (vpce_linear_loss_and_grad(head, int(n, c_int64_t), int(n, c_int64_t), c_loc(hidden), c_loc(weight), &
                                  c_loc(bias), c_loc(targets), c_loc(loss), c_loc(ghid), c_loc(gw), c_loc(gb), &
                                  c_null_ptr, 1.0_c_double, 0) /= VPCE_SUCCESS) then
      print *, vpce_last_error()
      call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
    end if
    do i = 1, n
      m = -huge(1.0_c_double)
      do j = 0, vocab - 1
        m = max(m, zl(i, j))
      end do
      s = 0
      do j = 0, vocab - 1
        s = s + exp(zl(i, j) - m)
      end do
      dh = 0
      do j = 0, vocab - 1
        p_j = exp(zl(i, j) - m) / s - merge(1.0_c_double, 0.0_c_double, j == targets(i))
        do k = 1, hs
          dh(k) = dh(k) + p_j * wv(k, j)
        end do
      end do
      worst = max(worst, abs(m + log(s) - zl(i, targets(i)) - loss(i)), maxval(abs(dh - ghid(:, i))))
    end do
    ierr = vpce_linear_destroy(head)
  end if
  deallocate(hidden, weight, bias, ghid, gw, gb)

  fail = 0
  if (worst > 1e-12_c_double) fail = 1
  call MPI_Allreduce(fail, any_fail, 1, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(a, i0, a, es9.2, a)', 'Fortran: ', nranks, &
                       ' ranks, max |loss, entropy, log-prob, LM head - reference| = ', worst, &
                       merge(' ok    ', ' FAILED', any_fail == 0)
  deallocate(logits, grad)  ! a main program's allocatables are never freed on their own (LeakSanitizer)
  ierr = vpce_destroy(h)
  ierr = vpce_finalize()
  call MPI_Finalize(ierr)
  if (any_fail /= 0) stop 1

contains
  real(c_double) function z(i, j)
    integer, intent(in) :: i
    integer(c_int64_t), intent(in) :: j
    z = 2.5_c_double * sin(0.3_c_double * i + 0.017_c_double * real(j * j, c_double))
  end function
  ! The LM head's hidden state k of token i, weight k of vocabulary entry j, its bias, and their logit.
  real(c_double) function hv(k, i)
    integer, intent(in) :: k, i
    hv = 0.5_c_double * sin(0.3_c_double * i + 0.7_c_double * k)
  end function
  real(c_double) function wv(k, j)
    integer, intent(in) :: k
    integer(c_int64_t), intent(in) :: j
    wv = 0.4_c_double * cos(0.11_c_double * real(j, c_double) + 0.5_c_double * k)
  end function
  real(c_double) function bv(j)
    integer(c_int64_t), intent(in) :: j
    bv = 0.01_c_double * real(mod(j, 7_c_int64_t), c_double)
  end function
  real(c_double) function zl(i, j)
    integer, intent(in) :: i
    integer(c_int64_t), intent(in) :: j
    integer :: kk
    zl = bv(j)
    do kk = 1, hs
      zl = zl + hv(kk, i) * wv(kk, j)
    end do
  end function
end program
