#!/usr/bin/env python3
"""End-to-end tests of the `vpce` command-line tool (run by CTest; needs h5py and numpy).

Suites:
  loss      small HDF5 inputs (float32, float64), `vpce loss` with every strategy and mode, even and uneven
            partitions (some with 0 columns on a rank), checked against a numpy float64 reference
  options   the training options (--ignore-index, --reduction, --label-smoothing, --z-loss, --logit-scale,
            --softcap), alone and combined, for every strategy and mode (all of them at 2 ranks), --lse,
            --grad-dtype, bfloat16/float16 logits, all-ignored batches, against a numpy float64 reference of
            docs/design.md, section 1 (reference_options); uneven partitions at 2 and 3 ranks
  errors    bad arguments, bad files (not HDF5, cut short, a FIFO, wrong datasets, shapes, types, absurd sizes),
            unwritable outputs, a full disk (a file-size limit; a small tmpfs where mount is allowed): the same
            non-zero exit on every rank within ERROR_TIME, one `vpce:` line naming the problem, no output file
            (and an existing one untouched), no temporary file left
  faults    a rank killed at each phase (the hidden switch VPCE_TOOL_FAULT=kill:<rank>:<phase>), a write that
            fails on one rank only: mpiexec exits non-zero within FAULT_TIMEOUT, no output, no temporary file
  commands  --help, --version, `vpce bench` (table and JSON), `vpce demo`
  linear    `vpce linear` (LinearCrossEntropy): loss and both gradients against the float64 reference of the logits
            hidden @ weight.T with every option, chunk sizes and partitions; its bad inputs; a killed rank

Every run goes through a tiny shell wrapper that appends each rank's exit status to a file, so the test
sees every rank's status (and that every rank exited) rather than only mpiexec's.
"""

import argparse
import glob
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

RUN_TIMEOUT = 90  # seconds per mpiexec run: a hang is a failure, not a stuck CTest


class Failure(Exception):
    pass


class Result:
    def __init__(self, statuses, stdout, stderr, argv, elapsed=0.0, returncode=None):
        self.statuses = statuses
        self.stdout = stdout
        self.stderr = stderr
        self.argv = argv
        self.elapsed = elapsed
        self.returncode = returncode  # mpiexec's

    def vpce_lines(self):
        return [l for l in self.stderr.splitlines() if l.startswith("vpce:")]

    def describe(self):
        return ("command: %s\nstatuses: %s, mpiexec's: %s, %.1f s\n--- stdout ---\n%s\n--- stderr ---\n%s" %
                (" ".join(shlex.quote(a) for a in self.argv), self.statuses, self.returncode, self.elapsed,
                 self.stdout, self.stderr))


class Runner:
    def __init__(self, opts):
        self.vpce = opts.vpce
        self.mpiexec = opts.mpiexec
        self.np_flag = opts.numproc_flag
        self.preflags = opts.preflag or []
        self.np = opts.np
        self.workdir = opts.workdir
        self.count = 0
        self.linear = opts.linear == "yes"

    def run(self, args, env=None, launcher=(), wrapped=True, timeout=RUN_TIMEOUT):
        """Runs vpce ARGS on np ranks. `launcher`: words before the program on each rank (e.g. prlimit). Wrapped:
        every rank's exit status is collected (and required); not wrapped (a job whose ranks get killed), only
        mpiexec's own status is."""
        self.count += 1
        status_file = os.path.join(self.workdir, "status.%d" % self.count)
        if os.path.exists(status_file):
            os.remove(status_file)
        if wrapped:
            wrapper = '"$0" "$@"; echo $? >> %s' % shlex.quote(status_file)
            program = ["/bin/sh", "-c", wrapper] + list(launcher) + [self.vpce]
        else:
            program = list(launcher) + [self.vpce]
        argv = [self.mpiexec, self.np_flag, str(self.np)] + self.preflags + program + [str(a) for a in args]
        full_env = dict(os.environ)
        full_env.update(env or {})
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.workdir,
                                env=full_env, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise Failure("timed out after %d s (a hang?)\n%s" %
                          (timeout, Result([], out, err, argv, time.monotonic() - start).describe()))
        elapsed = time.monotonic() - start
        statuses = []
        if os.path.exists(status_file):
            with open(status_file) as f:
                statuses = sorted(int(l) for l in f.read().split())
            os.remove(status_file)
        res = Result(statuses, out, err, argv, elapsed, proc.returncode)
        if wrapped and len(statuses) != self.np:
            raise Failure("%d of %d ranks reported an exit status\n%s" % (len(statuses), self.np, res.describe()))
        return res


# ----------------------------------------------------------------------------------------------- inputs

def write_input(path, logits=None, targets=None, **extra):
    with h5py.File(path, "w") as f:
        if logits is not None:
            f["logits"] = logits
        if targets is not None:
            f["targets"] = targets
        for name, value in extra.items():
            f[name] = value


