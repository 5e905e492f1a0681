#!/usr/bin/python3
"""vpce against PyTorch on the CPU, in the same run, at the same sizes.

  * the seed's algorithm (Megatron-LM's _VocabParallelCrossEntropy: three all-reduces, softmax stash) in
    PyTorch with the gloo backend, at the same number of ranks and threads per rank as vpce;
  * single-process torch.nn.functional.cross_entropy forward+backward over the whole vocabulary with the
    same total number of threads;
  * single-process torch.logsumexp over one rank's logits (N x V_local) with the same total number of
    threads: the floor of a forward pass in PyTorch (compare with vpce's forward at --ranks 1);
  * vpce's benchmark (vpce_perf) under mpirun at the same rank count;
  * with --python-path (the folder holding the vpce package, e.g. build/python): vpce.torch's forward+backward
    (perf_tests/python_perf.py under mpirun at the same rank count), the drop-in for the seed's algorithm.

Prints the medians and the ratios. Needs Debian's python3-torch. Usage:
  /usr/bin/python3 perf_tests/compare_torch.py --vpce-perf build/perf_tests/vpce_perf --ranks 2 --threads 2 \
      --tokens 4096 --vocab-local 32768 [--reps 5] [--python-path build/python] [--json out.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def seed_worker(rank, world, args, port, queue):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, args.threads // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    n, v = args.tokens, args.vocab_local
    gen = torch.Generator().manual_seed(1234 + rank)
    logits = (torch.rand(n, v, generator=gen) * 8 - 4).float()
    target = torch.randint(0, v * world, (n,), generator=torch.Generator().manual_seed(99))

    def forward_backward():
        # Megatron-LM's forward (the seed), then its backward.
        x = logits.clone()
        logits_max = torch.max(x, dim=-1)[0]
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX)
        x.sub_(logits_max.unsqueeze(dim=-1))
        exp_logits = x.exp()
        sum_exp = exp_logits.sum(dim=-1)
        dist.all_reduce(sum_exp, op=dist.ReduceOp.SUM)
        start, end = rank * v, (rank + 1) * v
        mask = (target < start) | (target >= end)
        masked = target.clone() - start
        masked[mask] = 0
        arange = torch.arange(n)
        predicted = x[arange, masked]
        predicted[mask] = 0.0
        dist.all_reduce(predicted, op=dist.ReduceOp.SUM)
        loss = torch.log(sum_exp) - predicted
        exp_logits.div_(sum_exp.unsqueeze(dim=-1))
        # backward with grad_output = 1
        grad = exp_logits
        grad[arange, masked] -= 1.0 - mask.float()
        grad.mul_(torch.ones(n).unsqueeze(dim=-1))
        return loss, grad

    times = []
    forward_backward()
    for _ in range(args.reps):
        dist.barrier()
        t0 = time.perf_counter()
        forward_backward()
        dt = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        times.append(dt.item() * 1e3)
    if rank == 0:
        queue.put(statistics.median(times))
    dist.destroy_process_group()


def torch_seed(args):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=seed_worker, args=(r, args.ranks, args, port, queue)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    result = queue.get(timeout=1800)
    for p in procs:
        p.join()
    return result


def torch_cross_entropy(args):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    n, v = args.tokens, args.vocab_local * args.ranks
    logits = (torch.rand(n, v, generator=torch.Generator().manual_seed(5)) * 8 - 4).float().requires_grad_()
    target = torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(99))
    times = []
    for k in range(args.reps + 1):
        logits.grad = None
        t0 = time.perf_counter()
        F.cross_entropy(logits, target, reduction="sum").backward()
        if k:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def torch_logsumexp(args):
    import torch

    torch.set_num_threads(args.threads)
    logits = (torch.rand(args.tokens, args.vocab_local, generator=torch.Generator().manual_seed(5)) * 8 - 4).float()
    times = []
    for k in range(args.reps + 1):
        t0 = time.perf_counter()
        torch.logsumexp(logits, dim=1)
        if k:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def vpce(args):
    # --bind-to none: OpenMPI binds each of up to 2 ranks to one core, so a single rank's threads would share a
    # core while PyTorch's threads each have one.
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, args.threads // args.ranks)), OMP_PROC_BIND="false",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "vpce.json")
        cmd = ["mpirun", "-np", str(args.ranks), "--oversubscribe", "--bind-to", "none", args.vpce_perf,
               str(args.tokens), str(args.vocab_local * args.ranks), "float32", str(args.reps), out]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as f:
            return {r["name"]: r["ms_median"] for r in json.load(f)}


def vpce_torch(args):
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, args.threads // args.ranks)), OMP_PROC_BIND="false",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONPATH=args.python_path)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_perf.py")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "python.json")
        cmd = ["mpirun", "-np", str(args.ranks), "--oversubscribe", "--bind-to", "none", sys.executable, script,
               "--tokens", str(args.tokens), "--vocab-local", str(args.vocab_local), "--rounds", str(args.reps),
               "--json", out]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)["ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vpce-perf", required=True)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="total threads (split over the ranks)")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--vocab-local", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--python-path", help="the folder holding the vpce Python package (e.g. build/python)")
    ap.add_argument("--json")
    args = ap.parse_args()

    v = vpce(args)
    py = vpce_torch(args) if args.python_path else None
    seed_ms = torch_seed(args)
    ce_ms = torch_cross_entropy(args)
    lse_ms = torch_logsumexp(args)
    rows = [
        ("vpce loss_and_grad/fused", v["loss_and_grad/fused"]),
        ("vpce forward_backward/fused/recompute", v["forward_backward/fused/recompute"]),
        ("vpce forward_backward/seed/stash", v["forward_backward/seed/stash"]),
        ("vpce copy (ceiling)", v["copy"]),
        (f"PyTorch seed algorithm, gloo, {args.ranks} ranks", seed_ms),
        (f"PyTorch F.cross_entropy fwd+bwd, 1 process, V = {args.vocab_local * args.ranks}", ce_ms),
        ("vpce forward/fused/recompute", v["forward/fused/recompute"]),
        (f"PyTorch torch.logsumexp, 1 process, {args.tokens} x {args.vocab_local}", lse_ms),
    ]
    if py:
        rows[4:4] = [("vpce.torch fwd+bwd (recompute)", py["torch_fwd_bwd"]),
                     ("vpce.torch fwd+bwd (recompute, inplace)", py["torch_fwd_bwd_inplace"]),
                     ("vpce.torch fwd+bwd (stash, inplace, .sum())", py["torch_fwd_bwd_stash_inplace"]),
                     ("vpce Python loss_and_grad (outputs given)", py["python"])]
    print(f"{args.ranks} rank(s), {args.threads} thread(s) in all, {args.tokens} tokens, V_local {args.vocab_local}, float32")
    print(f"{'':58s} {'ms':>9s} {'x vpce loss_and_grad':>21s}")
    base = v["loss_and_grad/fused"]
    for name, ms in rows:
        print(f"{name:58s} {ms:9.1f} {ms / base:21.2f}")
    if py:
        best = min(py["torch_fwd_bwd"], py["torch_fwd_bwd_inplace"], py["torch_fwd_bwd_stash_inplace"])
        print(f"PyTorch seed algorithm / vpce.torch fwd+bwd: {seed_ms / py['torch_fwd_bwd']:.2f} "
              f"(best variant: {seed_ms / best:.2f})")
    print(f"torch.logsumexp / vpce forward: {lse_ms / v['forward/fused/recompute']:.2f} "
          f"(at --ranks 1 both read the same N x V_local with the same threads)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "ms": dict(rows)}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
