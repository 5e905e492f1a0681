"""The compile command of one translation unit, from CMake's compile_commands.json (used by the lint tests
that compile something with the flags a real target gets: vectorization/, include_graph/)."""
import json
import os
import shlex
import sys


def compile_command(compile_commands, tu):
    """(arguments, directory) of `tu`'s entry; exits with a message if it has none."""
    with open(compile_commands) as f:
        entries = json.load(f)
    for e in entries:
        if os.path.realpath(e["file"]) == os.path.realpath(tu):
            args = e.get("arguments") or shlex.split(e["command"])
            return args, e["directory"]
    sys.exit(f"{os.path.basename(sys.argv[0])}: {tu} is not in {compile_commands}")


def without_source_and_output(args, tu):
    """A compile command's arguments without `-c`, `-o FILE` and the source file itself."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c"):
            skip = a == "-o"
            continue
        if os.path.basename(a) == os.path.basename(tu):
            continue
        out.append(a)
    return out
