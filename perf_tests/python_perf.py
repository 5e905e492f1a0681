"""What vpce's Python layer costs, in one run, under mpirun (every rank runs it):

  * native: loss_and_grad through the C API, --calls calls in a loop in C++ (the module's benchmark hook);
  * python: as many vpce.CrossEntropy.loss_and_grad calls on numpy arrays, outputs given (what the Python layer
    adds: the argument checks, their agreement across ranks, the GIL released and taken);
  * python_alloc: the same with the loss and gradient allocated by each call (numpy);
  * torch_fwd_bwd: vpce.torch.vocab_parallel_cross_entropy forward + .sum().backward() on a torch tensor
    (recompute mode: the backward recomputes the softmax into a new tensor), each call timed alone: the figure
    to compare with Megatron's algorithm (perf_tests/compare_torch.py runs this script for it);
  * torch_fwd_bwd_inplace: the same with inplace=True (the gradient over the logits, as Megatron writes it);
  * torch_fwd_bwd_stash_inplace: inplace=True, mode="stash_softmax": loss and gradient in one pass in the
    forward; the backward's incoming gradient is all ones (.sum()), so it has nothing left to do.

--rounds rounds of the first three, alternately; milliseconds per call of the median round (the slowest rank's
time). Rank 0 prints them and the ratios to native, and writes --json. Usage:
  mpirun -np 2 python perf_tests/python_perf.py [--tokens 4096] [--vocab-local 32768] [--calls 10] [--rounds 5]
                                                [--json F]
(PYTHONPATH=<build>/python, or vpce installed).
"""
import argparse
import json
import statistics
import time

import numpy as np
from mpi4py import MPI

import vpce

try:
    import torch

    import vpce.torch
except ImportError:  # no PyTorch: no torch_fwd_bwd figure
    torch = None


def median_ms(comm, call, reps):
    call()  # warm-up
    times = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        call()
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--vocab-local", type=int, default=32768)
    ap.add_argument("--calls", type=int, default=10, help="calls per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    n, v = args.tokens, args.vocab_local
    rng = np.random.default_rng(comm.Get_rank())
    logits = (rng.random((n, v), dtype=np.float32) * 8 - 4)
    targets = np.random.default_rng(99).integers(0, v * comm.Get_size(), n)
    loss = np.empty(n, np.float32)
    grad = np.empty_like(logits)
    ce = vpce.CrossEntropy(comm, local_vocab=v)

    # Rounds of `calls` calls each, native and Python alternately; per call, the median round (slowest rank).
    def native_round():
        return comm.allreduce(ce._ce.time_loss_and_grad(logits, targets, loss, grad, args.calls), op=MPI.MAX)

    def python_round(alloc):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            if alloc:
                ce.loss_and_grad(logits, targets)
            else:
                ce.loss_and_grad(logits, targets, grad=grad, loss=loss)
        return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)

    rounds = {"native": [], "python": [], "python_alloc": []}
    python_round(False)  # warm-up
    for _ in range(args.rounds):
        rounds["native"].append(native_round())
        rounds["python"].append(python_round(False))
        rounds["python_alloc"].append(python_round(True))
    ms = {name: statistics.median(r) / args.calls * 1e3 for name, r in rounds.items()}
    if torch is not None:
        x = torch.from_numpy(logits).requires_grad_()
        t = torch.from_numpy(targets)

        def fwd_bwd(**kw):
            x.grad = None
            # inplace: the gradient lands in the buffer of the logits (a view of x here, so x's own data: the
            # values change from step to step, the work does not)
            logits = x.view_as(x) if kw.get("inplace") else x
            vpce.torch.vocab_parallel_cross_entropy(logits, t, comm, **kw).sum().backward()

        reps = args.rounds * args.calls
        ms["torch_fwd_bwd"] = median_ms(comm, fwd_bwd, reps)
        ms["torch_fwd_bwd_inplace"] = median_ms(comm, lambda: fwd_bwd(inplace=True), reps)
        ms["torch_fwd_bwd_stash_inplace"] = median_ms(comm, lambda: fwd_bwd(inplace=True, mode="stash_softmax"), reps)
    if comm.Get_rank() == 0:
        print(f"{comm.Get_size()} rank(s), N = {n}, V_local = {v}, float32; median ms (slowest rank)")
        for name, value in ms.items():
            print(f"  {name:28s} {value:10.3f}  x native {value / ms['native']:.4f}")
        print(f"  Python call overhead: {1e3 * (ms['python'] - ms['native']):+.1f} us per call, "
              f"{100 * (ms['python'] / ms['native'] - 1):+.2f} % (allocating the outputs: "
              f"{100 * (ms['python_alloc'] / ms['native'] - 1):+.2f} %)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "ranks": comm.Get_size(), "ms": ms}, f, indent=1)


if __name__ == "__main__":
    main()
