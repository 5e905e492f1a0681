"""clang-tidy over the translation units of compile_commands.json whose path matches a regular expression (the
vpce_clang_tidy test), with an optional cache of clean results: a unit is skipped when clang-tidy, the
.clang-tidy file, its flags and its preprocessed text (every header it includes) are those of a run that found
nothing. The source and build folders' paths are taken out of what is hashed, so clones in other folders share
it. Warnings are printed and fail the run; nothing is cached for a unit that had any.

  clang_tidy.py --source SOURCE --build BUILD --clang-tidy clang-tidy-14 [--cache DIR] [--jobs N] REGEX
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_db import without_source_and_output  # noqa: E402


def key(args, tu, directory, clang_tidy_id, source, build):
    """The cache key of one unit, or None when it cannot be preprocessed (then it is simply run)."""
    pre = subprocess.run(without_source_and_output(args, tu) + ["-E", "-P", tu], cwd=directory,
                         capture_output=True)
    if pre.returncode != 0:
        return None
    h = hashlib.sha256(clang_tidy_id)
    for text in [" ".join(without_source_and_output(args, tu)).encode(), os.path.relpath(tu, source).encode(),
                 pre.stdout]:
        h.update(text.replace(build.encode(), b"@BUILD@").replace(source.encode(), b"@SOURCE@"))
        h.update(b"\0")
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--clang-tidy", required=True)
    ap.add_argument("--cache")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("regex")
    a = ap.parse_args()
    source, build = os.path.realpath(a.source), os.path.realpath(a.build)
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    units = sorted({(os.path.realpath(e["file"]), e["directory"], tuple(e.get("arguments") or shlex.split(e["command"])))
                    for e in entries if re.search(a.regex, os.path.realpath(e["file"]))})
    if not units:
        sys.exit(f"clang_tidy.py: no translation unit matches {a.regex}")
    with open(os.path.join(source, ".clang-tidy"), "rb") as f:
        clang_tidy_id = subprocess.run([a.clang_tidy, "--version"], capture_output=True).stdout + f.read()
    if a.cache:
        os.makedirs(a.cache, exist_ok=True)

    def one(unit):
        tu, directory, args = unit
        k = key(list(args), tu, directory, clang_tidy_id, source, build) if a.cache else None
        stamp = os.path.join(a.cache, k) if k else None
        if stamp and os.path.exists(stamp):
            return tu, True, "", True
        r = subprocess.run([a.clang_tidy, "-p", build, "--quiet", tu], capture_output=True, text=True)
        clean = r.returncode == 0 and "warning:" not in r.stdout and "error:" not in r.stdout
        if clean and stamp:
            open(stamp, "w").close()
        return tu, clean, r.stdout + ("" if clean else r.stderr), False

    failed, cached = [], 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        for tu, clean, out, hit in pool.map(one, units):
            cached += hit
            print(f"{'cached ' if hit else ''}{'clean' if clean else 'WARNINGS'}: {os.path.relpath(tu, source)}")
            if not clean:
                failed.append(tu)
                print(out)
    print(f"clang-tidy: {len(units)} translation units, {cached} clean in the cache, {len(failed)} with warnings")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
