#!/usr/bin/env python3
"""PyTorch on one GPU at vpce's benchmark sizes: eager F.cross_entropy forward+backward, torch.compile of
it, and the seed's algorithm (Megatron-LM's forward and backward, one rank), for fp32 and bf16 logits.
Times are CUDA-event medians. Used by run_gpu.sh; prints a table and writes JSON with --json."""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).split(".")[-1]
        x = (torch.rand(a.tokens, a.vocab, device="cuda") * 8 - 4).to(dtype).requires_grad_()
        t = torch.randint(0, a.vocab, (a.tokens,), device="cuda")

        def eager():
            x.grad = None
            F.cross_entropy(x.float() if dtype != torch.float32 else x, t, reduction="sum").backward()

        compiled_loss = torch.compile(lambda z, y: F.cross_entropy(z.float(), y, reduction="sum"))

        def compiled():
            x.grad = None
            compiled_loss(x, t).backward()

        def seed():
            with torch.no_grad():
                z = x.detach().float().clone()
                m = z.max(dim=-1)[0]
                z.sub_(m.unsqueeze(-1))
                e = z.exp()
                s = e.sum(dim=-1)
                ar = torch.arange(a.tokens, device="cuda")
                loss = torch.log(s) - z[ar, t]
                e.div_(s.unsqueeze(-1))
                e[ar, t] -= 1.0
                return loss, e.to(dtype)

        copy_dst = torch.empty_like(x)
        results[f"copy ({name})"] = timed(lambda: copy_dst.copy_(x.detach()), a.reps)
        results[f"eager F.cross_entropy fwd+bwd ({name})"] = timed(eager, a.reps)
        results[f"torch.compile F.cross_entropy fwd+bwd ({name})"] = timed(compiled, a.reps)
        results[f"seed algorithm fwd+bwd ({name})"] = timed(seed, a.reps)
    for k, v in results.items():
        print(f"{k:55s} {v:9.3f} ms")
    if a.json:
        json.dump({"args": vars(a), "device": torch.cuda.get_device_name(), "ms": results}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
