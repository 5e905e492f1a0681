#!/usr/bin/python3
"""The cost model of docs/scaling.md: predicted time of the loss + gradient per step for vpce's one
collective, the seed's three, and an all-gather design, over rank counts. Prints a markdown table.

  /usr/bin/python3 perf_tests/cost_model.py [--tokens 16384] [--vocab 131072] [--bytes 2] [--mem-gbps 3000]
        [--alpha-us 5] [--net-gbps 25] [--block-rows 0]
"""
import argparse
import math


def allreduce(m_bytes, p, alpha, beta):
    """Latency-bandwidth model of an all-reduce of m bytes over p ranks: recursive doubling for small
    messages, Rabenseifner (reduce-scatter + all-gather) for large ones; the better of the two."""
    if p == 1:
        return 0.0
    steps = math.ceil(math.log2(p))
    rd = steps * (alpha + m_bytes / beta)
    rab = 2 * steps * alpha + 2 * (p - 1) / p * m_bytes / beta
    return min(rd, rab)


def allgather(m_bytes_per_rank, p, alpha, beta):
    if p == 1:
        return 0.0
    return math.ceil(math.log2(p)) * alpha + (p - 1) * m_bytes_per_rank / beta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--vocab", type=int, default=131072)
    ap.add_argument("--bytes", type=int, default=2, help="bytes per logit (2: bf16, 4: fp32)")
    ap.add_argument("--mem-gbps", type=float, default=3000.0, help="memory bandwidth per rank, GB/s")
    ap.add_argument("--alpha-us", type=float, default=5.0, help="network latency per message, microseconds")
    ap.add_argument("--net-gbps", type=float, default=25.0, help="network bandwidth per rank, GB/s")
    ap.add_argument("--block-rows", type=int, default=0, help="rows per collective for vpce (0: all rows in one)")
    a = ap.parse_args()
    alpha, beta, mem = a.alpha_us * 1e-6, a.net_gbps * 1e9, a.mem_gbps * 1e9
    n = a.tokens
    print(f"N = {n} tokens, V = {a.vocab}, {a.bytes} bytes per logit, {a.mem_gbps:g} GB/s memory per rank, "
          f"network alpha = {a.alpha_us:g} us, beta = {a.net_gbps:g} GB/s\n")
    print("| ranks | V_local | memory floor (1 read + 1 write) | vpce: passes + 1 all-reduce | seed: passes + 3 all-reduces "
          "| all-gather of 3 values per row | vpce collective share |")
    print("|---|---|---|---|---|---|---|")
    for p in [1, 2, 8, 64, 256, 1024]:
        vl = math.ceil(a.vocab / p)
        data = n * vl * a.bytes
        floor = 2 * data / mem
        # vpce loss_and_grad: 1 read + 1 write (cache-blocked), records of 16 bytes (fp32 m, s, t, a) per row
        blocks = 1 if a.block_rows == 0 else math.ceil(n / a.block_rows)
        rows = n if a.block_rows == 0 else a.block_rows
        vpce_coll = blocks * allreduce(16 * rows, p, alpha, beta)
        vpce = floor + vpce_coll
        # seed: forward max (read), exp (read + write), sum (read), divide (read + write), clone (read + write),
        # backward (read + write): about 5 reads + 4 writes of the slice; 3 all-reduces of 4 bytes per row
        seed = (9 * data) / mem + 3 * allreduce(4 * n, p, alpha, beta)
        # all-gather design (TransformerEngine-like): each rank contributes 3 fp32 values per row
        ag = floor + allgather(12 * n, p, alpha, beta)
        print(f"| {p} | {vl} | {floor * 1e3:.3f} ms | {vpce * 1e3:.3f} ms | {seed * 1e3:.3f} ms | {ag * 1e3:.3f} ms "
              f"| {100 * vpce_coll / vpce:.1f}% |")


if __name__ == "__main__":
    main()
