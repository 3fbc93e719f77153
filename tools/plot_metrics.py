#!/usr/bin/env python3
"""Draw loss, eval loss, lr, grad norm and tokens/s of one or more runs into a PNG.

usage: tools/plot_metrics.py RUN/metrics.h5 [OTHER/metrics.h5 ...] --out metrics.png
"""
import argparse
import os

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("metrics", nargs="+", help="metrics.h5 files")
    ap.add_argument("--out", default="metrics.png", help="PNG to write")
    args = ap.parse_args()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    (ax_loss, ax_lr), (ax_norm, ax_tps) = axes
    for path in args.metrics:
        label = os.path.basename(os.path.dirname(os.path.abspath(path)))
        with h5py.File(path, "r") as f:
            step = f["step"][:]
            ax_loss.plot(step, f["loss"][:], label=f"{label} train", lw=1)
            if "eval" in f and len(f["eval/step"]):
                ax_loss.plot(f["eval/step"][:], f["eval/loss"][:], "o-", label=f"{label} eval")
            ax_lr.plot(step, f["lr"][:], label=label)
            ax_norm.plot(step, f["grad_norm"][:], label=label, lw=1)
            ax_tps.plot(step, f["tokens_per_s"][:], label=label, lw=1)
    for ax, title in ((ax_loss, "loss (nats/token)"), (ax_lr, "learning rate"),
                      (ax_norm, "gradient norm (before clipping)"), (ax_tps, "tokens / s")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
