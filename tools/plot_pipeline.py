#!/usr/bin/env python3
"""Draws the pipeline traces of a run (io.trace_step; <out_dir>/trace/rank-<r>.json, Chrome
trace format) as one timeline PNG: a row per rank (ordered by pipeline rank), a box per
action (F blue, B green, W orange, labelled F3 / B3.1 when wide enough) and a thin grey box
per MPI wait. Also prints, per rank, the actions in the order they ran and the idle
fraction: the time of the step (first action's start to last action's end over ALL ranks,
as the simulator's bubble counts it) spent outside F/B/W actions.

    /usr/bin/python3 tools/plot_pipeline.py OUT/trace [--out timeline.png] [--summary s.json]

Needs only json and matplotlib.
"""
import argparse
import glob
import json
import os
import sys

COLORS = {"F": "#4C72B0", "B": "#55A868", "W": "#DD8452"}


def load(folder_or_files):
    files = []
    for p in folder_or_files:
        files += sorted(glob.glob(os.path.join(p, "rank-*.json"))) if os.path.isdir(p) else [p]
    if not files:
        sys.exit(f"plot_pipeline: no rank-*.json under {' '.join(folder_or_files)}")
    ranks = []
    for path in files:
        with open(path) as f:
            doc = json.load(f)
        other = doc.get("otherData", {})
        events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        events.sort(key=lambda e: e["ts"])
        ranks.append({"path": path, "other": other, "events": events})
    ranks.sort(key=lambda r: (r["other"].get("pp_rank", 0), r["other"].get("rank", 0)))
    return ranks


def summarize(ranks):
    actions = [e for r in ranks for e in r["events"] if e["cat"] in COLORS]
    if not actions:
        sys.exit("plot_pipeline: the traces hold no actions")
    t0 = min(e["ts"] for e in actions)
    t1 = max(e["ts"] + e["dur"] for e in actions)
    span = t1 - t0
    out = {"span_us": span, "t0_us": t0, "ranks": []}
    for r in ranks:
        acts = [e for e in r["events"] if e["cat"] in COLORS]
        waits = [e for e in r["events"] if e["cat"] == "wait"]
        busy = sum(e["dur"] for e in acts)
        o = r["other"]
        out["ranks"].append({
            "rank": o.get("rank"), "pp_rank": o.get("pp_rank"), "schedule": o.get("schedule"),
            "actions": " ".join(e["name"] for e in acts),
            "executed": o.get("executed"), "peak_live": o.get("peak_live"),
            "busy_us": busy, "wait_us": sum(e["dur"] for e in waits),
            "idle_fraction": 1.0 - busy / span if span > 0 else 0.0})
    out["bubble_fraction"] = sum(r["idle_fraction"] for r in out["ranks"]) / len(out["ranks"])
    return out


def plot(ranks, summary, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = summary["t0_us"]
    fig, ax = plt.subplots(figsize=(12, 0.7 * len(ranks) + 1.5))
    for row, r in enumerate(ranks):
        y = len(ranks) - 1 - row
        for e in r["events"]:
            x, w = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
            if e["cat"] == "wait":
                ax.barh(y, w, left=x, height=0.25, color="#BBBBBB")
                continue
            ax.barh(y, w, left=x, height=0.7, color=COLORS[e["cat"]], edgecolor="black",
                    linewidth=0.3)
            if w > summary["span_us"] / 1e3 / 60:
                ax.text(x + w / 2, y, e["name"], ha="center", va="center", fontsize=6,
                        color="white")
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r['other'].get('rank')} (pp {r['other'].get('pp_rank')})"
                        for r in reversed(ranks)])
    ax.set_xlabel("ms since the step's first action")
    o = ranks[0]["other"]
    ax.set_title(f"{o.get('schedule')}  pp={o.get('pp')} vpp={o.get('vpp')} "
                 f"m={o.get('microbatches')}  step {o.get('step')}: measured bubble "
                 f"{summary['bubble_fraction']:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", help="a trace folder, or rank-*.json files")
    ap.add_argument("--out", help="PNG to write (default: <folder>/timeline.png)")
    ap.add_argument("--summary", help="also write the summary as JSON here")
    a = ap.parse_args()
    ranks = load(a.traces)
    s = summarize(ranks)
    for r in s["ranks"]:
        print(f"rank {r['rank']} (pp {r['pp_rank']}): idle {r['idle_fraction']:.3f} | "
              f"{r['actions']}")
    print(f"bubble (mean idle fraction over ranks): {s['bubble_fraction']:.3f}")
    if a.summary:
        with open(a.summary, "w") as f:
            json.dump(s, f, indent=1)
    first = a.traces[0]
    out = a.out or os.path.join(first if os.path.isdir(first) else os.path.dirname(first),
                                "timeline.png")
    plot(ranks, s, out)
    print(f"timeline: {out}")


if __name__ == "__main__":
    main()
