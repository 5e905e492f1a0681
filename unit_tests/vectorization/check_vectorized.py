#!/usr/bin/env python3
"""Fails when a host kernel's inner loop is not vectorised for one of the target instruction sets.

probes.cpp runs each row kernel of vpce/impl/kernels.hpp on one row whose width is a multiple of every
vector length, so a vectorised inner loop has no scalar remainder. This script compiles it with the flags
vpce's kernel translation units get (taken from compile_commands.json) for each target (-march=...),
disassembles it, and requires of every function of vpce's (the probes and what they call):

  - no scalar floating-point arithmetic (add/sub/mul/div/fma/min/max/compare/convert on ss or sd) inside
    an innermost loop (a natural loop of the control-flow graph that holds no other): such a loop was
    left scalar;
  - packed floating-point arithmetic in the target's widest registers somewhere (xmm for x86-64-v2,
    ymm for x86-64-v3, zmm for x86-64-v4);
  - on targets with AVX (all but x86-64-v2): streaming stores (the gradient's lines) in ymm or zmm registers
    only, and some: a streaming store of an xmm register there is the baseline's form of stream_line (a copy
    that wrote its lines 16 bytes at a time through a call site without the level, 2026-12-06).

With an aarch64 cross compiler (Debian's g++-aarch64-linux-gnu) the same for aarch64 (NEON, -march=armv8-a):
no scalar s/d-register arithmetic in an innermost loop, packed .4s/.2d arithmetic somewhere.

Targets `x86-64-v3-copy`, `x86-64-v4-copy` and `x86-64-v4-bf16-copy`: the copies of the row loops that a build
for no CPU in particular picks from at run time (impl/isa.hpp, VPCE_HOST_CLONES): probes.cpp compiled for the
baseline x86-64 with each probe given the level's target and host policy (-DVPCE_PROBE_COPY=3, 4 or 5); the
same requirements as of a build for that level (ymm for v3, zmm for the two v4 copies).

Not checked: the out-of-line functions of CHECKED_INLINED, whose loops a probe of their own checks inlined.

A control function (a loop-carried recurrence) must be found scalar, or the reading of the object code
is broken. Why not the compiler's report (-fopt-info-vec): GCC analyses a loop that it versions for
if-conversion twice and reports one of the two copies as missed, at either source line, so the report
names loops that were vectorised after all.

Usage: check_vectorized.py --compile-commands FILE --kernel-tu FILE --probes FILE --workdir DIR
                           [--targets x86-64-v2,x86-64-v3,x86-64-v4,x86-64-v3-copy,...] [--objdump objdump]
                           [--aarch64-cxx aarch64-linux-gnu-g++ --aarch64-objdump aarch64-linux-gnu-objdump]
"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from compile_db import compile_command, without_source_and_output  # noqa: E402

WIDTH = {"x86-64-v2": "xmm", "x86-64-v3": "ymm", "x86-64-v4": "zmm", "aarch64": "NEON .4s/.2d"}
# The copies' targets: their width, and the level probes.cpp takes (VPCE_PROBE_COPY).
COPY = {"x86-64-v3-copy": ("ymm", 3), "x86-64-v4-copy": ("zmm", 4), "x86-64-v4-bf16-copy": ("zmm", 5)}
WIDTH.update({t: w for t, (w, _) in COPY.items()})
SCALAR_FP = re.compile(
    r"^v?(add|sub|mul|div|min|max|sqrt|rcp|rsqrt)s[sd]$"
    r"|^vf(n?m(add|sub))\d{3}s[sd]$"
    r"|^v?u?comis[sd]$"
    r"|^v?cmp\w*s[sd]$"
    r"|^v?cvt\w*(ss|sd)2\w+$|^v?cvt\w*2s[sd]$"
)
# Functions the kernels call out of line whose loops a probe of their own checks inlined, over a row of constant
# width: their out-of-line copies keep a remainder loop for a width known only at run time (scalar where the
# terms are long: the softcap's tanh on float16 logits), which is no failure. (LocalStats::row_folded, label
# smoothing's statistics, is another such function: probes.cpp calls the two forms LocalStats::row picks from, so
# that its out-of-line copy is not compiled there at all.)
CHECKED_INLINED = ("row_probability_sums_apart<",)
PACKED_FP = re.compile(r"^v?(f(n?m(add|sub))\d{3}|add|sub|mul|div|min|max)p[sd]$")
# aarch64: scalar FP arithmetic names an s or d register; packed names .4s or .2d lanes.
A64_SCALAR_FP = re.compile(r"^f(add|sub|mul|div|n?madd|n?msub|nmul|max|min|maxnm|minnm|sqrt|cmpe?|ccmpe?|csel|cvt\w*)$")
A64_SCALAR_REG = re.compile(r"(^|[\s,])[sd]\d+\b")
A64_PACKED_FP = re.compile(r"^f(add|sub|mul|div|mla|mls|max|min|maxnm|minnm)$")
FUNC = re.compile(r"^([0-9a-f]+) <(.*)>:$")
INSN = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")
JUMP_TARGET = re.compile(r"(?:^|[\s,])([0-9a-f]+) <")


def flags_for(args, kernel_tu, march, cxx=None):
    """The kernel TU's command with its source, output, -march and optimisation level replaced (and its
    compiler, for a cross compiler, without the x86-only -mprefer-vector-width)."""
    drop = ("-march=", "-mtune=", "-O", "-g", "-fsanitize", "-fno-sanitize")
    if cxx:
        drop += ("-mprefer-vector-width=",)
    keep = [a for a in without_source_and_output(args[1:], kernel_tu) if not a.startswith(drop)]
    return [cxx or args[0]] + keep + ["-O3", "-DNDEBUG", f"-march={march}"]


def functions(disassembly):
    name, insns = None, []
    for line in disassembly.splitlines():
        m = FUNC.match(line)
        if m:
            if name is not None:
                yield name, insns
            name, insns = m.group(2), []
            continue
        m = INSN.match(line)
        if m and name is not None:
            insns.append((int(m.group(1), 16), m.group(2), m.group(3)))
    if name is not None:
        yield name, insns


def branch_kind(mnem):
    """'cond' for a conditional branch, 'jump' for an unconditional one, 'ret' for a return, else None."""
    if mnem in ("ret", "retq", "ud2", "brk"):
        return "ret"
    if mnem in ("jmp", "jmpq", "b"):
        return "jump"
    if (mnem.startswith("j") and mnem not in ("jmp", "jmpq")) or re.match(r"^(b\.\w+|cbn?z|tbn?z)$", mnem):
        return "cond"
    return None


def scalar_fp(mnem, ops):
    return bool(SCALAR_FP.match(mnem)) or (bool(A64_SCALAR_FP.match(mnem)) and bool(A64_SCALAR_REG.search(ops)))


def innermost_loops(insns):
    """The innermost natural loops of a function, each as the list of its instructions' indices.

    The control-flow graph is built from the branches (a direct branch to an address in the function is an
    edge; an indirect one or a call ends nothing); a back edge is an edge u -> h where h dominates u, its
    loop h plus every block that reaches u without passing h. A loop is innermost when no other loop's
    header lies in it. This follows the code, not its layout: a loop whose body the compiler placed in
    several places, around other loops, is still seen as the loop it is."""
    if not insns:
        return []
    index = {addr: k for k, (addr, _, _) in enumerate(insns)}
    leaders = {0}
    targets = {}
    for k, (addr, mnem, ops) in enumerate(insns):
        kind = branch_kind(mnem)
        if kind is None:
            continue
        t = JUMP_TARGET.search(ops)
        if t and kind != "ret" and int(t.group(1), 16) in index:
            targets[k] = index[int(t.group(1), 16)]
            leaders.add(targets[k])
        if k + 1 < len(insns):
            leaders.add(k + 1)
    starts = sorted(leaders)
    block_of = {}
    blocks = []
    for n, first in enumerate(starts):
        last = (starts[n + 1] if n + 1 < len(starts) else len(insns)) - 1
        blocks.append((first, last))
        block_of[first] = n
    succ = [set() for _ in blocks]
    for n, (first, last) in enumerate(blocks):
        kind = branch_kind(insns[last][1])
        if last in targets:
            succ[n].add(block_of[targets[last]])
        if kind in (None, "cond") and last + 1 < len(insns):
            succ[n].add(n + 1)
    pred = [set() for _ in blocks]
    for n, ss in enumerate(succ):
        for m in ss:
            pred[m].add(n)
    # Dominators (iterative, over the blocks reachable from the entry).
    reach, stack = {0}, [0]
    while stack:
        for m in succ[stack.pop()]:
            if m not in reach:
                reach.add(m)
                stack.append(m)
    dom = {n: set(reach) for n in reach}
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for n in sorted(reach):
            if n == 0:
                continue
            ps = [dom[p] for p in pred[n] if p in reach]
            new = set.intersection(*ps) | {n} if ps else {n}
            if new != dom[n]:
                dom[n], changed = new, True
    loops = {}
    for u in reach:
        for h in succ[u]:
            if h in dom[u]:  # a back edge u -> h
                body, work = {h, u}, ([u] if u != h else [])
                while work:
                    for p in pred[work.pop()]:
                        if p in reach and p not in body:
                            body.add(p)
                            work.append(p)
                loops.setdefault(h, set()).update(body)
    inner = [body for h, body in loops.items() if not any(o != h and o in body for o in loops)]
    return [[k for n in sorted(body) for k in range(blocks[n][0], blocks[n][1] + 1)] for body in inner]


def scalar_loops(insns):
    """(first address, last address, first scalar instruction) of each innermost loop holding scalar FP
    arithmetic."""
    found = []
    for loop in innermost_loops(insns):
        for k in loop:
            _, mnem, ops = insns[k]
            if scalar_fp(mnem, ops):
                found.append((insns[loop[0]][0], insns[loop[-1]][0], f"{mnem} {ops}"))
                break
    return found


STREAMING_STORE = re.compile(r"^v?movnt(dq|ps|pd)$")


def is_packed(target, mnem, ops):
    if target == "aarch64":
        return bool(A64_PACKED_FP.match(mnem)) and (".4s" in ops or ".2d" in ops)
    return bool(PACKED_FP.match(mnem)) and f"%{WIDTH[target]}" in ops


def check(target, args, kernel_tu, probes, workdir, objdump, cxx=None):
    obj = os.path.join(workdir, f"probes-{target}.o")
    march = "armv8-a" if target == "aarch64" else "x86-64" if target in COPY else target
    cmd = flags_for(args, kernel_tu, march, cxx) + ["-c", probes, "-o", obj]
    if target in COPY:
        cmd.append(f"-DVPCE_PROBE_COPY={COPY[target][1]}")
    subprocess.run(cmd, check=True)
    dis = subprocess.run([objdump, "-d", "-C", "--no-show-raw-insn", obj], check=True, capture_output=True,
                         text=True).stdout
    checked = [0, 0, 0]  # functions, packed instructions, streaming stores
    wide_streams = target != "aarch64" and WIDTH[target] != "xmm"
    errors, control_ok = [], False
    for name, insns in functions(dis):
        if name.startswith("vpce_control_scalar"):
            control_ok = control_ok or bool(scalar_loops(insns))
            continue
        if "vpce" not in name or any(f in name for f in CHECKED_INLINED):
            continue
        checked[0] += 1
        checked[1] += sum(1 for _, m, o in insns if is_packed(target, m, o))
        for address, m, o in insns:
            if wide_streams and STREAMING_STORE.match(m):
                checked[2] += 1
                if "%xmm" in o:
                    errors.append(f"  {name}: a streaming store of an xmm register at {address:#x} ({m} {o})")
        for start, end, insn in scalar_loops(insns):
            errors.append(f"  {name}: loop {start:#x}-{end:#x} is scalar ({insn})")
    if not control_ok:
        errors.append("  the control loop (vpce_control_scalar) was not found scalar: the check cannot be trusted")
    if checked[1] == 0:
        errors.append(f"  no packed floating-point arithmetic in {WIDTH[target]} registers")
    if wide_streams and checked[2] == 0:
        errors.append("  no streaming store: the probes' streaming rows were not found")
    status = "FAILED" if errors else "ok"
    counts = f"{checked[0]} functions, {checked[1]} packed FP instructions in {WIDTH[target]} registers"
    if wide_streams:
        counts += f", {checked[2]} streaming stores"
    lines = [f"[vectorized] {target}: {status}: {counts}"] + errors
    return not errors, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compile-commands", required=True)
    ap.add_argument("--kernel-tu", required=True)
    ap.add_argument("--probes", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--targets", default="x86-64-v2,x86-64-v3,x86-64-v4")
    ap.add_argument("--objdump", default="objdump")
    ap.add_argument("--aarch64-cxx", help="an aarch64 cross compiler: adds the aarch64 target")
    ap.add_argument("--aarch64-objdump", default="aarch64-linux-gnu-objdump")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    args, _ = compile_command(a.compile_commands, a.kernel_tu)
    jobs = [(t, a.objdump, None) for t in a.targets.split(",")]
    if a.aarch64_cxx:
        jobs.append(("aarch64", a.aarch64_objdump, a.aarch64_cxx))
    # The compilations are independent: two at a time (the CI machines have 2 cores).
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda j: check(j[0], args, a.kernel_tu, a.probes, a.workdir, j[1], j[2]), jobs))
    for _, lines in results:
        print("\n".join(lines))
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
