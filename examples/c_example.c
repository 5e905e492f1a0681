/* The C API from C: float32 and bfloat16 logits on an uneven partition, mean reduction with label
 * smoothing, checked against each other (loss, gradient, and the per-row entropy and target log-prob), a
 * bad target that fails on every rank alike, and options.memory_space (device pointers: a build without a
 * device backend refuses them at create, on every rank alike).
 * Run: mpirun -np 3 ./vpce_example_c */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vpce/vpce.h>

static float logit(int64_t i, int64_t j) { return 3.0f * sinf(0.7f * (float)i + 0.013f * (float)(j * j % 977)); }

/* float -> bfloat16 bits, round to nearest even (finite inputs) */
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* 1 unless this rank's last error message is rank 0's (a collective call fails on every rank alike). */
static int differs_from_rank0(void) {
  char mine[512] = {0}, rank0[512];
  strncpy(mine, vpce_last_error(), sizeof mine - 1);
  memcpy(rank0, mine, sizeof mine);
  MPI_Bcast(rank0, (int)sizeof rank0, MPI_CHAR, 0, MPI_COMM_WORLD);
  return strcmp(mine, rank0) != 0;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size, fail = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  vpce_initialize();
  const int64_t n = 16, local = 100 + 10 * rank; /* uneven split */

  vpce_options opt;
  vpce_options_default(&opt);
  opt.reduction = VPCE_REDUCTION_MEAN;
  opt.label_smoothing = 0.1;
  opt.entropy = 1; /* keep each row's entropy (one more value per row in the collective) */
  vpce_handle h32, h16;
  if (vpce_create(MPI_COMM_WORLD, local, VPCE_FLOAT32, &opt, &h32) != VPCE_SUCCESS ||
      vpce_create(MPI_COMM_WORLD, local, VPCE_BFLOAT16, &opt, &h16) != VPCE_SUCCESS) {
    fprintf(stderr, "%s\n", vpce_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int64_t begin, v_local, vocab;
  vpce_partition(h32, &begin, &v_local, &vocab);

  float* x32 = malloc(sizeof(float) * n * local);
  uint16_t* x16 = malloc(sizeof(uint16_t) * n * local);
  float *g32 = malloc(sizeof(float) * n * local), *g16 = malloc(sizeof(float) * n * local);
  int64_t targets[16];
  float loss32[16], loss16[16];
  for (int64_t i = 0; i < n; ++i) {
    targets[i] = (i == 5) ? -100 : (i * 131) % vocab; /* row 5 is ignored */
    for (int64_t j = 0; j < local; ++j) {
      x16[i * local + j] = to_bf16(logit(i, begin + j));
      x32[i * local + j] = from_bf16(x16[i * local + j]); /* the same values, exactly */
    }
  }
  /* gradient of the mean loss; float32 gradient for both */
  if (vpce_loss_and_grad(h32, n, x32, targets, loss32, g32, NULL, 1.0) != VPCE_SUCCESS ||
      vpce_loss_and_grad(h16, n, x16, targets, loss16, g16, NULL, 1.0) != VPCE_SUCCESS) {
    fprintf(stderr, "%s\n", vpce_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  double mean32, mean16, worst = 0;
  int64_t valid = 0;
  vpce_reduced_loss(h32, &mean32);
  vpce_reduced_loss(h16, &mean16);
  vpce_num_valid(h32, &valid);
  for (int64_t k = 0; k < n * local; ++k) worst = fmax(worst, fabs(g32[k] - g16[k]));
  if (fabs(mean32 - mean16) > 1e-5 * fabs(mean32) || worst > 1e-6 || loss32[5] != 0.0f) fail = 1;
  if (valid != n - 1) fail = 1; /* row 5 is ignored */
  /* Per row: the entropy lies in [0, log V], the target's log-prob is <= 0 (0 for the ignored row 5). */
  float ent32[16], ent16[16], lp32[16], lp16[16];
  if (vpce_entropy(h32, ent32) != VPCE_SUCCESS || vpce_entropy(h16, ent16) != VPCE_SUCCESS ||
      vpce_logprob(h32, lp32) != VPCE_SUCCESS || vpce_logprob(h16, lp16) != VPCE_SUCCESS) {
    fprintf(stderr, "%s\n", vpce_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!(ent32[i] >= 0.0f && ent32[i] <= logf((float)vocab) + 1e-5f) || fabsf(ent32[i] - ent16[i]) > 1e-5f) fail = 1;
    if (!(lp32[i] <= 0.0f) || fabsf(lp32[i] - lp16[i]) > 1e-5f) fail = 1;
  }
  if (lp32[5] != 0.0f) fail = 1;

  /* Class weights, all 2 here (each rank passes its own columns'): every per-row loss doubles, and the mean,
   * divided by the valid targets' weights (PyTorch's), stays the same. */
  float* w = malloc(sizeof(float) * local);
  for (int64_t j = 0; j < local; ++j) w[j] = 2.0f;
  float loss_w[16];
  double mean_w;
  if (vpce_set_class_weights(h32, w) != VPCE_SUCCESS ||
      vpce_loss_and_grad(h32, n, x32, targets, loss_w, g32, NULL, 1.0) != VPCE_SUCCESS) {
    fprintf(stderr, "%s\n", vpce_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  vpce_reduced_loss(h32, &mean_w);
  for (int64_t i = 0; i < n; ++i)
    if (fabsf(loss_w[i] - 2.0f * loss32[i]) > 1e-5f * fabsf(loss32[i])) fail = 1;
  if (fabs(mean_w - mean32) > 1e-5 * fabs(mean32)) fail = 1;
  vpce_set_class_weights(h32, NULL); /* removed again */
  free(w);

  /* Probability targets (distillation's soft labels): one-hot rows equal to the ids give the same per-row
   * losses (every row counts here, row 5 too). */
  vpce_options popt = opt;
  popt.probability_targets = 1;
  vpce_handle hp;
  float* q = calloc((size_t)(n * local), sizeof(float));
  float loss_p[16];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = i == 5 ? 0 : targets[i];
    if (t >= begin && t < begin + local) q[i * local + (t - begin)] = 1.0f;
  }
  if (vpce_create(MPI_COMM_WORLD, local, VPCE_FLOAT32, &popt, &hp) != VPCE_SUCCESS ||
      vpce_loss_and_grad_probs(hp, n, x32, q, loss_p, g32, NULL, 1.0) != VPCE_SUCCESS) {
    fprintf(stderr, "%s\n", vpce_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (int64_t i = 0; i < n; ++i)
    if (i != 5 && fabsf(loss_p[i] - loss32[i]) > 1e-5f * fabsf(loss32[i])) fail = 1;
  vpce_destroy(hp);
  free(q);
  if (rank == 0)
    printf(
        "C API: V = %lld over %d ranks, mean loss float32 %.6f, bfloat16 %.6f, max |grad diff| %.2e, "
        "row 0: entropy %.4f, log-prob %.4f\n",
        (long long)vocab, size, mean32, mean16, worst, ent32[0], lp32[0]);

  /* The fused LM head: logits = hidden x W^T + bias never held whole (chunks of 5 rows), against the same
   * logits formed here and passed to vpce_loss_and_grad; then with sequence-parallel input (each rank passes
   * its own rows of hidden and gets their gradient). Builds without Kokkos Kernels say so and skip it. */
  {
    enum { H = 8 };
    vpce_linear lin, lin_sp;
    if (vpce_linear_create(MPI_COMM_WORLD, local, H, VPCE_FLOAT32, &opt, 5, 0, &lin) != VPCE_SUCCESS) {
      if (strstr(vpce_last_error(), "no Kokkos Kernels") == NULL) fail = 1;
      if (rank == 0) printf("LM head: %s\n", vpce_last_error());
    } else {
      float hid[16 * H], *wt = malloc(sizeof(float) * local * H), *bias = malloc(sizeof(float) * local);
      float gh[16 * H], gh_ref[16 * H], *gw = malloc(sizeof(float) * local * H), *gb = malloc(sizeof(float) * local);
      float loss_l[16], loss_m[16];
      for (int64_t i = 0; i < n; ++i)
        for (int k = 0; k < H; ++k) hid[i * H + k] = 0.5f * sinf(0.3f * (float)i + 0.7f * (float)k);
      for (int64_t j = 0; j < local; ++j) {
        bias[j] = 0.01f * (float)((begin + j) % 7);
        for (int k = 0; k < H; ++k) wt[j * H + k] = 0.4f * cosf(0.11f * (float)(begin + j) + 0.5f * (float)k);
      }
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < local; ++j) {
          float z = bias[j];
          for (int k = 0; k < H; ++k) z += hid[i * H + k] * wt[j * H + k];
          x32[i * local + j] = z;
        }
      if (vpce_loss_and_grad(h32, n, x32, targets, loss_m, g32, NULL, 1.0) != VPCE_SUCCESS ||
          vpce_linear_loss_and_grad(lin, n, n, hid, wt, bias, targets, loss_l, gh, gw, gb, NULL, 1.0, 0) !=
              VPCE_SUCCESS) {
        fprintf(stderr, "%s\n", vpce_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      double mean_l, err = 0;
      vpce_linear_reduced_loss(lin, &mean_l);
      vpce_reduced_loss(h32, &mean32);
      for (int64_t i = 0; i < n; ++i) err = fmax(err, fabs(loss_l[i] - loss_m[i]));
      err = fmax(err, fabs(mean_l - mean32));
      /* the reference gradients from the logits' one: dW = dz^T hidden, db = column sums, dh = sum over ranks */
      for (int64_t i = 0; i < n * H; ++i) gh_ref[i] = 0.0f;
      for (int64_t j = 0; j < local; ++j) {
        float sb = 0.0f;
        for (int k = 0; k < H; ++k) {
          float sw = 0.0f;
          for (int64_t i = 0; i < n; ++i) sw += g32[i * local + j] * hid[i * H + k];
          err = fmax(err, fabs(gw[j * H + k] - sw));
        }
        for (int64_t i = 0; i < n; ++i) {
          sb += g32[i * local + j];
          for (int k = 0; k < H; ++k) gh_ref[i * H + k] += g32[i * local + j] * wt[j * H + k];
        }
        err = fmax(err, fabs(gb[j] - sb));
      }
      MPI_Allreduce(MPI_IN_PLACE, gh_ref, (int)(n * H), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      for (int64_t i = 0; i < n * H; ++i) err = fmax(err, fabs(gh[i] - gh_ref[i]));
      /* sequence-parallel: rank r holds rows [r n / size, (r + 1) n / size) */
      const int64_t r0 = n * rank / size, r1 = n * (rank + 1) / size;
      if (vpce_linear_create(MPI_COMM_WORLD, local, H, VPCE_FLOAT32, &opt, 3, 1, &lin_sp) != VPCE_SUCCESS ||
          vpce_linear_loss_and_grad(lin_sp, r1 - r0, n, hid + r0 * H, wt, bias, targets, loss_l, gh, gw, gb, NULL, 1.0,
                                    0) != VPCE_SUCCESS) {
        fprintf(stderr, "%s\n", vpce_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      for (int64_t i = 0; i < n; ++i) err = fmax(err, fabs(loss_l[i] - loss_m[i]));
      for (int64_t i = 0; i < (r1 - r0) * H; ++i) err = fmax(err, fabs(gh[i] - gh_ref[r0 * H + i]));
      if (!(err < 2e-5)) fail = 1;
      if (rank == 0) printf("LM head (bias, chunks of 5; sequence-parallel): max |difference| %.2e\n", err);
      vpce_linear_destroy(lin_sp);
      vpce_linear_destroy(lin);
      free(wt);
      free(bias);
      free(gw);
      free(gb);
    }
  }

  /* A bad target: every rank gets the same error, and the ranks stay in step. */
  targets[3] = vocab + 7;
  vpce_status st = vpce_forward(h32, n, x32, targets, loss32);
  if (st != VPCE_ERROR_INPUT || strstr(vpce_last_error(), "outside") == NULL) fail = 1;
  if (rank == 0) printf("expected error: %s\n", vpce_last_error());

  /* Device pointers (VPCE_MEMORY_DEVICE) need a device backend: a host-only build refuses them at create,
   * saying why; an unknown memory_space fails in any build. */
  {
    vpce_options dopt;
    vpce_options_default(&dopt);
    dopt.memory_space = VPCE_MEMORY_DEVICE;
    vpce_handle hd = NULL;
    st = vpce_create(MPI_COMM_WORLD, local, VPCE_FLOAT32, &dopt, &hd);
    if (vpce_has_device()) {
      if (st != VPCE_SUCCESS) fail = 1;
      vpce_destroy(hd);
    } else {
      if (st != VPCE_ERROR_INPUT || hd != NULL || strstr(vpce_last_error(), "no device backend") == NULL ||
          differs_from_rank0())
        fail = 1;
      if (rank == 0) printf("expected error (host-only build): %s\n", vpce_last_error());
    }
    dopt.memory_space = 7;
    st = vpce_create(MPI_COMM_WORLD, local, VPCE_FLOAT32, &dopt, &hd);
    if (st != VPCE_ERROR_INPUT || hd != NULL || strstr(vpce_last_error(), "memory_space") == NULL ||
        differs_from_rank0())
      fail = 1;
  }

  vpce_destroy(h32);
  vpce_destroy(h16);
  free(x32);
  free(x16);
  free(g32);
  free(g16);
  int any = 0;
  MPI_Allreduce(&fail, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) printf("%s\n", any ? "FAILED" : "ok");
  vpce_finalize();
  MPI_Finalize();
  return any;
}
