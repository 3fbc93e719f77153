#!/usr/bin/env python3
"""Draw loss, eval loss, lr, grad norm and tokens/s of one or more runs into a PNG.

usage: tools/plot_metrics.py RUN[/metrics.h5] [OTHER ...] [--out metrics.png] [--smooth N]
                             [--json]

Each argument is a metrics.h5 (FORMAT.md) or the run's out_dir. Four panels, x = optimizer
step: the training loss (thin; a moving average over --smooth steps drawn over it) with
the eval loss as dots; the learning rate; the gradient norm before clipping (log scale,
the deck's grad_clip dashed, read from config.toml beside metrics.h5); tokens per second
(its median in the legend). Several runs share the panels, one colour each, labelled by
their folder. --json prints one line describing what was drawn (for tests and scripts).
A metrics.h5 may be read while its run is still writing it.
"""
import argparse
import json
import os
import sys
import time

import h5py
import numpy as np

COLUMNS = ("step", "loss", "lr", "grad_norm", "tokens_per_s")


def metrics_path(arg):
    return os.path.join(arg, "metrics.h5") if os.path.isdir(arg) else arg


def load(path, tries=5):
    """The step table and eval table of one metrics.h5 as numpy arrays."""
    for i in range(tries):
        try:
            with h5py.File(path, "r") as f:
                m = {k: f[k][:] for k in COLUMNS if k in f}
                if "eval" in f and "step" in f["eval"]:
                    m["eval/step"], m["eval/loss"] = f["eval/step"][:], f["eval/loss"][:]
            n = min(len(v) for k, v in m.items() if not k.startswith("eval/"))
            for k in COLUMNS:  # a read racing an append may see columns one row apart
                if k in m:
                    m[k] = m[k][:n]
            return m
        except (OSError, KeyError):
            if i == tries - 1:
                raise
            time.sleep(0.3)
    return {}


def grad_clip(path):
    """train.grad_clip from the config.toml beside metrics.h5, or None."""
    cfg = os.path.join(os.path.dirname(os.path.abspath(path)), "config.toml")
    try:
        import tomllib
        with open(cfg, "rb") as f:
            return float(tomllib.load(f)["train"]["grad_clip"])
    except (OSError, KeyError, ValueError, ImportError):
        return None


def labels_for(paths):
    """The run folder's name, or more of its path where two runs share a name."""
    dirs = [os.path.dirname(os.path.abspath(p)) for p in paths]
    names = [os.path.basename(d) for d in dirs]
    if len(set(names)) == len(names):
        return names
    common = os.path.commonpath(dirs) if len(dirs) > 1 else ""
    return [os.path.relpath(d, common) if common and d != common else d for d in dirs]


def moving_average(y, n):
    if n <= 1 or len(y) < n:
        return None
    c = np.cumsum(np.insert(np.asarray(y, dtype=np.float64), 0, 0.0))
    return (c[n:] - c[:-n]) / n


def plot(paths, out, smooth=0):
    """Draws the runs into `out`; returns a description of the figure (see --json)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5))
    (ax_loss, ax_lr), (ax_norm, ax_tps) = axes
    runs, tps_top, norm_min, clips = [], [], [], []
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (path, label) in enumerate(zip(paths, labels_for(paths))):
        m = load(path)
        c = colours[i % len(colours)]
        step = m.get("step", np.zeros(0))
        run = {"path": path, "label": label, "rows": int(len(step)),
               "steps": [int(step[0]), int(step[-1])] if len(step) else [],
               "eval_rows": int(len(m.get("eval/step", [])))}
        runs.append(run)
        if not len(step):
            print(f"plot_metrics: {path}: no rows yet", file=sys.stderr)
            continue
        n = smooth if smooth > 0 else (max(1, len(step) // 50) if len(step) >= 200 else 1)
        avg = moving_average(m["loss"], n)
        ax_loss.plot(step, m["loss"], color=c, lw=0.6, alpha=0.35 if avg is not None else 1.0,
                     label=f"{label} train")
        if avg is not None:
            ax_loss.plot(step[n - 1:], avg, color=c, lw=1.5, label=f"{label} train ({n}-step mean)")
        if run["eval_rows"]:
            ax_loss.plot(m["eval/step"], m["eval/loss"], "o-", color=c, ms=4, lw=1,
                         markerfacecolor="white", label=f"{label} eval")
        ax_lr.plot(step, m["lr"], color=c, label=label)
        ax_norm.plot(step, m["grad_norm"], color=c, lw=0.7, label=label)
        norm_min.append(float(np.nanmin(m["grad_norm"])))
        clip = grad_clip(path)
        if clip and clip not in clips:  # one dashed line per distinct threshold
            clips.append(clip)
            ax_norm.axhline(clip, color="0.4", ls="--", lw=0.8, label=f"grad_clip = {clip:g}")
        tps = m["tokens_per_s"]
        med = float(np.median(tps))
        ax_tps.plot(step, tps, color=c, lw=0.7, label=f"{label} (median {med:,.0f})")
        tps_top.append(float(np.percentile(tps[1:] if len(tps) > 2 else tps, 99)))
        run["final_loss"] = float(m["loss"][-1])
        run["median_tokens_per_s"] = med
    if tps_top:  # the first step warms up: keep the axis on the steady state
        ax_tps.set_ylim(0.0, max(tps_top) * 1.15)
    if norm_min and min(norm_min) > 0:  # norms span decades early in training
        ax_norm.set_yscale("log")
    panels = ((ax_loss, "loss (nats/token)"), (ax_lr, "learning rate"),
              (ax_norm, "gradient norm (before clipping)"), (ax_tps, "tokens / s"))
    for ax, title in panels:
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    desc = {"out": out, "runs": runs, "axes": []}
    for ax, title in panels:
        desc["axes"].append({"title": title, "xlim": [float(v) for v in ax.get_xlim()],
                             "ylim": [float(v) for v in ax.get_ylim()],
                             "yscale": ax.get_yscale(),
                             "lines": [ln.get_label() for ln in ax.get_lines()]})
    plt.close(fig)
    return desc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("metrics", nargs="+", help="metrics.h5 files or run folders")
    ap.add_argument("--out", default="metrics.png", help="PNG to write (default metrics.png)")
    ap.add_argument("--smooth", type=int, default=0,
                    help="moving-average window for the train loss (0: auto, 1: none)")
    ap.add_argument("--json", action="store_true", help="print what was drawn as JSON")
    args = ap.parse_args(argv)
    paths = [metrics_path(a) for a in args.metrics]
    for p in paths:
        if not os.path.exists(p):
            sys.exit(f"plot_metrics: error: {p} not found")
    desc = plot(paths, args.out, args.smooth)
    if args.json:
        print(json.dumps(desc))
    else:
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
