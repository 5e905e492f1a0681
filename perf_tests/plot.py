#!/usr/bin/python3
"""Turns the JSON files of perf_tests/sweep.sh into PNG plots (matplotlib from Debian).

  /usr/bin/python3 perf_tests/plot.py perf_tests/results/DATE [--out perf_tests/plots] [--title "machine, date"]
"""
import argparse
import glob
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SHOWN = ["copy", "loss_and_grad/fused", "forward_backward/fused/recompute", "forward_backward/fused/stash",
         "forward/fused/recompute", "loss_and_grad/seed", "forward_backward/seed/stash"]


def load(folder):
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            recs = json.load(f)
        # vpce_perf's files only (a list of records): not compare_torch.py's or vpce_linear_perf's
        if isinstance(recs, list) and all(isinstance(r, dict) and "ms_median" in r for r in recs):
            runs[os.path.basename(path)[:-5]] = {r["name"]: r for r in recs}
    return runs


def logits_mib(r):
    """The logits one rank holds, in MiB (the same x for every operation of a run)."""
    return r["tokens"] * r["vocab_local"] * {"float64": 8, "float32": 4}.get(r["dtype"], 2) / 2**20


def size_plot(runs, prefix, title, out):
    keys = sorted((k for k in runs if k.startswith(prefix)), key=lambda k: int(k.split("_n")[-1]))
    if not keys:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in SHOWN:
        xs = [logits_mib(runs[k][name]) for k in keys if name in runs[k]]
        ys = [runs[k][name]["gbps"] for k in keys if name in runs[k]]
        if xs:
            ax.plot(xs, ys, "o-" if name != "copy" else "k--", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("logits per rank (MiB)")
    ax.set_ylabel("GB/s (bytes the operation must move / time)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def scaling_plot(runs, title, out):
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    panels = [("threads_", "threads (1 rank)", "threads"), ("strong_", "ranks, N=4096, V=65536 (strong)", "ranks"),
              ("weak_", "ranks, V_local=32768 (weak)", "ranks")]
    for ax, (prefix, label, field) in zip(axes, panels):
        if prefix != "threads_":
            ax.axvspan(2.5, 4.5, color="grey", alpha=0.15, label="ranks > cores (oversubscribed)")
        keys = sorted((k for k in runs if k.startswith(prefix)), key=lambda k: int(k.split("_")[-1]))
        for name in ["copy", "loss_and_grad/fused", "forward_backward/fused/recompute", "forward_backward/seed/stash"]:
            xs = [runs[k][name][field] for k in keys if name in runs[k]]
            ys = [runs[k][name]["ms_median"] for k in keys if name in runs[k]]
            if xs:
                ax.plot(xs, ys, "o-" if name != "copy" else "k--", label=name)
        coll = [(runs[k]["loss_and_grad/fused"][field], runs[k]["loss_and_grad/fused"]["collective_ms"]) for k in keys
                if "loss_and_grad/fused" in runs[k]]
        if coll:
            ax.plot(*zip(*coll), "x:", label="  of which in the collective")
        ax.set_xlabel(label)
        ax.set_ylabel("ms (median, slowest rank)")
        ax.grid(alpha=0.3)
    # The collective's time against the number of rows (2 ranks x 1 thread, V = 65536).
    ax = axes[3]
    keys = sorted((k for k in runs if k.startswith("size_2x1_")), key=lambda k: int(k.split("_n")[-1]))
    for name in ["loss_and_grad/fused", "forward_backward/seed/stash"]:
        pts = [(runs[k][name]["tokens"], runs[k][name]["collective_ms"]) for k in keys if name in runs[k]]
        if pts:
            ax.plot(*zip(*pts), "x-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows N (2 ranks x 1 thread, V=65536)")
    ax.set_ylabel("ms in the collective (median, slowest rank)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "plots"))
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    runs = load(a.folder)
    os.makedirs(a.out, exist_ok=True)
    made = [size_plot(runs, "size_1x2_", f"1 rank x 2 threads, fp32 {a.title}", os.path.join(a.out, "size_1x2.png")),
            size_plot(runs, "size_2x1_", f"2 ranks x 1 thread, fp32 {a.title}", os.path.join(a.out, "size_2x1.png")),
            scaling_plot(runs, f"scaling, fp32 {a.title}", os.path.join(a.out, "scaling.png"))]
    for m in made:
        if m:
            print("wrote", m)


if __name__ == "__main__":
    main()
