#!/usr/bin/env python3
"""Lists the exp loops of x86-64 object files that carry a value from one iteration to the next in memory.

A diagnostic for the host kernels' object code (not a test): an innermost loop (as check_vectorized.py finds
them) that forms exps (a `vpermps` of the AVX-512 table exp, a `(v)pslld $0x17` forming 2^k, or `vscalefps`)
and whose first access to some stack slot in an iteration, in the loop's address order from its header, is a
load of a vector register, while the loop also stores to that slot: a sum or maximum kept in memory (a store
and a load on its dependency chain per iteration) or a register spilled across the back edge. Spills within
one iteration (stored first, then loaded) are not counted. GCC kept the copies' sums and maxima in memory this
way when an exception edge left the loop (perf_tests/NOTES.md, issue 12, forty-fourth round).

Usage: carried_in_memory.py [--show N] OBJ...   (e.g. build/CMakeFiles/vpce.dir/src/cross_entropy_float.cpp.o)
Prints per object the exp loops and those carrying a value in memory, grouped by the row kernel and the copy
(`Copy<L>` level, or `build`), and the first N of them with the slot's first access.
"""
import argparse
import collections
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "unit_tests", "vectorization"))
from check_vectorized import functions, innermost_loops  # noqa: E402

SLOT = re.compile(r"(-?0x[0-9a-f]+|\d*)\(%(rbp|rsp)\)")
VECTOR = re.compile(r"%[xyz]mm")
KERNELS = ("ChainedRows", "StatsWithGradient", "LocalStats", "LocalSumGather", "LocalMax", "TargetProbSums",
           "row_probability_sums", "BackwardFromStash", "Finalize")


def is_exp(mnem, ops):
    return mnem in ("vpermps", "vscalefps") or (mnem in ("pslld", "vpslld") and ops.startswith("$0x17,"))


def carried(insns):
    """(number of exp loops, [(header address, slots carried, first access)] of those carrying a value)."""
    exp_loops, found = 0, []
    for loop in innermost_loops(insns):
        if not any(is_exp(insns[k][1], insns[k][2]) for k in loop):
            continue
        exp_loops += 1
        first, stored = {}, set()
        for k in loop:
            _, mnem, ops = insns[k]
            slot = SLOT.search(ops)
            if not slot or not VECTOR.search(ops):
                continue
            store = ops.split(",")[-1].strip() == slot.group(0)
            if store:
                stored.add(slot.group(0))
            first.setdefault(slot.group(0), (store, f"{mnem} {ops}"))
        slots = sorted(s for s in stored if not first[s][0])
        if slots:
            found.append((insns[loop[0]][0], slots, first[slots[0]][1]))
    return exp_loops, found


def group(name):
    level = re.search(r"Copy<\(vpce::impl::Isa\)(\d)>", name)
    kernel = next((k for k in KERNELS if k in name), "other")
    return (f"copy {'build v3 v4 v4bf16'.split()[int(level.group(1))]}" if level else "build", kernel)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("objects", nargs="+")
    ap.add_argument("--show", type=int, default=0)
    ap.add_argument("--objdump", default="objdump")
    a = ap.parse_args()
    for obj in a.objects:
        dis = subprocess.run([a.objdump, "-d", "-C", "--no-show-raw-insn", obj], check=True, capture_output=True,
                             text=True).stdout
        total, groups, shown = 0, collections.Counter(), []
        for name, insns in functions(dis):
            if "vpce" not in name:
                continue
            n, found = carried(insns)
            total += n
            for address, slots, access in found:
                groups[group(name)] += 1
                shown.append(f"    {name[:150]}: loop {address:#x}, {' '.join(slots)} first {access}")
        print(f"{obj}: {total} exp loops, {sum(groups.values())} carrying a value in memory")
        for (level, kernel), count in sorted(groups.items()):
            print(f"  {count:4d}  {level:12s} {kernel}")
        print("\n".join(shown[:a.show]))


if __name__ == "__main__":
    main()