def make_case(n, v, dtype, seed, special=True):
    """Random logits with the awkward cases: one huge logit, a row whose first columns are all -inf (a whole
    rank's slice with some partitions), a row shifted far down."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 3.0, size=(n, v))
    t = rng.integers(0, v, size=n).astype(np.int64)
    if special and n >= 4 and v >= 12:
        x[1, 5] = 40.0
        x[2, :10] = -np.inf
        t[2] = v - 1
        x[3, :] -= 60.0
    return x.astype(dtype), t


def reference(x, t):
    """float64 loss, gradient and log-sum-exp per row."""
    x = x.astype(np.float64)
    n = x.shape[0]
    m = np.max(x, axis=1, keepdims=True) if x.size else np.zeros((n, 1))
    e = np.exp(x - m)
    s = e.sum(axis=1, keepdims=True)
    lse = (m + np.log(s))[:, 0]
    loss = lse - x[np.arange(n), t]
    grad = e / s
    grad[np.arange(n), t] -= 1.0
    return loss, grad, lse


def tolerance(dtype, v):
    """Largest error allowed, relative to max(1, |lse|) of the row (the loss is lse minus a logit; the gradient's
    largest entries are probabilities times exp of lse's error): rounding of a sum of V exponentials grows like
    sqrt(V) ulps; the order of summation differs between the strategies and numpy."""
    eps = np.finfo(dtype).eps
    return eps * (4.0 * np.sqrt(v) + 16.0)


def leftovers(directory, output):
    base = os.path.basename(output)
    return [p for p in os.listdir(directory) if p.startswith(base + ".tmp.")]


# ---------------------------------------------------------------------------------------------- suites

def suite_loss(r):
    n, v = 7, 23
    checks = 0

    def run_and_check(name, x, t, extra, grad=True, env=None, chunked=False):
        nonlocal checks
        inp = os.path.join(r.workdir, "in_%s.h5" % name)
        out = os.path.join(r.workdir, "out_%s.h5" % name)
        if chunked:  # big-endian, chunked and compressed: HDF5 converts and decompresses on the way in
            with h5py.File(inp, "w") as f:
                f.create_dataset("logits", data=x.astype(x.dtype.newbyteorder(">")), chunks=(3, 5),
                                 compression="gzip")
                f.create_dataset("targets", data=t.astype(">i8"))
        else:
            write_input(inp, x, t)
        if os.path.exists(out):
            os.remove(out)
        res = r.run(["loss", "--input", inp, "--output", out, "--quiet"] + (["--grad"] if grad else []) + extra,
                    env=env)
        if res.statuses != [0] * r.np or res.vpce_lines():
            raise Failure("%s: expected success\n%s" % (name, res.describe()))
        if leftovers(r.workdir, out):
            raise Failure("%s: temporary files left: %s" % (name, leftovers(r.workdir, out)))
        want_loss, want_grad, lse = reference(x, t)
        tol = tolerance(x.dtype, x.shape[1])
        scale = np.maximum(1.0, np.abs(lse))
        with h5py.File(out, "r") as f:
            loss = f["loss"]
            if loss.dtype != x.dtype or loss.shape != (x.shape[0],):
                raise Failure("%s: /loss is %s %s, expected %s %s" % (name, loss.dtype, loss.shape, x.dtype,
                                                                       (x.shape[0],)))
            got = loss[...].astype(np.float64)
            err = np.max(np.abs(got - want_loss) / scale, initial=0.0)
            if not np.all(np.isfinite(got)) or err > tol:
                raise Failure("%s: /loss differs from the float64 reference by %.3g relative to max(1, |lse|) "
                              "(tolerance %.2g)\ngot  %s\nwant %s" % (name, err, tol, got, want_loss))
            if grad:
                g = f["grad_logits"]
                if g.dtype != x.dtype or g.shape != x.shape:
                    raise Failure("%s: /grad_logits is %s %s, expected %s %s" % (name, g.dtype, g.shape, x.dtype,
                                                                                 x.shape))
                got = g[...].astype(np.float64)
                err = np.max(np.abs(got - want_grad) / scale[:, None], initial=0.0)
                if not np.all(np.isfinite(got)) or err > tol:
                    raise Failure("%s: /grad_logits differs from the float64 reference by %.3g relative to "
                                  "max(1, |lse|) (tolerance %.2g)" % (name, err, tol))
            elif "grad_logits" in f:
                raise Failure("%s: /grad_logits written without --grad" % name)
        checks += 1

    partitions = {1: ["23"], 2: ["20,3", "0,23"], 3: ["10,0,13", "0,23,0"]}.get(r.np, [])
    x32, t32 = make_case(n, v, "float32", 1)
    x64, t64 = make_case(n, v, "float64", 2)
    # Every strategy and mode in float32; two in float64; the uneven partitions (with a rank of 0 columns).
    for strategy in ("fused", "seed"):
        for mode in ("fused", "stash", "recompute"):
            run_and_check("float32_%s_%s" % (strategy, mode), x32, t32, ["--strategy", strategy, "--mode", mode])
    run_and_check("float64_fused_fused", x64, t64, ["--strategy", "fused", "--mode", "fused"])
    run_and_check("float64_seed_recompute", x64, t64, ["--strategy", "seed", "--mode", "recompute"])
    for k, part in enumerate(partitions):
        if k == 0:
            run_and_check("float32_part0_seed_stash", x32, t32, ["--partition", part, "--strategy", "seed",
                                                                  "--mode", "stash"])
            run_and_check("float64_part0_fused_fused", x64, t64, ["--partition", part])
        else:
            run_and_check("float64_part%d_fused_recompute" % k, x64, t64, ["--partition", part, "--mode",
                                                                            "recompute"])
    # The loss alone (no /grad_logits written).
    x, t = make_case(n, v, "float32", 3)
    run_and_check("loss_only_seed_stash", x, t, ["--strategy", "seed", "--mode", "stash"], grad=False)
    # Tiny transfers: many collective blocks per dataset (uneven partition, so ranks differ in width).
    run_and_check("blocked_io", x, t, ["--partition", partitions[-1]] if partitions else [],
                  env={"VPCE_IO_BLOCK_BYTES": "24"})
    # A vocabulary smaller than the number of ranks (even partition: some ranks own 0 columns).
    xs, ts = make_case(5, max(1, r.np - 1), "float64", 4, special=False)
    run_and_check("tiny_vocab", xs, ts, [])
    # No tokens at all.
    x0 = np.zeros((0, v), dtype=np.float32)
    run_and_check("zero_tokens", x0, np.zeros((0,), dtype=np.int64), [])
    # Other integer types for the targets are converted to int64.
    x, t = make_case(n, v, "float64", 5)
    run_and_check("int32_targets", x, t.astype(np.int32), ["--strategy", "seed"])
    run_and_check("chunked_big_endian", x, t, ["--partition", partitions[0]] if partitions else [], chunked=True)
    # Paths of more than 245 characters (Open MPI 4.1's OMPIO aborted on them; the tool selects the sharedfp
    # component that does not).
    deep = os.path.join(r.workdir, *(c * 100 for c in "def"))
    os.makedirs(deep, exist_ok=True)
    long_in = os.path.join(deep, "in_long.h5")
    long_out = os.path.join(deep, "out_long.h5")
    write_input(long_in, x, t)
    res = r.run(["loss", "--input", long_in, "--output", long_out, "--grad", "--quiet"])
    if res.statuses != [0] * r.np or res.vpce_lines() or not os.path.exists(long_out) or leftovers(deep, long_out):
        raise Failure("long_paths (%d characters): expected success\n%s" % (len(long_out), res.describe()))
    with h5py.File(long_out, "r") as f:
        got = f["loss"][...].astype(np.float64)
    want, _, lse = reference(x, t)
    if np.max(np.abs(got - want) / np.maximum(1.0, np.abs(lse))) > tolerance(x.dtype, x.shape[1]):
        raise Failure("long_paths: wrong loss %s, want %s" % (got, want))
    checks += 1
    # Defaults (no --strategy, --mode), replacing an existing output.
    out = os.path.join(r.workdir, "out_defaults.h5")
    with open(out, "w") as f:
        f.write("old")
    run_and_check("defaults", x, t, [])
    print("loss: %d runs checked against the float64 reference at %d rank(s)" % (checks, r.np))


# ------------------------------------------------------------------------------- the training options

def bf16_bits(x):
    """bfloat16 bits of x: the top 16 bits of float32 after rounding to nearest even (no NaN here)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def to_16bit(x, kind):
    """(bits as uint16, the float64 values those bits hold) for kind bfloat16 or float16."""
    if kind == "bfloat16":
        bits = bf16_bits(x)
        return bits, bf16_values(bits).astype(np.float64)
    h = np.asarray(x, dtype=np.float64).astype(np.float16)
    return h.view(np.uint16), h.astype(np.float64)


def from_16bit(bits, kind):
    return (bf16_values(bits) if kind == "bfloat16" else bits.view(np.float16)).astype(np.float64)


def round_16bit(x, kind):
    """x rounded to the 16-bit type (as float64) and one ulp of the rounded value."""
    if kind == "bfloat16":
        r = bf16_values(bf16_bits(np.asarray(x, dtype=np.float32)))
        return r.astype(np.float64), np.spacing(np.abs(r)).astype(np.float64) * 65536.0
    r = np.asarray(x, dtype=np.float64).astype(np.float16)
    return r.astype(np.float64), np.spacing(np.abs(r)).astype(np.float64)


class Opts:
    """The maths options of `vpce loss`, with their command-line form."""

    def __init__(self, ignore_index=-100, reduction="none", label_smoothing=0.0, z_loss=0.0, logit_scale=1.0,
                 softcap=0.0, entropy_weight=0.0, flags=None):
        self.ignore_index = ignore_index
        self.b = entropy_weight
        self.reduction = reduction
        self.a = label_smoothing
        self.z = z_loss
        self.scale = logit_scale
        self.cap = softcap
        self.flags = flags  # the command line, or None: every non-default value

    def args(self):
        if self.flags is not None:
            return list(self.flags)
        out = []
        if self.ignore_index != -100:
            out += ["--ignore-index", str(self.ignore_index)]
        if self.reduction != "none":
            out += ["--reduction", self.reduction]
        for flag, value, default in (("--label-smoothing", self.a, 0.0), ("--z-loss", self.z, 0.0),
                                     ("--logit-scale", self.scale, 1.0), ("--softcap", self.cap, 0.0),
                                     ("--entropy-weight", self.b, 0.0)):
            if value != default:
                out += [flag, repr(value)]
        return out


def reference_probs(z, q, o, w=None):
    """Probability targets q (n x v), PyTorch's definition: c = w ((1 - a) q + a / V), loss = sum_j c_j (lse - x_j)
    + z lse^2 + b H, gradient (p (sum c + 2 z lse + b (mu - x)) - c) dx/dz; the mean divides by N. Returns what
    reference_options() does (every row valid)."""
    z = np.asarray(z, dtype=np.float64)
    n, v = z.shape
    x = o.scale * z
    dxdz = np.full_like(x, o.scale)
    if o.cap > 0:
        x = o.cap * np.tanh(x / o.cap)
        dxdz = o.scale * (1.0 - (x / o.cap) ** 2)
    m = np.max(x, axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    p = np.exp(x - lse[:, None])
    mu = (p * x).sum(axis=1)
    entropy = lse - mu
    c = (np.ones(v) if w is None else w)[None, :] * ((1 - o.a) * q + o.a / v)
    loss = (c * (lse[:, None] - x)).sum(axis=1) + o.z * lse ** 2 + o.b * entropy
    g = (1.0 / n if n else 0.0) if o.reduction == "mean" else 1.0
    grad = (p * (c.sum(axis=1)[:, None] + 2 * o.z * lse[:, None] + o.b * (mu[:, None] - x)) - c) * dxdz * g
    total = float(np.sum(loss))
    reduced = total / n if (o.reduction == "mean" and n) else total
    outputs = {"entropy": entropy, "z_loss": o.z * lse ** 2}
    return loss, grad, lse, reduced, np.ones(n, dtype=bool), g, outputs


def reference_options(z, t, o, w=None):
    """docs/design.md, section 1 in float64: per-row loss (0 for ignored rows), gradient of the reduced loss (of the
    sum of the per-token losses for 'none'), lse per row, reduced loss, number of rows not ignored, g, and the
    per-row outputs {"entropy", "logprob", "z_loss"}. w: class weights (PyTorch's definition), or None."""
    z = np.asarray(z, dtype=np.float64)
    n, v = z.shape
    masked = np.isneginf(z)
    x = o.scale * z
    if o.cap > 0:
        x = o.cap * np.tanh(x / o.cap)
        x[masked] = -np.inf  # a -inf logit stays -inf
        with np.errstate(invalid="ignore"):
            dxdz = o.scale * (1.0 - (x / o.cap) ** 2)
        dxdz[masked] = 0.0
    else:
        dxdz = np.full_like(x, o.scale)
    valid = t != o.ignore_index
    n_valid = int(np.count_nonzero(valid))
    rows = np.arange(n)
    tt = np.where(valid, t, 0)
    if n:
        m = np.max(x, axis=1, keepdims=True)
        e = np.exp(x - m)
        lse = m[:, 0] + np.log(e.sum(axis=1))
        p = np.exp(x - lse[:, None])
        px = np.where(p > 0, p * np.where(np.isneginf(x), 0.0, x), 0.0)  # a -inf logit adds nothing
        mu = px.sum(axis=1)
        entropy = lse - mu
        if w is None:
            loss = lse - (1 - o.a) * x[rows, tt] + o.z * lse ** 2 + o.b * entropy
            if o.a > 0:
                loss = loss - o.a * np.mean(x, axis=1)
        else:
            w_t = w[tt]
            loss = (1 - o.a) * w_t * (lse - x[rows, tt]) + o.z * lse ** 2 + o.b * entropy
            if o.a > 0:
                loss = loss + o.a / v * (np.sum(w) * lse - np.sum(w * x, axis=1))
    else:
        lse = np.zeros(0)
        p = np.zeros((0, v))
        mu = entropy = np.zeros(0)
        loss = np.zeros(0)
    loss = np.where(valid, loss, 0.0)
    outputs = {"entropy": entropy, "logprob": np.where(valid, x[rows, tt] - lse if n else 0.0, 0.0),
               "z_loss": np.where(valid, o.z * lse ** 2, 0.0)}
    w_t = np.ones(n) if w is None else w[tt]
    divisor = float(np.sum(np.where(valid, w_t, 0.0)))
    g = (1.0 / divisor if divisor > 0 else 0.0) if o.reduction == "mean" else 1.0
    if w is None:
        coef = p * (1 + 2 * o.z * lse[:, None]) - o.a / v
    else:
        c_lse = (1 - o.a) * w_t + o.a * np.sum(w) / v
        coef = p * (c_lse[:, None] + 2 * o.z * lse[:, None]) - o.a * w[None, :] / v
    if o.b != 0:
        with np.errstate(invalid="ignore"):
            coef = coef + np.where(p > 0, p * o.b * (mu[:, None] - x), 0.0)
    coef[rows, tt] -= (1 - o.a) * w_t
    grad = coef * dxdz * g
    grad[~valid] = 0.0
    total = float(np.sum(loss))
    reduced = total / divisor if (o.reduction == "mean" and divisor > 0) else (0.0 if o.reduction == "mean" else total)
    return loss, grad, lse, reduced, valid, g, outputs


def suite_options(r):
    """--ignore-index, --reduction, --label-smoothing, --z-loss, --logit-scale, --softcap, --lse, --grad-dtype and
    16-bit (bfloat16, float16) logits, checked against reference_options()."""
    w = r.workdir
    n, v = 9, 23
    checks = [0]
    all_modes = [(s, m) for s in ("fused", "seed") for m in ("fused", "stash", "recompute")]
    partitions = {1: [None], 2: ["20,3", None, "0,23"], 3: ["10,0,13", None, "0,23,0"]}[r.np]
    part_counter = [0]

    def next_partition():
        part = partitions[part_counter[0] % len(partitions)]
        part_counter[0] += 1
        return ["--partition", part] if part else []

    def run_case(name, values, t, o, kind="float32", file_bits=None, strategy="fused", mode="fused", grad=True,
                 lse=False, grad_dtype=None, byteorder="<", extra_args=(), outputs=(), weights=None, probs=None):
        """values: the float64 logits the tool sees (for 16-bit: the values of file_bits); outputs: of "entropy",
        "logprob", "z_loss" (--entropy, --logprob, --z-loss-out)."""
        inp = os.path.join(w, "in_%s.h5" % name)
        out = os.path.join(w, "out_%s.h5" % name)
        with h5py.File(inp, "w") as f:
            if kind in ("bfloat16", "float16"):
                d = f.create_dataset("logits", data=file_bits.astype(byteorder + "u2"))
                d.attrs["dtype"] = kind
            else:
                f.create_dataset("logits", data=values.astype(np.dtype(kind).newbyteorder(byteorder)))
            if probs is None:
                f["targets"] = t.astype(np.int64)
            else:
                f.create_dataset("target_probs", data=probs.astype(np.dtype(kind).newbyteorder(byteorder)))
            if weights is not None:
                f["weights"] = weights
        if os.path.exists(out):
            os.remove(out)
        args = (["loss", "--input", inp, "--output", out, "--quiet", "--strategy", strategy, "--mode", mode] +
                next_partition() + o.args() + (["--grad"] if grad else []) + (["--lse"] if lse else []) +
                (["--grad-dtype", grad_dtype] if grad_dtype else []) + list(extra_args) +
                [{"entropy": "--entropy", "logprob": "--logprob", "z_loss": "--z-loss-out"}[k] for k in outputs])
        res = r.run(args)
        if res.statuses != [0] * r.np or res.vpce_lines():
            raise Failure("%s: expected success\n%s" % (name, res.describe()))
        if leftovers(w, out):
            raise Failure("%s: temporary files left" % name)
        w64 = None if weights is None else weights.astype(np.float64)
        if probs is None:
            want_loss, want_grad, want_lse, want_reduced, valid, g, want_out = reference_options(values, t, o, w64)
        else:
            want_loss, want_grad, want_lse, want_reduced, valid, g, want_out = reference_probs(
                values, probs.astype(np.dtype(kind)).astype(np.float64), o, w64)
        half = kind in ("bfloat16", "float16")
        out_dtype = np.dtype("float64" if kind == "float64" else "float32")
        eps = np.finfo(out_dtype).eps
        tol = eps * (4.0 * np.sqrt(v) + 16.0)
        # Errors are relative to the size of what the row's loss and gradient are made of.
        row_scale = (np.maximum(1.0, np.abs(want_lse)) * (1 + 2 * o.z * np.abs(want_lse)) * max(1.0, o.scale) *
                     (1 + abs(o.b)) * (1.0 if weights is None else 1.0 + float(np.max(weights))))
        problems = []

        def compare(what, got, want, allowed):
            if got.shape != want.shape:
                problems.append("%s has shape %s, expected %s" % (what, got.shape, want.shape))
                return
            fin = np.isfinite(want)
            if not np.array_equal(np.isfinite(got), fin) or np.any(got[~fin] != want[~fin]):
                problems.append("%s: non-finite entries differ\ngot  %s\nwant %s" % (what, got, want))
                return
            excess = np.abs(got[fin] - want[fin]) - np.broadcast_to(allowed, want.shape)[fin]
            if excess.size and np.max(excess) > 0:
                k = int(np.argmax(excess))
                problems.append("%s differs from the float64 reference by up to %.3g more than allowed (entry %d "
                                "of the finite ones: got %.9g, want %.9g)" %
                                (what, np.max(excess), k, got[fin][k], want[fin][k]))

        with h5py.File(out, "r") as f:
            names = set(f.keys())
            expect_names = ({"loss"} | ({"grad_logits"} if grad else set()) | ({"lse"} if lse else set()) |
                            set(outputs))
            if names != expect_names:
                raise Failure("%s: datasets %s, expected %s" % (name, sorted(names), sorted(expect_names)))
            got = f["loss"]
            if got.dtype != out_dtype:
                problems.append("/loss is %s, expected %s" % (got.dtype, out_dtype))
            got = got[...].astype(np.float64)
            if o.reduction == "none":
                compare("/loss", got, want_loss, tol * row_scale)
                if np.any(got[~valid] != 0):
                    problems.append("/loss is not 0 on ignored rows")
            else:
                allowed = tol * np.sum(row_scale[valid]) * (g if o.reduction == "mean" else 1.0) + 1e-300
                compare("/loss (%s)" % o.reduction, got, np.array([want_reduced]), allowed)
            if lse:
                got = f["lse"]
                if got.dtype != out_dtype:
                    problems.append("/lse is %s, expected %s" % (got.dtype, out_dtype))
                compare("/lse", got[...].astype(np.float64), want_lse, tol * np.maximum(1.0, np.abs(want_lse)))
            for k in outputs:
                got = f[k]
                if got.dtype != out_dtype:
                    problems.append("/%s is %s, expected %s" % (k, got.dtype, out_dtype))
                compare("/" + k, got[...].astype(np.float64), want_out[k], tol * row_scale)
            if grad:
                d = f["grad_logits"]
                allowed = tol * row_scale[:, None] * g
                if grad_dtype == "logits" and half:
                    attr = d.attrs.get("dtype")
                    attr = attr.decode() if isinstance(attr, bytes) else attr
                    if d.dtype != np.uint16 or attr != kind:
                        problems.append("/grad_logits is %s with dtype attribute %r, expected uint16 with %r" %
                                        (d.dtype, attr, kind))
                    got = from_16bit(d[...], kind)
                    # Computed in float32, rounded once to 16 bits: within one 16-bit ulp of the reference
                    # rounded (plus the float32 computation's own error, for the cancelling target column).
                    want16, ulp = round_16bit(want_grad, kind)
                    compare("/grad_logits (%s)" % kind, got, want16, ulp + allowed)
                else:
                    want_dtype = np.dtype(kind if grad_dtype == "logits" else
                                          "float32" if grad_dtype == "float32" else out_dtype)
                    if d.dtype != want_dtype:
                        problems.append("/grad_logits is %s, expected %s" % (d.dtype, want_dtype))
                    if want_dtype == np.float32 and out_dtype == np.float64:
                        allowed = allowed + np.finfo(np.float32).eps * np.abs(want_grad)  # rounded on the way out
                    got = d[...].astype(np.float64)
                    compare("/grad_logits", got, want_grad, allowed)
                if got.shape == want_grad.shape and np.any(got[~valid] != 0):
                    problems.append("/grad_logits is not 0 on ignored rows")
        if problems:
            raise Failure("%s: %s\n%s" % (name, "\n".join(problems), res.describe()))
        checks[0] += 1

    # Logits with the awkward rows of make_case (a -inf block, a huge logit, a row far down), as float64 values
    # exactly representable in float32. Label smoothing averages the -inf entries too (an infinite loss): its
    # cases use `plain`, where they are -30.
    x32, t = make_case(n, v, "float32", 11)
    masked = x32.astype(np.float64)
    plain = np.where(np.isneginf(masked), -30.0, masked)
    t_ign = t.copy()
    t_ign[[0, 6]] = 5  # targets equal to --ignore-index 5 (a valid column id: still ignored)
    t_neg = t.copy()
    t_neg[[0, 4, 6]] = -1
    t_def = t.copy()
    t_def[[3, 7]] = -100  # PyTorch's default ignore index, no flag needed

    singles = [
        ("ignore", Opts(ignore_index=5), t_ign, masked),
        ("sum", Opts(reduction="sum"), t_def, masked),
        ("mean", Opts(reduction="mean"), t_def, masked),
        ("smoothing", Opts(label_smoothing=0.1), t, plain),
        ("zloss", Opts(z_loss=0.01), t, masked),
        ("scale", Opts(logit_scale=0.37), t, masked),
        ("softcap", Opts(softcap=5.0), t, masked),  # caps the 40 and the -60s; -inf stays -inf
        ("entropy_bonus", Opts(entropy_weight=-0.3), t, masked),
    ]
    combos = [
        ("comboA", Opts(ignore_index=-1, reduction="mean", label_smoothing=0.2, z_loss=0.01, logit_scale=1.7,
                        softcap=8.0), t_neg, plain),
        ("comboB", Opts(reduction="sum", z_loss=1e-3, logit_scale=0.8, softcap=12.0, entropy_weight=0.05), t_def,
         masked),
    ]
    # Each option alone for every strategy x mode at 2 ranks, and once (strategy and mode rotating) at 3 ranks.
    # One combination per strategy x mode at each number of ranks (alternating: at 2 ranks the other one).
    k = 0
    for label, o, tt, values in singles:
        modes = all_modes if r.np == 2 else [all_modes[(k + r.np) % 6]] if r.np == 3 else []
        for strategy, mode in modes:
            run_case("%s_%s_%s" % (label, strategy, mode), values, tt, o, strategy=strategy, mode=mode,
                     lse=(k % 2 == 0), outputs=[("entropy", "logprob", "z_loss")[k % 3]] if k % 2 else ())
            k += 1
    for j, (strategy, mode) in enumerate(all_modes):
        for c, (label, o, tt, values) in enumerate(combos):
            if (c + j + (r.np == 2)) % 2 == 0:
                run_case("%s_%s_%s" % (label, strategy, mode), values, tt, o, strategy=strategy, mode=mode,
                         lse=True, grad_dtype="logits" if c else None, outputs=("entropy", "logprob", "z_loss"))
    # Class weights (/weights, PyTorch's `weight`, some 0): alone (float64 weights), and with smoothing, ignored
    # rows and the mean (float32 weights), rotating strategy x mode; the mean divides by the targets' weights.
    wts = np.random.RandomState(5).uniform(0.0, 2.0, v)
    wts[::7] = 0.0
    for j, (strategy, mode) in enumerate(all_modes):
        if (j + r.np) % 3 == 0:
            run_case("weights_%s_%s" % (strategy, mode), masked, t_def, Opts(), strategy=strategy, mode=mode,
                     weights=wts)
        elif (j + r.np) % 3 == 1:
            run_case("weights_combo_%s_%s" % (strategy, mode), plain, t_neg,
                     Opts(ignore_index=-1, reduction="mean", label_smoothing=0.1, z_loss=1e-3, entropy_weight=0.1),
                     strategy=strategy, mode=mode, weights=wts.astype(np.float32), lse=True)

    # Probability targets (/target_probs instead of /targets): alone, and with smoothing, class weights, the
    # mean (over N), the z-loss and an entropy weight, rotating strategy x mode; float64 at 2 ranks.
    rs = np.random.RandomState(8)
    soft = rs.uniform(0.0, 1.0, (n, v)) * (rs.uniform(0.0, 1.0, (n, v)) < 0.3)
    soft[:, 0] += 0.5
    soft /= soft.sum(axis=1, keepdims=True)
    for j, (strategy, mode) in enumerate(all_modes):
        if (j + r.np) % 3 == 0:
            run_case("probs_%s_%s" % (strategy, mode), plain, t, Opts(), strategy=strategy, mode=mode, probs=soft,
                     outputs=("entropy",), lse=True)
        elif (j + r.np) % 3 == 1:
            run_case("probs_combo_%s_%s" % (strategy, mode), plain, t,
                     Opts(reduction="mean", label_smoothing=0.1, z_loss=1e-3, entropy_weight=0.1, softcap=9.0),
                     strategy=strategy, mode=mode, probs=soft, weights=wts, outputs=("z_loss",))
    if r.np == 2:
        xp64, tp64 = make_case(n, v, "float64", 13)
        run_case("probs_float64", np.where(np.isneginf(xp64), -30.0, xp64), tp64,
                 Opts(reduction="sum", label_smoothing=0.05), kind="float64", strategy="seed", mode="stash", probs=soft)

    # float64 logits, with options; its gradient as float32 on request (at 2 ranks).
    x64, t64 = make_case(n, v, "float64", 12)
    x64[2, :10] = -25.0
    if r.np == 2:
        run_case("float64_comboA", x64, np.where(np.arange(n) % 4 == 1, -1, t64), combos[0][1], kind="float64",
                 strategy="seed", mode="recompute", lse=True)
        run_case("float64_grad_float32", x64, t64, Opts(z_loss=0.02, softcap=6.0), kind="float64", mode="stash",
                 grad_dtype="float32")

    # 16-bit logits: the reference is computed from the rounded values the file holds. One case per strategy x
    # mode, both types, both gradient types, options, the default ignore index, a big-endian file.
    o16 = Opts(reduction="mean", label_smoothing=0.05, z_loss=1e-3, logit_scale=1.25, softcap=10.0)
    for j, (strategy, mode) in enumerate(all_modes):
        kind = ("bfloat16", "float16")[(j // 2 + r.np) % 2]
        # The gradient in 16 bits for half of the strategy x modes, the other half at the next number of ranks.
        gd = "logits" if (j + r.np) % 2 else (None if j >= 4 else "float32")  # None: the default, float32
        o = o16 if j % 3 != 1 else Opts()
        values = plain if o.a > 0 else masked
        bits, seen = to_16bit(values, kind)
        run_case("%s_%s_%s_%s" % (kind, gd, strategy, mode), seen, t_def, o, kind=kind, file_bits=bits,
                 strategy=strategy, mode=mode, lse=j in (0, 3, 5), grad_dtype=gd,
                 byteorder=">" if j == 4 else "<")

    # Every token ignored: mean gives loss 0 and a zero gradient (no NaN); lse is still written.
    t_all = np.full(n, -100, dtype=np.int64)
    run_case("all_ignored_mean", masked, t_all, Opts(reduction="mean"), strategy="fused", mode="fused", lse=True)
    bits, seen = to_16bit(plain, "bfloat16")
    run_case("all_ignored_mean_bf16", seen, t_all, Opts(reduction="mean", label_smoothing=0.1, z_loss=0.01),
             kind="bfloat16", file_bits=bits, strategy="seed", mode="stash", grad_dtype="logits")
    # The loss alone (forward only) with a reduction and lse; no tokens at all with mean.
    run_case("loss_only_sum", masked, t_def, Opts(reduction="sum", softcap=7.0), strategy="seed", mode="recompute",
             grad=False, lse=True)
    run_case("zero_tokens_mean", np.zeros((0, v)), np.zeros(0, dtype=np.int64), Opts(reduction="mean"), lse=True)
    print("options: %d runs checked against the float64 reference at %d rank(s)" % (checks[0], r.np))


def suite_errors(r):
    w = r.workdir
    n, v = 6, 23
    x, t = make_case(n, v, "float32", 7)
    good = os.path.join(w, "good.h5")
    write_input(good, x, t)
    out = os.path.join(w, "out.h5")
    cases = []  # (name, args, expected substrings, exit status, existing output content or None, env, launcher)

    def add(name, args, expect, status=1, existing=None, parse_only=False, once=False, env=None, launcher=()):
        # Pure command-line errors do not depend on the ranks: run them at 2 ranks only (saves time); `once`: other
        # checks made alike by every rank, also at 2 ranks only.
        if not (parse_only or once) or r.np == 2:
            cases.append((name, args, expect, status, existing, env, launcher))

    def bad_file(name, **datasets):
        path = os.path.join(w, name + ".h5")
        with h5py.File(path, "w") as f:
            for k, val in datasets.items():
                if isinstance(val, str) and val == "group":
                    f.create_group(k)
                else:
                    f[k] = val
        return path

    loss = ["loss", "--output", out, "--grad"]
    # Files and datasets.
    add("missing_input", loss + ["--input", os.path.join(w, "missing.h5")], ["missing.h5", "no such file"])
    text = os.path.join(w, "text.h5")
    with open(text, "w") as f:
        f.write("not hdf5\n")
    add("not_hdf5", loss + ["--input", text], ["text.h5", "not an HDF5 file"])
    add("input_is_folder", loss + ["--input", w], ["is a directory"])
    add("no_logits", loss + ["--input", bad_file("no_logits", targets=t)], ["no_logits.h5", "no dataset /logits"])
    # Class weights: the wrong length, an integer type, a negative weight (the library's check, on every rank).
    add("weights_length", loss + ["--input", bad_file("weights_length", logits=x, targets=t, weights=np.ones(v - 1))],
        ["dataset /weights has shape", "expected %d class weights" % v], once=True)
    add("weights_int", loss + ["--input", bad_file("weights_int", logits=x, targets=t,
                                                   weights=np.ones(v, dtype=np.int32))],
        ["dataset /weights has type int32", "expected float32 or float64"], once=True)
    # Probability targets: a row that does not sum to 1, and both kinds of targets at once.
    half_rows = np.full((n, v), 0.5 / v, dtype=np.float32)
    add("probs_sum", loss + ["--input", bad_file("probs_sum", logits=x, target_probs=half_rows)],
        ["row 0 of the target probabilities sums to 0.5", "expected 1"])
    add("probs_and_targets", loss + ["--input", bad_file("probs_and_targets", logits=x, targets=t,
                                                         target_probs=half_rows * 2)],
        ["both /targets and /target_probs"], once=True)
    neg = np.ones(v)
    neg[v - 1] = -1.0
    add("weights_negative", loss + ["--input", bad_file("weights_negative", logits=x, targets=t, weights=neg)],
        ["class weight -1", "of column %d is negative or not finite" % (v - 1)])
    add("no_targets", loss + ["--input", bad_file("no_targets", logits=x)], ["no_targets.h5", "no dataset /targets"])
    add("logits_group", loss + ["--input", bad_file("logits_group", logits="group", targets=t)],
        ["/logits is not a dataset"])
    add("logits_3d", loss + ["--input", bad_file("logits_3d", logits=x.reshape(n, v, 1), targets=t)],
        ["dataset /logits has shape 6 x 23 x 1 (3 dimensions)", "expected 2 dimensions"])
    add("logits_1d", loss + ["--input", bad_file("logits_1d", logits=x[0], targets=t)],
        ["dataset /logits", "expected 2"])
    add("logits_scalar", loss + ["--input", bad_file("logits_scalar", logits=np.float32(1.0), targets=t)],
        ["dataset /logits is a scalar", "expected 2 dimensions"])
    add("targets_2d", loss + ["--input", bad_file("targets_2d", logits=x, targets=t.reshape(n, 1))],
        ["dataset /targets has shape 6 x 1 (2 dimensions)", "expected 1 dimension"])
    add("logits_int", loss + ["--input", bad_file("logits_int", logits=x.astype(np.int32), targets=t)],
        ["dataset /logits", "int32", "float32 or float64"])
    add("logits_half", loss + ["--input", bad_file("logits_half", logits=x.astype(np.float16), targets=t)],
        ["dataset /logits", "float16", "float32 or float64"])
    add("targets_float", loss + ["--input", bad_file("targets_float", logits=x, targets=t.astype(np.float64))],
        ["dataset /targets", "float64", "int64"])
    add("targets_count", loss + ["--input", bad_file("targets_count", logits=x, targets=t[:5])],
        ["dataset /targets has 5 entries but /logits has 6 rows"])
    add("no_columns", loss + ["--input", bad_file("no_columns", logits=np.zeros((n, 0), np.float32), targets=t)],
        ["dataset /logits", "0 columns"])
    t_high = t.copy()
    t_high[4] = v
    add("target_too_large", loss + ["--input", bad_file("target_high", logits=x, targets=t_high)],
        ["target_high.h5", "/targets", "entry 4 is 23", "[0, 23)"], existing=b"keep me")
    t_neg = t.copy()
    t_neg[0] = -1
    add("target_negative", loss + ["--input", bad_file("target_neg", logits=x, targets=t_neg)],
        ["/targets", "entry 0 is -1"])
    x_nan = x.copy()
    x_nan[3, 20] = np.nan  # on the last rank's columns
    add("nan_logits", loss + ["--input", bad_file("nan_logits", logits=x_nan, targets=t)],
        ["nan_logits.h5", "row 3", "NaN"], existing=b"previous output")
    x_inf = x.astype(np.float64)
    x_inf[1, 0] = np.inf
    add("inf_logits", loss + ["--input", bad_file("inf_logits", logits=x_inf, targets=t), "--strategy", "seed"],
        ["inf_logits.h5", "row 1", "+inf"])
    # 16-bit logits: uint16 bits need a string attribute dtype = "bfloat16" or "float16" (the attribute's other
    # problems are checked at 2 ranks only).
    def uint16_file(name, dtype_attr, data_type="<u2"):
        path = os.path.join(w, name + ".h5")
        with h5py.File(path, "w") as f:
            d = f.create_dataset("logits", data=bf16_bits(x).astype(data_type))
            if dtype_attr is not None:
                d.attrs["dtype"] = dtype_attr
            f["targets"] = t
        return path

    add("uint16_no_dtype", loss + ["--input", uint16_file("uint16_no_dtype", None)],
        ["uint16_no_dtype.h5", "dataset /logits", "no attribute dtype", '"bfloat16" or "float16"'])
    add("uint16_bad_dtype", loss + ["--input", uint16_file("uint16_bad_dtype", "float8")],
        ["dataset /logits", 'attribute dtype is "float8"', '"bfloat16" or "float16"'], once=True)
    add("uint16_dtype_not_string", loss + ["--input", uint16_file("uint16_int_dtype", np.int64(16))],
        ["dataset /logits (uint16): attribute dtype is int64, not a string"], once=True)
    add("int16_with_dtype", loss + ["--input", uint16_file("int16_dtype", "bfloat16", "<i2")],
        ["dataset /logits has type int16", "uint16"], once=True)
    t_ign = t.copy()
    t_ign[2] = -100
    add("target_not_ignore_index", loss + ["--input", bad_file("target_ign", logits=x, targets=t_ign),
                                           "--ignore-index", "0"],
        ["/targets", "entry 2 is -100", "not the --ignore-index (0)"])
    # Options of the loss.
    add("bad_reduction", loss + ["--input", good, "--reduction", "avg"], ["--reduction avg", "none | sum | mean"],
        status=2, parse_only=True)
    add("label_smoothing_range", loss + ["--input", good, "--label-smoothing", "1.5"],
        ["--label-smoothing 1.5: must be in [0, 1]"], status=2, parse_only=True)
    add("softcap_negative", loss + ["--input", good, "--softcap", "-1"], ["--softcap -1: must be", ">= 0"],
        status=2, parse_only=True)
    add("logit_scale_zero", loss + ["--input", good, "--logit-scale=0"], ["--logit-scale 0: must be", "> 0"],
        status=2, parse_only=True)
    add("z_loss_word", loss + ["--input", good, "--z-loss", "big"], ["--z-loss big: not a number"], status=2,
        parse_only=True)
    add("z_loss_inf", loss + ["--input", good, "--z-loss", "inf"], ["--z-loss inf: must be a finite number"],
        status=2, parse_only=True)
    add("entropy_weight_nan", loss + ["--input", good, "--entropy-weight", "nan"],
        ["--entropy-weight nan: must be a finite number"], status=2, parse_only=True)
    add("ignore_index_word", loss + ["--input", good, "--ignore-index", "1.5"], ["--ignore-index 1.5: not an integer"],
        status=2, parse_only=True)
    add("bad_grad_dtype", loss + ["--input", good, "--grad-dtype", "float64"], ["--grad-dtype float64",
                                                                                 "float32 | logits"],
        status=2, parse_only=True)
    add("grad_dtype_without_grad", ["loss", "--input", good, "--output", out, "--grad-dtype", "logits"],
        ["--grad-dtype logits needs --grad"], status=2, parse_only=True)
    # Output.
    add("output_folder_missing", ["loss", "--input", good, "--output", os.path.join(w, "no", "such", "out.h5")],
        ["no/such", "No such file or directory"])
    add("output_is_folder", ["loss", "--input", good, "--output", w], ["it is a folder"])
    if os.geteuid() != 0:
        locked = os.path.join(w, "locked")
        os.makedirs(locked, exist_ok=True)
        os.chmod(locked, 0o555)
        add("output_folder_readonly", ["loss", "--input", good, "--output", os.path.join(locked, "out.h5")],
            ["locked", "Permission denied"])
    elif os.path.isdir("/proc/self"):
        # root may write anywhere except where the file system itself refuses: HDF5's create fails on every rank.
        add("output_not_creatable", ["loss", "--input", good, "--output", "/proc/vpce_tool_test_out.h5"],
            ["/proc/vpce_tool_test_out.h5", "cannot"])
    # Command line.
    add("unknown_option", loss + ["--input", good, "--bogus"], ["unknown option '--bogus'"], status=2, parse_only=True)
    add("missing_value_end", ["loss", "--output", out, "--input"], ["--input needs a value"], status=2, parse_only=True)
    add("missing_value_option", ["loss", "--input", "--output", out], ["--input needs a value"], status=2, parse_only=True)
    add("missing_output", ["loss", "--input", good], ["--output is required"], status=2, parse_only=True)
    add("missing_input_option", ["loss", "--output", out], ["--input is required"], status=2, parse_only=True)
    add("bad_strategy", loss + ["--input", good, "--strategy", "ring"], ["--strategy ring", "fused | seed"],
        status=2, parse_only=True)
    add("bad_mode", loss + ["--input", good, "--mode", "lazy"], ["--mode lazy", "fused | stash | recompute"],
        status=2, parse_only=True)
    add("grad_with_value", loss + ["--input", good, "--grad=yes"], ["--grad takes no value"], status=2, parse_only=True)
    add("stray_argument", loss + ["--input", good, "extra"], ["unexpected argument 'extra'"], status=2, parse_only=True)
    sizes = ",".join(["5"] * (r.np + 1))
    add("partition_count", loss + ["--input", good, "--partition", sizes],
        ["--partition " + sizes, "gives %d sizes but there are %d ranks" % (r.np + 1, r.np)], status=2)
    sizes = ",".join(["1"] * r.np)
    add("partition_sum", loss + ["--input", good, "--partition", sizes],
        ["--partition " + sizes, "adds up to %d" % r.np, "has 23"], status=2, existing=b"untouched")
    add("partition_word", loss + ["--input", good, "--partition", "a" + ",1" * (r.np - 1)],
        ["--partition", "'a' is not a column count"], status=2)
    add("partition_negative", loss + ["--input", good, "--partition", ",".join(["-1"] + ["24"] * (r.np - 1))],
        ["--partition", "'-1' is not a column count"], status=2)
    add("partition_empty_item", loss + ["--input", good, "--partition", ",".join(["23"] + ["0"] * (r.np - 1)) + ","],
        ["--partition"], status=2)
    add("unknown_command", ["frobnicate"], ["unknown command 'frobnicate'"], status=2, parse_only=True)
    add("no_command", [], ["no command given"], status=2, parse_only=True)
    add("unknown_program_option", ["--bogus"], ["unknown option '--bogus'"], status=2, parse_only=True)

    try:
        more_cases(r, add, x, t, good, out)
        run_error_cases(r, cases, out)
    finally:
        unmount_small_fs(r)
    print("errors: %d cases at %d rank(s)" % (len(cases), r.np))


ERROR_TIME = 20  # seconds: an error must be agreed at once, not after the 30 s a rank failing alone waits


def run_error_cases(r, cases, out):
    for name, args, expect, status, existing, env, launcher in cases:
        target_out = out
        if "--output" in args:
            target_out = args[args.index("--output") + 1]
        if os.path.isfile(out):
            os.remove(out)
        if existing is not None:
            with open(out, "wb") as f:
                f.write(existing)
        res = r.run(args, env=env, launcher=launcher)
        problems = []
        if res.statuses != [status] * r.np:
            problems.append("exit statuses %s, expected %d on every rank" % (res.statuses, status))
        if res.elapsed > ERROR_TIME:
            problems.append("took %.1f s (more than %d s: not agreed at once?)" % (res.elapsed, ERROR_TIME))
        lines = res.vpce_lines()
        if len(lines) != 1:
            problems.append("%d 'vpce:' lines on stderr, expected exactly 1 (rank 0's)" % len(lines))
        for e in expect:
            if not any(e in l for l in lines):
                problems.append("no 'vpce:' line contains %r" % e)
        if existing is not None:
            with open(out, "rb") as f:
                if f.read() != existing:
                    problems.append("the existing output file was changed")
        elif os.path.lexists(target_out) and not os.path.isdir(target_out):
            problems.append("an output file was created")
        folder = os.path.dirname(target_out) or "."
        if os.path.isdir(folder) and leftovers(folder, target_out):
            problems.append("temporary files left: %s" % leftovers(folder, target_out))
        if problems:
            raise Failure("%s: %s\n%s" % (name, "; ".join(problems), res.describe()))
        print("ok %-24s %s" % (name, lines[0] if lines else ""))


SMALL_FS = "small_fs"  # a tmpfs of a few MiB mounted in the work folder, where mounting is allowed


def mount_small_fs(r, size):
    """Mounts a tmpfs of `size` at WORKDIR/small_fs; returns its path, or None where mounting is not allowed
    (not root, no CAP_SYS_ADMIN in a container)."""
    path = os.path.join(r.workdir, SMALL_FS)
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return None
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s" % size, "vpce_test_full", path],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return path if res.returncode == 0 else None


def unmount_small_fs(r):
    path = os.path.join(r.workdir, SMALL_FS)
    if os.path.ismount(path):
        subprocess.run(["umount", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def more_cases(r, add, x, t, good, out):
    """Robustness (issue #6 item 8): odd files and paths, odd dtypes and shapes, absurd declared sizes, full disks."""
    w = r.workdir
    n, v = x.shape
    loss = ["loss", "--output", out, "--grad"]

    def h5(name, build):
        path = os.path.join(w, name + ".h5")
        with h5py.File(path, "w") as f:
            build(f)
        return path

    def std(f, logits=x, targets=t):
        if logits is not None:
            f["logits"] = logits
        if targets is not None:
            f["targets"] = targets

    # Files that are no HDF5 files, or cannot be read.
    empty = os.path.join(w, "empty.h5")
    open(empty, "wb").close()
    add("empty_file", loss + ["--input", empty], ["empty.h5", "not an HDF5 file"])
    with open(good, "rb") as f:
        whole = f.read()
    cut = os.path.join(w, "cut.h5")
    with open(cut, "wb") as f:
        f.write(whole[:len(whole) // 2])
    add("truncated_file", loss + ["--input", cut], ["cut.h5", "not an HDF5 file, or it cannot be opened"])
    header_only = os.path.join(w, "header_only.h5")
    with open(header_only, "wb") as f:
        f.write(whole[:8])  # the HDF5 signature alone
    add("signature_only", loss + ["--input", header_only], ["header_only.h5", "not an HDF5 file"], once=True)
    fifo = os.path.join(w, "fifo.h5")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    add("input_fifo", loss + ["--input", fifo], ["fifo.h5", "is a FIFO, not an HDF5 file"])  # opening it would hang
    add("input_device", loss + ["--input", "/dev/null"], ["/dev/null", "character device"], once=True)
    add("input_under_file", loss + ["--input", os.path.join(good, "in.h5")], ["good.h5/in.h5", "Not a directory"])
    dangling = os.path.join(w, "dangling.h5")
    if not os.path.lexists(dangling):
        os.symlink(os.path.join(w, "nowhere.h5"), dangling)
    add("input_dangling_link", loss + ["--input", dangling], ["dangling.h5", "no such file"], once=True)
    add("input_name_too_long", loss + ["--input", os.path.join(w, "x" * 5000 + ".h5")], ["File name too long"],
        once=True)
    # Datasets of the wrong kind, type or number of dimensions.
    add("logits_null_space", loss + ["--input", h5("logits_null", lambda f: std(f, logits=h5py.Empty("f4")))],
        ["dataset /logits is empty (a null dataspace", "expected 2 dimensions"])
    add("targets_scalar", loss + ["--input", h5("targets_scalar", lambda f: std(f, targets=np.int64(3)))],
        ["dataset /targets is a scalar", "expected 1 dimension"])
    add("targets_3d", loss + ["--input", h5("targets_3d", lambda f: std(f, targets=t.reshape(n, 1, 1)))],
        ["dataset /targets has shape 6 x 1 x 1 (3 dimensions)"], once=True)
    compound = np.zeros((n, v), dtype=[("re", "f4"), ("im", "f4")])
    add("logits_compound", loss + ["--input", h5("logits_compound", lambda f: std(f, logits=compound))],
        ["dataset /logits has type compound", "float32 or float64"])
    words = np.array([[b"ab"] * v] * n)
    add("logits_strings", loss + ["--input", h5("logits_strings", lambda f: std(f, logits=words))],
        ["dataset /logits has type string"], once=True)
    add("logits_int8", loss + ["--input", h5("logits_int8", lambda f: std(f, logits=x.astype(np.int8)))],
        ["dataset /logits has type int8"], once=True)
    add("logits_uint16_float16_attr_bytes",
        loss + ["--input", h5("u16_attr_array", lambda f: (std(f, logits=np.zeros((n, v), np.uint16)),
                                                           f["logits"].attrs.create("dtype", [b"bfloat16", b"x"])))],
        ["attribute dtype is an array of 2 strings, not a string"], once=True)
    add("targets_bool", loss + ["--input", h5("targets_bool", lambda f: std(f, targets=t > 3))],
        ["dataset /targets has type enum", "expected int64"])
    add("targets_strings", loss + ["--input", h5("targets_strings",
                                                lambda f: std(f, targets=np.array([b"7"] * n)))],
        ["dataset /targets has type string"], once=True)
    t_big = t.astype(np.uint64)
    t_big[3] = np.iinfo(np.uint64).max  # would be -1 (the --ignore-index below) if it wrapped around
    add("targets_uint64_max", loss + ["--input", h5("targets_u64", lambda f: std(f, targets=t_big)),
                                      "--ignore-index", "-1"],
        ["dataset /targets: entry 3 is 9223372036854775807", "outside the vocabulary"])
    # Absurd declared shapes (chunked datasets never written: a small file): an error, not an overflow or a crash.
    def huge(rows, cols):
        def build(f):
            f.create_dataset("logits", shape=(rows, cols), chunks=(1, min(cols, 1024)), dtype="f4")
            f.create_dataset("targets", shape=(rows,), chunks=(min(rows, 1024),), dtype="i8")
        return build
    add("logits_huge_shape", loss + ["--input", h5("huge_shape", huge(2 ** 40, 2 ** 40))],
        ["dataset /logits has shape 1099511627776 x 1099511627776: too large"])
    add("logits_beyond_memory", loss + ["--input", h5("beyond_memory", huge(2 ** 36, 2 ** 15 * 3))],
        ["beyond_memory.h5", "not enough memory for this rank's 68719476736 x"])
    # Output paths that cannot be written.
    add("output_under_file", ["loss", "--input", good, "--output", os.path.join(good, "out.h5")],
        ["good.h5/out.h5", "is not a folder"])
    add("output_name_too_long", ["loss", "--input", good, "--output", os.path.join(w, "y" * 5000 + ".h5")],
        ["cannot write the output: File name too long"], once=True)
    add("output_tmp_name_too_long", ["loss", "--input", good, "--output", os.path.join(w, "z" * 245 + ".h5")],
        ["cannot write the output: its name is too long (248 characters", ".tmp.<process id>"], once=True)
    # The hidden fault switch (test_vpce_tool.py's faults suite) refuses a malformed value.
    add("fault_switch_malformed", loss + ["--input", good], ["VPCE_TOOL_FAULT=kill:one:read", "kill:<rank>:<phase>"],
        status=2, env={"VPCE_TOOL_FAULT": "kill:one:read"}, once=True)
    # A full disk: the gradient (24 MiB) does not fit. (a) a file-size limit of 16 MiB on every rank (prlimit;
    # the tool ignores SIGXFSZ, so writes fail with EFBIG); (b) a 4 MiB tmpfs, where mounting is allowed (ENOSPC).
    big_x = np.random.default_rng(9).normal(size=(1536, 4096)).astype(np.float32)
    big_t = (np.arange(1536) * 7) % 4096
    big = h5("big", lambda f: std(f, logits=big_x, targets=big_t))
    if shutil.which("prlimit"):
        add("file_size_limit", ["loss", "--input", big, "--output", out, "--grad"],
            ["out.h5", "File too large"], launcher=["prlimit", "--fsize=%d" % (16 << 20)], existing=b"old output")
    else:
        print("skipped file_size_limit: no prlimit")
    small = mount_small_fs(r, "4m")
    if small:
        add("disk_full", ["loss", "--input", big, "--output", os.path.join(small, "out.h5"), "--grad"],
            ["small_fs/out.h5", "No space left on device"])
    else:
        print("skipped disk_full: cannot mount a tmpfs here (not root, or not allowed in this container)")


FAULT_TIMEOUT = 60  # seconds within which a job with a killed rank must have ended


def suite_faults(r):
    """A rank that dies (issue #6 item 2): VPCE_TOOL_FAULT=kill:<rank>:<phase> makes that rank SIGKILL itself at
    that phase. The job must end with a non-zero status within FAULT_TIMEOUT, leave no output file (an existing
    one untouched) and no temporary file: the surviving ranks remove it when mpiexec terminates them."""
    w = r.workdir
    x, t = make_case(40, 301, "float32", 21)
    inp = os.path.join(w, "in.h5")
    write_input(inp, x, t)
    out = os.path.join(w, "out.h5")
    last = r.np - 1
    cases = {2: [(1, "read"), (0, "collective"), (1, "write"), (0, "write"), (1, "rename"), (0, "rename")],
             3: [(2, "read"), (1, "collective"), (0, "write"), (2, "rename")]}.get(r.np, [(last, "write")])
    for k, (rank, phase) in enumerate(cases):
        name = "kill_rank%d_at_%s" % (rank, phase)
        existing = b"the previous output" if k % 2 else None
        if os.path.exists(out):
            os.remove(out)
        if existing is not None:
            with open(out, "wb") as f:
                f.write(existing)
        res = r.run(["loss", "--input", inp, "--output", out, "--grad", "--quiet"],
                    env={"VPCE_TOOL_FAULT": "kill:%d:%s" % (rank, phase)}, wrapped=False, timeout=FAULT_TIMEOUT)
        problems = []
        if res.returncode == 0:
            problems.append("mpiexec exited with status 0")
        if "rank %d kills itself at phase %s" % (rank, phase) not in res.stderr:
            problems.append("the fault switch did not fire")
        if existing is not None:
            with open(out, "rb") as f:
                if f.read() != existing:
                    problems.append("the existing output file was changed")
        elif os.path.exists(out):
            problems.append("an output file was created")
        if leftovers(w, out):
            problems.append("temporary files left: %s" % leftovers(w, out))
        if problems:
            raise Failure("%s: %s\n%s" % (name, "; ".join(problems), res.describe()))
        print("ok %-26s mpiexec status %d after %.1f s" % (name, res.returncode, res.elapsed))
    # A write that fails on some ranks only, inside a collective MPI-IO transfer (a file-size limit, the tool's
    # reservation of the space turned off): the others stay in the transfer; the failing rank waits
    # VPCE_ABORT_TIMEOUT seconds, removes the temporary file and ends the job.
    if shutil.which("prlimit"):
        big = os.path.join(w, "big.h5")
        write_input(big, np.zeros((1536, 4096), dtype=np.float32), np.arange(1536) % 4096)
        if os.path.exists(out):
            os.remove(out)
        res = r.run(["loss", "--input", big, "--output", out, "--grad", "--quiet"],
                    env={"VPCE_TOOL_RESERVE": "0", "VPCE_ABORT_TIMEOUT": "3"},
                    launcher=["prlimit", "--fsize=%d" % (16 << 20)], wrapped=False, timeout=FAULT_TIMEOUT)
        problems = []
        if res.returncode == 0:
            problems.append("mpiexec exited with status 0")
        if not any("out.h5" in l and "the other ranks did not stop within 3 s" in l for l in res.vpce_lines()):
            problems.append("no 'vpce:' line names the output and the timeout")
        if os.path.exists(out) or leftovers(w, out):
            problems.append("an output or temporary file is left: %s" % leftovers(w, out))
        if problems:
            raise Failure("write_fails_on_one_rank: %s\n%s" % ("; ".join(problems), res.describe()))
        print("ok %-26s mpiexec status %d after %.1f s" % ("write_fails_on_one_rank", res.returncode, res.elapsed))
    # The switch is inert for a rank that does not exist: a normal run.
    if os.path.exists(out):
        os.remove(out)
    res = r.run(["loss", "--input", inp, "--output", out, "--quiet"], env={"VPCE_TOOL_FAULT": "kill:99:read"})
    if res.statuses != [0] * r.np or not os.path.exists(out) or leftovers(w, out):
        raise Failure("kill:99:read: expected a normal run\n%s" % res.describe())
    print("faults: %d runs with a killed rank at %d ranks" % (len(cases), r.np))


# ------------------------------------------------------------------------------------------------ linear

def write_linear_input(path, hidden=None, weight=None, targets=None, **extra):
    with h5py.File(path, "w") as f:
        for name, value in (("hidden", hidden), ("weight", weight), ("targets", targets)):
            if value is not None:
                f[name] = value
        for name, value in extra.items():
            f[name] = value


def suite_linear(r):
    """`vpce linear` (the LM head fused with the loss): /loss, /grad_hidden and /grad_weight against
    reference_options() on the float64 logits hidden @ weight.T, with every option, chunk sizes 1, 3, one not
    dividing N and the default, even and uneven partitions (an empty rank); its bad inputs; a killed rank."""
    w = r.workdir
    if not r.linear:
        # A build without Kokkos Kernels: the command says so, alike on every rank.
        inp = os.path.join(w, "in.h5")
        write_linear_input(inp, np.zeros((2, 3), np.float32), np.zeros((5, 3), np.float32), np.zeros(2, np.int64))
        res = r.run(["linear", "--input", inp, "--output", os.path.join(w, "out.h5")])
        lines = res.vpce_lines()
        if res.statuses != [1] * r.np or len(lines) != 1 or "no Kokkos Kernels" not in lines[0]:
            raise Failure("linear without Kokkos Kernels: expected one clear error\n%s" % res.describe())
        print("ok linear: this build has no Kokkos Kernels, and says so")
        return
    n, hsz, v = 7, 5, 23
    rng = np.random.default_rng(31)
    checks = [0]
    empty_part = {1: None, 2: "0,23", 3: "10,0,13"}[r.np]
    uneven = {1: None, 2: "20,3", 3: "0,23,0"}[r.np]

    def run_case(name, o, dtype="float32", chunk=None, part=None, grad=True, strategy=None, t=None, nn=n, bias=False,
                 sp=False):
        # 16-bit inputs: uint16 bits with a dtype attribute; the reference uses the values the bits hold.
        half = dtype in ("bfloat16", "float16")
        stored = {}
        values = {}
        for key, shape in (("hidden", (nn, hsz)), ("weight", (v, hsz))) + ((("bias", (v,)),) if bias else ()):
            x = rng.normal(0.0, 1.0, size=shape)
            if half:
                stored[key], values[key] = to_16bit(x, dtype)
            else:
                stored[key] = x.astype(dtype)
                values[key] = stored[key].astype(np.float64)
        if t is None:
            t = rng.integers(0, v, size=nn).astype(np.int64)
        inp = os.path.join(w, "in_%s.h5" % name)
        out = os.path.join(w, "out_%s.h5" % name)
        write_linear_input(inp, targets=t, **stored)
        if half:
            with h5py.File(inp, "a") as f:
                for key in stored:
                    f[key].attrs["dtype"] = dtype
        if os.path.exists(out):
            os.remove(out)
        args = (["linear", "--input", inp, "--output", out, "--quiet"] + o.args() + (["--grad"] if grad else []) +
                (["--chunk-rows", str(chunk)] if chunk is not None else []) + (["--sequence-parallel"] if sp else []) +
                (["--partition", part] if part else []) + (["--strategy", strategy] if strategy else []))
        res = r.run(args)
        if res.statuses != [0] * r.np or res.vpce_lines():
            raise Failure("%s: expected success\n%s" % (name, res.describe()))
        if leftovers(w, out):
            raise Failure("%s: temporary files left" % name)
        out_dtype = "float32" if half else dtype
        h64, w64 = values["hidden"], values["weight"]
        z = h64 @ w64.T + (values["bias"] if bias else 0.0)
        want_loss, want_dz, want_lse, want_reduced, valid, g, _ = reference_options(z, t, o)
        eps = np.finfo(np.dtype(out_dtype)).eps
        # The logits themselves carry the gemm's rounding: a few ulps of |h| |w| (H terms).
        tol = eps * (4.0 * np.sqrt(v) + 16.0 + 8.0 * hsz)
        row_scale = (np.maximum(1.0, np.abs(want_lse)) * (1 + 2 * o.z * np.abs(want_lse)) * max(1.0, o.scale) *
                     max(1.0, float(np.max(np.abs(z), initial=0.0))))
        problems = []
        with h5py.File(out, "r") as f:
            loss = f["loss"][...].astype(np.float64)
            if f["loss"].dtype != np.dtype(out_dtype):
                problems.append("/loss is %s" % f["loss"].dtype)
            if o.reduction == "none":
                err = np.max(np.abs(loss - want_loss) / row_scale, initial=0.0)
                if loss.shape != (nn,) or err > tol:
                    problems.append("/loss differs by %.3g (tolerance %.2g)" % (err, tol))
            else:
                err = abs(loss[0] - want_reduced) / max(1.0, np.sum(row_scale))
                if loss.shape != (1,) or err > tol:
                    problems.append("/loss (%s) is %r, expected %r" % (o.reduction, loss, want_reduced))
            if grad:
                wanted = [("grad_hidden", want_dz @ w64), ("grad_weight", want_dz.T @ h64)]
                if bias:
                    wanted.append(("grad_bias", want_dz.sum(axis=0)))
                elif "grad_bias" in f:
                    problems.append("/grad_bias written without /bias")
                for ds, want in wanted:
                    got = f[ds][...].astype(np.float64) if ds in f else None
                    scale = max(1.0, float(np.max(np.abs(want), initial=0.0))) * max(1.0, o.scale) * \
                        float(np.max(row_scale, initial=1.0)) * (g if g else 1.0) * max(1, nn)
                    err = np.max(np.abs(got - want), initial=0.0) / scale if got is not None else np.inf
                    if got is None or got.shape != want.shape or f[ds].dtype != np.dtype(out_dtype) or err > tol:
                        problems.append("/%s differs by %.3g (tolerance %.2g)" % (ds, err, tol))
            elif "grad_hidden" in f or "grad_weight" in f or "grad_bias" in f:
                problems.append("gradients written without --grad")
            attrs = {k: (a.decode() if isinstance(a, bytes) else str(a)) for k, a in f.attrs.items()}
            for key, want in (("ranks", str(r.np)), ("num_valid", str(int(np.count_nonzero(valid)))),
                              ("reduction", o.reduction), ("input", inp), ("hidden_dtype", dtype),
                              ("bias", "/bias" if bias else "none"), ("sequence_parallel", "yes" if sp else "no")):
                if attrs.get(key) != want:
                    problems.append("attribute %s = %r, expected %r" % (key, attrs.get(key), want))
            if chunk and attrs.get("chunk_rows") != str(chunk):
                problems.append("attribute chunk_rows = %r, expected %d" % (attrs.get("chunk_rows"), chunk))
            for key in ("vpce_version", "strategy", "ignore_index", "label_smoothing", "z_loss", "logit_scale",
                        "softcap", "chunk_rows"):
                if key not in attrs:
                    problems.append("no attribute %s" % key)
        if problems:
            raise Failure("%s: %s\n%s" % (name, "; ".join(problems), res.describe()))
        checks[0] += 1
        print("ok linear %-18s %.1f s" % (name, res.elapsed))

    t_ign = rng.integers(0, v, size=n).astype(np.int64)
    t_ign[[1, 4]] = -100
    run_case("default", Opts())
    run_case("options_chunk3", Opts(reduction="mean", label_smoothing=0.1, z_loss=1e-3, logit_scale=0.7, softcap=5.0),
             dtype="float64", chunk=3, part=uneven, t=t_ign)
    run_case("sum_chunk1_seed", Opts(reduction="sum", ignore_index=0), chunk=1, strategy="seed", part=empty_part)
    run_case("chunk4_of_7", Opts(label_smoothing=0.2, softcap=3.0), chunk=4, part=empty_part, t=t_ign)
    run_case("forward_only", Opts(reduction="mean", z_loss=1e-2), chunk=100, grad=False)
    if r.np == 2:
        run_case("float64_chunk2", Opts(logit_scale=2.0), dtype="float64", chunk=2, part=uneven)
    # A bias, 16-bit inputs, sequence-parallel input (each rank reads a share of /hidden's rows; the output is
    # the same).
    run_case("bias_mean", Opts(reduction="mean", label_smoothing=0.1), chunk=3, part=empty_part, t=t_ign, bias=True)
    run_case("bfloat16_bias", Opts(z_loss=1e-3), dtype="bfloat16", chunk=4, part=uneven, bias=True)
    run_case("sequence_parallel", Opts(softcap=4.0), chunk=2, part=uneven, sp=True, bias=True)
    if r.np == 2:
        run_case("float16_sp_sum", Opts(reduction="sum"), dtype="float16", sp=True, t=t_ign)

    # Bad inputs: the same non-zero status on every rank, one line, no output.
    hidden = rng.normal(size=(6, hsz)).astype(np.float32)
    weight = rng.normal(size=(v, hsz)).astype(np.float32)
    t = rng.integers(0, v, size=6).astype(np.int64)
    out = os.path.join(w, "out.h5")
    good = os.path.join(w, "good.h5")
    write_linear_input(good, hidden, weight, t)
    cases = []

    def add(name, args, expect, status=1, existing=None, once=False):
        if not once or r.np == 2:
            cases.append((name, args, expect, status, existing, None, ()))

    def bad(name, **datasets):
        path = os.path.join(w, name + ".h5")
        write_linear_input(path, **datasets)
        return path

    lin = ["linear", "--output", out, "--grad"]
    add("no_hidden", lin + ["--input", bad("no_hidden", weight=weight, targets=t)], ["no_hidden.h5", "no dataset /hidden"])
    add("no_weight", lin + ["--input", bad("no_weight", hidden=hidden, targets=t)], ["no dataset /weight"], once=True)
    add("no_targets", lin + ["--input", bad("no_targets_l", hidden=hidden, weight=weight)], ["no dataset /targets"],
        once=True)
    add("hidden_1d", lin + ["--input", bad("hidden_1d", hidden=hidden[0], weight=weight, targets=t)],
        ["dataset /hidden has shape 5 (1 dimension)", "expected 2 dimensions"], once=True)
    add("weight_3d", lin + ["--input", bad("weight_3d", hidden=hidden, weight=weight.reshape(v, hsz, 1), targets=t)],
        ["dataset /weight has shape 23 x 5 x 1 (3 dimensions)"])
    add("hidden_int", lin + ["--input", bad("hidden_int", hidden=hidden.astype(np.int32), weight=weight, targets=t)],
        ["dataset /hidden has type int32", "float32 or float64"], once=True)
    add("dtype_mismatch", lin + ["--input", bad("dtype_mismatch", hidden=hidden, weight=weight.astype(np.float64),
                                                targets=t)],
        ["dataset /weight holds float64 but /hidden holds float32"])
    add("bias_length", lin + ["--input", bad("bias_length", hidden=hidden, weight=weight, bias=np.zeros(v - 1, np.float32),
                                             targets=t)],
        ["dataset /bias has shape 22", "expected 23 values (one per row of /weight)"], once=True)
    add("bias_dtype", lin + ["--input", bad("bias_dtype", hidden=hidden, weight=weight, bias=np.zeros(v), targets=t)],
        ["dataset /bias holds float64 but /hidden holds float32"], once=True)
    add("hidden_size_mismatch", lin + ["--input", bad("h_mismatch", hidden=hidden, weight=weight[:, :4], targets=t)],
        ["dataset /weight has 4 columns but /hidden has 5"], existing=b"keep me")
    add("targets_count", lin + ["--input", bad("targets_count_l", hidden=hidden, weight=weight, targets=t[:5])],
        ["dataset /targets has 5 entries but /hidden has 6 rows"], once=True)
    t_high = t.copy()
    t_high[3] = v
    add("target_out_of_range", lin + ["--input", bad("target_high_l", hidden=hidden, weight=weight, targets=t_high)],
        ["target_high_l.h5", "entry 3 is 23", "[0, 23)"])
    h_nan = hidden.copy()
    h_nan[4, 2] = np.nan
    nan_file = bad("nan_hidden", hidden=h_nan, weight=weight, targets=t)
    add("nan_hidden", ["linear", "--output", out, "--input", nan_file, "--chunk-rows", "3"],
        ["nan_hidden.h5", "row 1 of the logits holds NaN", "chunk of rows 3 to 5"], existing=b"previous output")
    add("nan_hidden_grad", lin + ["--input", nan_file, "--chunk-rows", "3"],
        ["nan_hidden.h5", "row 1 of the logits holds NaN", "chunk of rows 3 to 5"])
    sizes = ",".join(["1"] * r.np)
    add("partition_sum", lin + ["--input", good, "--partition", sizes],
        ["--partition " + sizes, "adds up to %d rows" % r.np, "dataset /weight", "has 23"], status=2)
    add("chunk_rows_negative", lin + ["--input", good, "--chunk-rows", "-1"],
        ["linear: --chunk-rows -1: must be in [0, "], status=2, once=True)
    add("chunk_rows_word", lin + ["--input", good, "--chunk-rows", "many"], ["--chunk-rows many: not an integer"],
        status=2, once=True)
    add("loss_only_option", lin + ["--input", good, "--grad-dtype", "float32"], ["unknown option '--grad-dtype'"],
        status=2, once=True)
    add("missing_input_option", ["linear", "--output", out], ["linear: option --input is required"], status=2,
        once=True)
    add("label_smoothing_range", lin + ["--input", good, "--label-smoothing", "2"],
        ["linear: --label-smoothing 2: must be in [0, 1]", "'vpce linear --help'"], status=2, once=True)
    run_error_cases(r, cases, out)

    # A rank killed while the output is written: the job ends, no output, no temporary file.
    if r.np >= 2:
        if os.path.exists(out):
            os.remove(out)
        res = r.run(["linear", "--input", good, "--output", out, "--grad", "--quiet"],
                    env={"VPCE_TOOL_FAULT": "kill:%d:write" % (r.np - 1)}, wrapped=False, timeout=FAULT_TIMEOUT)
        if res.returncode == 0 or os.path.exists(out) or leftovers(w, out) or "kills itself" not in res.stderr:
            raise Failure("linear kill at write: expected a failed job and no output\n%s" % res.describe())
        print("ok linear kill_rank%d_at_write  mpiexec status %d after %.1f s" % (r.np - 1, res.returncode,
                                                                                 res.elapsed))
    print("linear: %d runs checked against the float64 reference, %d error cases at %d rank(s)" %
          (checks[0], len(cases), r.np))


def suite_commands(r):
    w = r.workdir
    for args, expect in ((["--help"], "Commands:"), (["-h"], "Commands:"), (["loss", "--help"], "--partition"),
                         (["linear", "--help"], "--chunk-rows"),
                         (["bench", "-h"], "--json"), (["demo", "--help"], "--tokens"), (["--version"], "Kokkos")):
        res = r.run(args)
        if res.statuses != [0] * r.np or expect not in res.stdout or res.vpce_lines():
            raise Failure("%s: expected success with %r on stdout\n%s" % (args, expect, res.describe()))
        first = res.stdout.splitlines()[0]
        if res.stdout.count(first + "\n") != 1:
            raise Failure("%s: printed more than once (only rank 0 prints)\n%s" % (args, res.describe()))
        print("ok %s" % " ".join(args))

    js = os.path.join(w, "bench.json")
    if os.path.exists(js):
        os.remove(js)
    res = r.run(["bench", "--tokens", 64, "--vocab", 1001, "--reps", 2, "--json", js])
    if res.statuses != [0] * r.np or res.vpce_lines():
        raise Failure("bench: expected success\n%s" % res.describe())
    with open(js) as f:
        records = json.load(f)
    names = {rec["name"] for rec in records}
    for want in ("copy", "copy_stream", "read", "loss_and_grad/fused", "loss_and_grad/seed",
                 "forward_backward/seed/stash"):
        if want not in names:
            raise Failure("bench: no record %r in %s\n%s" % (want, sorted(names), res.describe()))
    if any(rec["ranks"] != r.np or rec["tokens"] != 64 or not rec["ratio_to_stream"] > 0 or not rec["ratio_to_read"] > 0
           for rec in records):
        raise Failure("bench: records with the wrong ranks or tokens: %s" % records)
    if "loss_and_grad/fused" not in res.stdout or leftovers(w, js):
        raise Failure("bench: no table on stdout, or a temporary JSON file left\n%s" % res.describe())
    print("ok bench (%d records)" % len(records))
    # --huge-pages: the buffers advised before their first touch; every record says what share the kernel gave
    # (64 x 1001 floats fill no whole 2 MiB page: 0 here), -1 only where /proc/self/smaps_rollup is missing.
    os.remove(js)
    res = r.run(["bench", "--tokens", 64, "--vocab", 1001, "--reps", 1, "--dtype", "bfloat16", "--only",
                 "loss_and_grad/fused$", "--huge-pages", "--json", js])
    if res.statuses != [0] * r.np or res.vpce_lines() or "in huge pages" not in res.stdout:
        raise Failure("bench --huge-pages: expected success and the share in the table\n%s" % res.describe())
    with open(js) as f:
        records = json.load(f)
    if [(rec["name"], rec["dtype"]) for rec in records] != [(n, "bfloat16") for n in
                                                            ("copy", "copy_stream", "read", "loss_and_grad/fused")]:
        raise Failure("bench --dtype bfloat16 --only loss_and_grad/fused$: expected the three ceilings and the "
                      "record, in bfloat16: %s" % records)
    shares = {rec["huge_page_share"] for rec in records}
    if len(shares) != 1 or not 0 <= shares.pop() <= 1:
        raise Failure("bench --huge-pages: expected one share in [0, 1]: %s" % records)
    print("ok bench --huge-pages")
    res = r.run(["bench", "--tokens", 0])
    if res.statuses != [2] * r.np or not any("--tokens 0" in l for l in res.vpce_lines()):
        raise Failure("bench --tokens 0: expected a usage error\n%s" % res.describe())
    res = r.run(["bench", "--tokens", 8, "--vocab", 16, "--json", os.path.join(w, "nope", "b.json")])
    if res.statuses != [1] * r.np or len(res.vpce_lines()) != 1 or "nope" not in res.vpce_lines()[0]:
        raise Failure("bench --json in a missing folder: expected an error\n%s" % res.describe())
    print("ok bench errors")

    for args in (["--tokens", 96, "--vocab", 3001, "--reps", 1],
                 ["--tokens", 40, "--vocab", 777, "--dtype", "float64", "--no-bench", "--check-rows", 40],
                 ["--tokens", 16, "--vocab", max(1, r.np - 1), "--no-bench"]):
        res = r.run(["demo"] + args)
        if res.statuses != [0] * r.np or res.vpce_lines() or "mean loss" not in res.stdout:
            raise Failure("demo %s: expected success\n%s" % (args, res.describe()))
        if res.stdout.count(" ok\n") != 4 or "FAILED" in res.stdout:
            raise Failure("demo %s: expected 4 passed checks\n%s" % (args, res.describe()))
        if "--no-bench" not in args and "loss_and_grad/fused" not in res.stdout:
            raise Failure("demo %s: no timing\n%s" % (args, res.describe()))
        print("ok demo %s" % " ".join(str(a) for a in args))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vpce", required=True, help="the vpce executable")
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--numproc-flag", default="-n")
    p.add_argument("--preflag", action="append", help="an mpiexec flag before the program (repeatable)")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--suite", choices=("loss", "options", "errors", "faults", "commands", "linear"), required=True)
    p.add_argument("--linear", choices=("yes", "no"), default="yes",
                   help="whether the build has Kokkos Kernels (`vpce linear` computes, or says it cannot)")
    p.add_argument("--workdir", required=True)
    opts = p.parse_args()
    opts.vpce = os.path.abspath(opts.vpce)
    small_fs = os.path.join(opts.workdir, SMALL_FS)
    if os.path.ismount(small_fs):  # left mounted by an interrupted run
        subprocess.run(["umount", small_fs], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shutil.rmtree(opts.workdir, ignore_errors=True)
    os.makedirs(opts.workdir)
    r = Runner(opts)
    try:
        {"loss": suite_loss, "options": suite_options, "errors": suite_errors, "faults": suite_faults,
         "commands": suite_commands, "linear": suite_linear}[opts.suite](r)
    except Failure as e:
        print("FAILED: %s" % e, file=sys.stderr)
        return 1
    finally:
        for path in glob.glob(os.path.join(opts.workdir, "locked")):
            os.chmod(path, 0o755)
    print("PASSED (%d runs)" % r.count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
