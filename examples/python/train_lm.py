"""Train a small next-byte language model in PyTorch with a tensor-parallel LM head and vpce.torch's loss.

    mpirun -np 2 python examples/python/train_lm.py [--steps S] [--batch N] [--hidden H] [--lr LR]
                                                    [--curve OUT] [--compare REF] [--rtol R]

The model is examples/train_lm.cpp's: tokens are the bytes of a text (default: the GPL-3 that Debian's
base-files ships), hidden_i = E[x_i] + P[x_{i-1}] (two embedding tables, the same on every rank), logits_i =
W hidden_i with W's 256 rows split across the ranks as Megatron's column-parallel layer splits them (each rank
holds and trains only its rows). The loss is vpce.torch.vocab_parallel_cross_entropy over the ranks' logits;
the gradient of the replicated hidden state is summed over the ranks (Megatron's copy to the tensor-parallel
region) before it reaches the embeddings. Parameters are initialised whole from one seed and sliced, so every
rank count trains the same model: --compare checks this run's loss curve against another's (e.g. 1 rank's).
Exits 1 if the loss did not fall or the curves differ.
"""
import argparse
import sys

import numpy as np
import torch
from mpi4py import MPI

import vpce.torch


class CopyToTensorParallel(torch.autograd.Function):
    """The identity forward; the backward sums the ranks' gradients (each rank's logits use the whole input)."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        out = torch.empty_like(g)
        ctx.comm.Allreduce(g.numpy(), out.numpy(), op=MPI.SUM)
        return out, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1.0)
    ap.add_argument("--curve")
    ap.add_argument("--compare")
    ap.add_argument("--rtol", type=float, default=1e-5)
    args = ap.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    torch.set_num_threads(1)
    data = np.frombuffer(open(args.text, "rb").read(), dtype=np.uint8) if rank == 0 else None
    tokens = torch.from_numpy(comm.bcast(data, root=0).astype(np.int64))

    vocab, hidden = 256, args.hidden
    sizes = [vocab // size + (r < vocab % size) for r in range(size)]  # this rank's rows of W: an uneven split
    begin = sum(sizes[:rank])
    g = torch.Generator().manual_seed(0)
    emb = torch.nn.Parameter(0.1 * torch.randn(vocab, hidden, generator=g))
    prev = torch.nn.Parameter(0.1 * torch.randn(vocab, hidden, generator=g))
    w = torch.nn.Parameter((0.1 * torch.randn(vocab, hidden, generator=g))[begin:begin + sizes[rank]].clone())
    opt = torch.optim.SGD([emb, prev, w], lr=args.lr)

    curve = []
    batches = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        pos = torch.randint(1, len(tokens) - 1, (args.batch,), generator=batches)
        h = emb[tokens[pos]] + prev[tokens[pos - 1]]
        logits = CopyToTensorParallel.apply(h, comm) @ w.t()  # [batch, V_local]
        loss = vpce.torch.vocab_parallel_cross_entropy(logits, tokens[pos + 1], comm).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        curve.append(loss.item())
        if rank == 0 and (step % 50 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {curve[-1]:.5f}", flush=True)

    ok = curve[-1] < 0.8 * curve[0]
    if rank == 0:
        if not ok:
            print(f"the loss did not fall: {curve[0]:.5f} -> {curve[-1]:.5f}", file=sys.stderr)
        if args.curve:
            np.savetxt(args.curve, curve)
        if args.compare:
            ref = np.loadtxt(args.compare)
            if ref.shape != (len(curve),) or not np.allclose(curve, ref, rtol=args.rtol, atol=0):
                worst = np.max(np.abs(np.asarray(curve) - ref) / np.abs(ref)) if ref.shape == (len(curve),) else None
                print(f"the loss curve differs from {args.compare} (largest relative difference {worst})",
                      file=sys.stderr)
                ok = False
            else:
                print(f"the loss curve matches {args.compare} (rtol {args.rtol})")
    sys.exit(0 if comm.bcast(ok, root=0) else 1)


if __name__ == "__main__":
    main()
