#!/usr/bin/env python3
"""tools/plot_metrics.py and tools/summarize.py on real runs (issue 8).

A 40-step run with eval every 10 steps (one rank) and a 25-step one (two ranks) in two
folders that share a name, then:
1. plot_metrics.py RUN --out PNG --json: a non-empty PNG (PNG signature, a sensible size);
   four panels titled loss, learning rate, gradient norm, tokens / s whose x-limits cover
   steps 1..40; train and eval curves in the loss panel; the run's rows and final loss as
   metrics.h5 holds them;
2. two runs into one PNG: both drawn, distinct labels though their folders share a name,
   the x-limits cover the longer run; a run folder works in place of its metrics.h5;
3. summarize.py: the run's final loss (4 decimals, and exact with --json), steps 40/40,
   the best eval loss and its step, the layout (1x1x1=1, 1x1x2=2) from config.toml;
4. a missing file: a one-line error and a non-zero exit.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tinyrun as T  # noqa: E402

OUT = T.out_dir("tools.plot_summarize")
PY = os.environ.get("PYTHON", sys.executable)
PLOT = os.path.join(T.SOURCE, "tools", "plot_metrics.py")
SUMMARIZE = os.path.join(T.SOURCE, "tools", "summarize.py")
check = T.Checks("tools.plot_summarize")


def tool(*args, ok=True):
    p = subprocess.run([PY, *args], cwd=OUT, capture_output=True, text=True, timeout=120)
    if ok and p.returncode != 0:
        print(p.stdout, p.stderr)
        sys.exit(f"FAIL: {' '.join(args)} exited {p.returncode}")
    return p


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    T.make_data(OUT)
    T.write_deck(os.path.join(OUT, "a.toml"), "a/run", 40, eval_every=10)
    T.write_deck(os.path.join(OUT, "b.toml"), "b/run", 25, eval_every=0)
    T.trident("train", "a.toml", cwd=OUT)
    T.trident("train", "b.toml", cwd=OUT, np_=2)
    a = T.read_metrics(os.path.join(OUT, "a", "run", "metrics.h5"))
    final = float(a["loss"][-1])

    # 1. one run
    desc = json.loads(tool(PLOT, "a/run/metrics.h5", "--out", "a.png", "--json").stdout)
    png = os.path.join(OUT, "a.png")
    size = png_size(png) if os.path.exists(png) else None
    check(size is not None and os.path.getsize(png) > 10000 and size[0] >= 600 and size[1] >= 400,
          f"a.png is a non-empty PNG ({size}, {os.path.getsize(png) if size else 0} bytes)")
    titles = [ax["title"] for ax in desc["axes"]]
    check(len(titles) == 4 and all(any(w in t for t in titles) for w in
                                   ("loss", "learning rate", "gradient norm", "tokens")),
          f"four panels: {titles}")
    for ax in desc["axes"]:
        lo, hi = ax["xlim"]
        check(lo <= 1 and hi >= 40, f"'{ax['title']}': x-limits {lo:.1f}..{hi:.1f} cover steps 1..40")
        check(len(ax["lines"]) >= 1, f"'{ax['title']}': has a curve")
    loss_lines = desc["axes"][0]["lines"]
    check(any("train" in l for l in loss_lines) and any("eval" in l for l in loss_lines),
          f"loss panel: train and eval curves ({loss_lines})")
    run = desc["runs"][0]
    check(run["rows"] == 40 and run["steps"] == [1, 40] and run["eval_rows"] == 4,
          f"drawn: 40 rows, steps 1..40, 4 eval rows ({run})")
    check(run["final_loss"] == final, "plot: the final loss as metrics.h5 holds it")
    lo, hi = desc["axes"][1]["ylim"]
    check(lo <= float(np.min(a["lr"])) and hi >= float(np.max(a["lr"])), "lr panel spans the lr")

    # 2. two runs, one given as its folder
    desc2 = json.loads(tool(PLOT, "a/run", "b/run/metrics.h5", "--out", "ab.png", "--json").stdout)
    labels = [r["label"] for r in desc2["runs"]]
    check(len(set(labels)) == 2, f"two runs, two labels ({labels})")
    check(desc2["runs"][1]["rows"] == 25, "the second run: 25 rows")
    check(all(ax["xlim"][0] <= 1 and ax["xlim"][1] >= 40 for ax in desc2["axes"]),
          "two runs: the x-limits cover the longer run")
    check(png_size(os.path.join(OUT, "ab.png")) is not None, "ab.png is a PNG")
    plain = tool(PLOT, "a/run", "--out", "plain.png").stdout
    check("wrote plain.png" in plain, "without --json: says what it wrote")

    # 3. summarize
    text = tool(SUMMARIZE, "a/run", "b/run/metrics.h5").stdout
    print(text)
    rows = [l for l in text.splitlines()[2:] if l.strip()]
    row_a = next((l for l in rows if l.startswith("a/run ")), "")
    check(f"{final:.4f}" in row_a, f"summarize: final loss {final:.4f} in the run's row")
    best = int(np.argmin(a["eval/loss"]))
    check(f"{a['eval/loss'][best]:.4f} @{a['eval/step'][best]}" in row_a,
          "summarize: the best eval loss and its step")
    check("1x1x1=1" in row_a and "1x1x2=2" in text, "summarize: the layouts from config.toml")
    check(len(rows) == 2 and rows[1].startswith("b/run "),
          "summarize: one row per run, named apart though both folders are 'run'")
    check(" 40/40 " in row_a, "summarize: steps 40/40")
    js = [json.loads(l) for l in tool(SUMMARIZE, "--json", "a/run").stdout.splitlines()]
    check(len(js) == 1 and js[0]["final_loss"] == final and js[0]["last_step"] == 40
          and js[0]["steps"] == 40, "summarize --json: the exact final loss, 40 of 40 steps")
    check(js[0]["ranks"] == 1 and js[0]["layout"]["schedule"] == "1f1b",
          "summarize --json: the layout")

    # 4. bad input
    for prog in (PLOT, SUMMARIZE):
        p = tool(prog, "nowhere/metrics.h5", ok=False)
        check(p.returncode != 0 and re.search(r"error: .*nowhere/metrics.h5 not found", p.stderr),
              f"{os.path.basename(prog)}: a missing file is a one-line error")
    check.finish()


if __name__ == "__main__":
    main()
