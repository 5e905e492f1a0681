#!/usr/bin/env python3
"""Fails when including <vpce/vpce.hpp> reaches vpce's kernels.

Compiles user.cpp (which includes only <vpce/vpce.hpp>) with the flags its target gets (from
compile_commands.json) and -H, which lists every header the compiler opens, and fails if the list names a
kernel or definitions header of vpce (the row kernels, exp, streaming stores, the records' merge, the status
protocol, the staging and MPI layer, the strategies, the template definitions) or Kokkos Kernels' BLAS, or
if the preprocessor ends with one of vpce's SIMD macros defined. The control: the same compilation of a file
that includes <vpce/definitions.hpp> (the opt-in definitions) must reach the kernels, or the reading of -H is
broken.

Usage: check_include_graph.py --compile-commands FILE --tu unit_tests/include_graph/user.cpp --workdir DIR
"""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from compile_db import compile_command, without_source_and_output  # noqa: E402

FORBIDDEN = [
    r"vpce/impl/kernels\.hpp", r"vpce/impl/math\.hpp", r"vpce/impl/stream\.hpp", r"vpce/impl/row_stats\.hpp",
    r"vpce/impl/status\.hpp", r"vpce/impl/staging\.hpp", r"vpce/impl/collective\.hpp",
    r"vpce/impl/cross_entropy_core\.hpp", r"vpce/impl/cross_entropy_impl\.hpp", r"vpce/impl/fused_strategy\.hpp",
    r"vpce/impl/seed_strategy\.hpp", r"vpce/impl/linear_cross_entropy_impl\.hpp", r"vpce/definitions\.hpp",
    r"KokkosBlas",
]
MACROS = ["VPCE_SIMD", "VPCE_SIMD_LINE", "VPCE_PRAGMA"]


def headers(cmd, src, cwd):
    r = subprocess.run(cmd + ["-fsyntax-only", "-H", src], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"check_include_graph: {src} does not compile:\n{r.stderr[-4000:]}")
    return [line.lstrip(".").strip() for line in r.stderr.splitlines() if line.startswith(".")]


def macros(cmd, src, cwd):
    r = subprocess.run(cmd + ["-E", "-dM", src], cwd=cwd, capture_output=True, text=True, check=True)
    return {m.group(1) for m in re.finditer(r"^#define (\w+)", r.stdout, re.M)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compile-commands", required=True)
    ap.add_argument("--tu", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    args, cwd = compile_command(a.compile_commands, a.tu)
    cmd = without_source_and_output(args, a.tu)
    os.makedirs(a.workdir, exist_ok=True)
    errors = []
    seen = headers(cmd, os.path.realpath(a.tu), cwd)
    for h in seen:
        if any(re.search(p, h) for p in FORBIDDEN):
            errors.append(f"  <vpce/vpce.hpp> reaches {h}")
    defined = macros(cmd, os.path.realpath(a.tu), cwd)
    errors += [f"  <vpce/vpce.hpp> defines {m}" for m in MACROS if m in defined]
    control = os.path.join(a.workdir, "definitions_user.cpp")
    with open(control, "w") as f:
        f.write('#include <vpce/definitions.hpp>\n')
    if not any(re.search(r"vpce/impl/kernels\.hpp", h) for h in headers(cmd, control, cwd)):
        errors.append("  the control (<vpce/definitions.hpp>) was not seen to reach vpce/impl/kernels.hpp: "
                      "the reading of -H cannot be trusted")
    vpce_headers = sorted({r for r in (h.split("/include/")[-1] for h in seen) if r.startswith("vpce/")})
    print(f"[include graph] <vpce/vpce.hpp>: {len(seen)} headers, vpce's: {', '.join(vpce_headers)}")
    if errors:
        print("[include graph] FAILED:\n" + "\n".join(errors))
        return 1
    print("[include graph] ok: no kernel, definition or SIMD header")
    return 0


if __name__ == "__main__":
    sys.exit(main())
