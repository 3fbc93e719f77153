#!/usr/bin/env python3
"""Print a table of one or more training runs: steps, final loss, best eval loss, speed and
the layout, from each run's metrics.h5 and config.toml (FORMAT.md).

usage: tools/summarize.py RUN_DIR|RUN/metrics.h5 [...] [--json]

Columns: run (its folder, or more of its path where two share a name); steps (rows in metrics.h5 / train.steps of the deck); final
loss (the last row's training loss); best eval (the lowest eval loss and its step, or -);
tok/s (median tokens_per_s over the run, the first step's warm-up aside); time (sum of
step_time_s); layout (tp x pp x dp = ranks, vpp, schedule, ZeRO stage); model (layers,
d_model, heads, seq_len, vocab); device and precision. --json prints the same as one JSON
object per run, with the losses at full precision.
"""
import argparse
import json
import os
import sys
import time

import h5py
import numpy as np


def load_metrics(path, tries=5):
    for i in range(tries):
        try:
            with h5py.File(path, "r") as f:
                m = {k: f[k][:] for k in ("step", "loss", "tokens_per_s", "step_time_s") if k in f}
                if "eval" in f and "step" in f["eval"]:
                    m["eval/step"], m["eval/loss"] = f["eval/step"][:], f["eval/loss"][:]
                return m
        except OSError:
            if i == tries - 1:
                raise
            time.sleep(0.3)
    return {}


def load_config(run_dir):
    path = os.path.join(run_dir, "config.toml")
    try:
        import tomllib
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, ImportError, ValueError):
        return {}


def fmt_time(s):
    if s < 60:
        return f"{s:.1f}s"
    s = int(round(s))
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def summarize(arg):
    path = os.path.join(arg, "metrics.h5") if os.path.isdir(arg) else arg
    run_dir = os.path.dirname(os.path.abspath(path))
    m, cfg = load_metrics(path), load_config(run_dir)
    par, mod, tr, rt = (cfg.get(k, {}) for k in ("parallel", "model", "train", "runtime"))
    step, loss = m.get("step", np.zeros(0)), m.get("loss", np.zeros(0))
    n = min(len(step), len(loss))
    r = {"run": os.path.basename(run_dir), "path": path, "rows": int(n),
         "last_step": int(step[n - 1]) if n else 0, "steps": tr.get("steps"),
         "final_loss": float(loss[n - 1]) if n else None}
    if len(m.get("eval/step", [])):
        best = int(np.argmin(m["eval/loss"]))
        r["best_eval_loss"] = float(m["eval/loss"][best])
        r["best_eval_step"] = int(m["eval/step"][best])
        r["final_eval_loss"] = float(m["eval/loss"][-1])
    tps = m.get("tokens_per_s", np.zeros(0))
    if len(tps):
        r["median_tokens_per_s"] = float(np.median(tps[1:] if len(tps) > 1 else tps))
    if len(m.get("step_time_s", [])):
        r["train_time_s"] = float(np.sum(m["step_time_s"]))
    if par:
        r["layout"] = {k: par.get(k) for k in ("tp", "pp", "dp", "vpp", "schedule",
                                                "micro_batch_size", "zero_stage",
                                                "sequence_parallel", "recompute")}
        r["ranks"] = int(par.get("tp", 1) * par.get("pp", 1) * par.get("dp", 1))
    if mod:
        r["model"] = {k: mod.get(k) for k in ("n_layer", "d_model", "n_head", "seq_len",
                                               "vocab_size")}
    if tr:
        r["global_batch_size"] = tr.get("global_batch_size")
    if rt:
        r["device"] = f"{rt.get('device', '?')}/{rt.get('precision', '?')}"
    return r


def row(r):
    steps = f"{r['last_step']}/{r['steps']}" if r.get("steps") is not None else str(r["last_step"])
    lay = r.get("layout")
    layout = "-"
    if lay:
        layout = f"{lay['tp']}x{lay['pp']}x{lay['dp']}={r['ranks']}"
        if lay.get("vpp", 1) != 1:
            layout += f" vpp{lay['vpp']}"
        layout += f" {lay['schedule']}"
        if lay.get("zero_stage"):
            layout += f" zero{lay['zero_stage']}"
    mo = r.get("model")
    model = (f"{mo['n_layer']}L d{mo['d_model']} h{mo['n_head']} T{mo['seq_len']} "
             f"V{mo['vocab_size']}") if mo else "-"
    best = (f"{r['best_eval_loss']:.4f} @{r['best_eval_step']}"
            if "best_eval_loss" in r else "-")
    return [r["run"], steps,
            f"{r['final_loss']:.4f}" if r["final_loss"] is not None else "-", best,
            f"{r['median_tokens_per_s']:,.0f}" if "median_tokens_per_s" in r else "-",
            fmt_time(r["train_time_s"]) if "train_time_s" in r else "-",
            layout, model, r.get("device", "-")]


HEAD = ["run", "steps", "final loss", "best eval", "tok/s", "time", "layout tp x pp x dp",
        "model", "device"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run folders (out_dir) or their metrics.h5")
    ap.add_argument("--json", action="store_true", help="one JSON object per run")
    args = ap.parse_args(argv)
    runs = []
    for a in args.runs:
        path = os.path.join(a, "metrics.h5") if os.path.isdir(a) else a
        if not os.path.exists(path):
            sys.exit(f"summarize: error: {path} not found")
        runs.append(summarize(a))
    names = [r["run"] for r in runs]
    if len(set(names)) < len(names):  # folders that share a name: show more of their paths
        dirs = [os.path.dirname(os.path.abspath(r["path"])) for r in runs]
        common = os.path.commonpath(dirs)
        for r, d in zip(runs, dirs):
            r["run"] = os.path.relpath(d, common) if d != common else d
    if args.json:
        for r in runs:
            print(json.dumps(r))
        return
    rows = [HEAD] + [row(r) for r in runs]
    width = [max(len(x[i]) for x in rows) for i in range(len(HEAD))]
    for j, x in enumerate(rows):
        print("  ".join(c.ljust(w) if i in (0, 6, 7, 8) else c.rjust(w)
                        for i, (c, w) in enumerate(zip(x, width))).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in width))


if __name__ == "__main__":
    main()
