#!/usr/bin/env python3
"""Pipeline bubbles on this machine, measured against the simulator (bench/bench.py calls
run_pipeline; also runs alone: /usr/bin/python3 bench/pipeline_bench.py --build build).

pp = 2 ranks (BENCH_PIPELINE_PP or --pp: another count), one thread each, m = 8 microbatches
of 1 sequence, the bench model; for gpipe,
1f1b, zb-h1, zb-v (parallel.vpp = 2: two chunks per rank in a V; its 4 layers allow pp 2
only) and pipedream-2bw (--schedules: another list) `trident train` runs STEPS steps with io.trace_step = STEPS (a warm step) and
tools/plot_pipeline.py reads the two traces: the measured idle fraction of each stage is the
time of the step (first action's start to last action's end over both ranks) it spent
outside F/B/W actions; the bubble is their mean. The simulator's figures (`trident
schedule`: unit costs F = 1, B = 2, or B = W = 1 where the schedule splits B) are the
reference. Prints a table; returns rows for results.json.

Reading the table: the simulator assumes uniform stages, B = 2F (zb-h1: B = W = F) and free
communication. Here the last stage's F also runs the LM head's forward and backward
(vocabulary 4096), so the stages are unequal and the lighter first stage waits; the cores
are shared with other work, so the figures move from run to run (the table prints the load).
--compare OTHER_BUILD runs the same with OTHER_BUILD's trident first and prints each
schedule's mean measured idle fraction before (OTHER_BUILD) and after (--build): e.g. the
build before receives were posted ahead of their actions (pipeline/lower.hpp), at
--pp 4.
--vocab V and --layers L change the bench model's vocabulary and depth; --splits even,auto
runs every schedule under each parallel.pipeline_layers (issue 29) and prints, per schedule,
the step time of each split and the auto split's speed-up, with the start-up line's
`expected bubble` (each virtual stage simulated at its predicted cost when the split is
uneven). E.g. a head that dominates: --pp 4 --layers 16 --vocab 32000 --splits even,auto
--schedules 1f1b,zb-h1.
BENCH_PIPELINE_WATCHDOG_S > 0 runs with the watchdog, whose waits sleep between polls instead
of spinning (Open MPI's MPI_Wait spins, taking a core from the other rank when they share).
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
PLOT = os.path.join(SRC, "tools", "plot_pipeline.py")
PYTHON = os.environ.get("PYTHON", "/usr/bin/python3")

MODEL = dict(vocab_size=4096, seq_len=128, n_layer=4, n_head=4, d_model=256)
PP, M, MBS = int(os.environ.get("BENCH_PIPELINE_PP", "2")), 8, 1
STEPS = int(os.environ.get("BENCH_PIPELINE_STEPS", "3"))
# pipedream-2bw (issue 20): asynchronous, one window per step; its throughput beside 1F1B's.
SCHEDULES = ("gpipe", "1f1b", "zb-h1", "zb-v", "pipedream-2bw")
VPP = {"zb-v": 2}  # chunks per rank where a schedule needs more than one
WATCHDOG_S = float(os.environ.get("BENCH_PIPELINE_WATCHDOG_S", "0"))
SPLITS = ("even",)  # parallel.pipeline_layers of each run (--splits)


def random_tokens(path, vocab):
    import h5py
    import numpy as np
    if os.path.exists(path):
        return path
    with h5py.File(path, "w") as f:
        f["tokens"] = np.random.default_rng(0).integers(0, vocab, 200000).astype(np.int32)
        f.attrs["vocab_size"] = vocab
        f.attrs["tokenizer"] = "sentencepiece"
        f["tokenizer/model"] = np.zeros(1, np.uint8)  # never decoded by training
    return path


def mean(xs):
    return sum(xs) / len(xs)


def simulate(trident, sched):
    p = subprocess.run([trident, "schedule", "--schedule", sched, "--pp", str(PP),
                        "--microbatches", str(M), "--vpp", str(VPP.get(sched, 1))],
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_one(trident, work, env, data, sched, split="even"):
    name = sched if split == "even" else f"{sched}-{split}"
    out_dir = os.path.join(work, f"pipeline-{name}")
    deck = os.path.join(work, f"pipeline-{name}.toml")
    model = "\n".join(f"{k} = {v}" for k, v in MODEL.items())
    with open(deck, "w") as f:
        f.write(f"""[model]
{model}
[parallel]
pp = {PP}
vpp = {VPP.get(sched, 1)}
schedule = "{sched}"
pipeline_layers = "{split}"
micro_batch_size = {MBS}
[train]
steps = {STEPS}
global_batch_size = {M * MBS}
warmup_steps = 1
[data]
train = "{data}"
[io]
out_dir = "{out_dir}"
resume = "none"
overwrite = true
trace_step = {STEPS}
[runtime]
threads = 1
watchdog_s = {WATCHDOG_S}
""")
    e = dict(env)
    e.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    p = subprocess.run(["mpirun", "-np", str(PP), "--oversubscribe", "--bind-to", "none",
                        trident, "train", deck], env=e, capture_output=True, text=True)
    if p.returncode != 0:
        return {"schedule": sched, "split": split, "error": f"exited {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}"}
    summary = os.path.join(out_dir, "trace-summary.json")
    q = subprocess.run([PYTHON, PLOT, os.path.join(out_dir, "trace"), "--summary", summary,
                        "--out", os.path.join(out_dir, "timeline.png")],
                       capture_output=True, text=True)
    if q.returncode != 0:
        return {"schedule": sched, "split": split, "error": f"plot_pipeline.py: {q.stderr.strip()[-400:]}"}
    with open(summary) as f:
        s = json.load(f)
    sim = simulate(trident, sched)
    # The start-up lines: the split's layers (printed when uneven) and its expected bubble.
    log = p.stdout + p.stderr
    stages = PP * VPP.get(sched, 1)
    layers = re.search(r"layers per virtual stage \[([0-9, ]+)\]", log)
    expected = re.search(r"expected bubble ([0-9.]+)", log)
    return {"schedule": sched, "split": split, "pp": PP, "microbatches": M,
            "layers": ([int(x) for x in layers.group(1).split(",")] if layers
                       else [MODEL["n_layer"] // stages] * stages),
            "expected_bubble": float(expected.group(1)) if expected else None,
            "measured_idle": [r["idle_fraction"] for r in s["ranks"]],
            "measured_bubble": s["bubble_fraction"], "step_span_ms": s["span_us"] / 1e3,
            "tokens_per_s": M * MBS * MODEL["seq_len"] / (s["span_us"] / 1e6),
            "busy_ms": [r["busy_us"] / 1e3 for r in s["ranks"]],
            "simulated_idle": sim["idle_fraction"], "simulated_bubble": sim["bubble_fraction"],
            "timeline": os.path.join(out_dir, "timeline.png")}


def run_pipeline(build, work, env):
    trident = os.path.join(build, "trident")
    data = random_tokens(os.path.join(work, f"pipeline-tokens-{MODEL['vocab_size']}.h5"),
                         MODEL["vocab_size"])
    return [run_one(trident, work, env, data, s, split) for s in SCHEDULES for split in SPLITS]


def label(r):
    return r["schedule"] if r.get("split", "even") == "even" else f"{r['schedule']} {r['split']}"


def print_splits(rows):
    """Per schedule: each split's layers, step and start-up expected bubble; auto's speed-up."""
    print(f"\n  layer splits at pp={PP}, m={M}: measured step (first to last action) and the "
          f"start-up line's expected bubble")
    print(f"  {'schedule':<14} {'split':<6} {'layers':<16} {'step (ms)':>9}  {'measured':>8}  "
          f"{'expected':>8}  speed-up")
    for sched in SCHEDULES:
        mine = {r["split"]: r for r in rows if r["schedule"] == sched and "error" not in r}
        for split in SPLITS:
            r = mine.get(split)
            if r is None:
                print(f"  {sched:<14} {split:<6} (failed)")
                continue
            even = mine.get("even")
            up = (f"{even['step_span_ms'] / r['step_span_ms'] - 1:+.1%}"
                  if even and split != "even" else "")
            exp = f"{r['expected_bubble']:.3f}" if r["expected_bubble"] is not None else "-"
            print(f"  {sched:<14} {split:<6} {','.join(map(str, r['layers'])):<16} "
                  f"{r['step_span_ms']:9.1f}  {r['measured_bubble']:8.3f}  {exp:>8}  {up}")


def print_table(rows):
    print(f"\n  pipeline bubbles: pp={PP}, m={M}, 1 thread per rank, bench model "
          f"(L={MODEL['n_layer']}, d_model={MODEL['d_model']}, seq_len={MODEL['seq_len']}, "
          f"vocab={MODEL['vocab_size']})")
    try:
        print(f"  (1-minute load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
    except OSError:
        pass
    stages = " / ".join(f"s{i}" for i in range(PP))
    print(f"  {'schedule':<19}  step (ms)  tokens/s  busy {stages} (ms)  measured idle {stages}"
          f"   bubble  |  simulated idle {stages}   bubble")
    for r in rows:
        if "error" in r:
            print(f"  {label(r):<19}  {r['error']}")
            continue
        mi, si = r["measured_idle"], r["simulated_idle"]
        bz = " / ".join(f"{b:7.1f}" for b in r["busy_ms"])
        print(f"  {label(r):<19}  {r['step_span_ms']:9.1f}  {r['tokens_per_s']:8.0f}  {bz}"
              f"  {' / '.join(f'{x:.3f}' for x in mi)}"
              f"       {r['measured_bubble']:.3f}  |  {' / '.join(f'{x:.3f}' for x in si)}"
              f"        {r['simulated_bubble']:.3f}")


def print_compare(before, after):
    print(f"\n  measured idle, mean over the {PP} stages: before -> after")
    for b, a in zip(before, after):
        if "error" in b or "error" in a:
            print(f"  {a['schedule']:<8}  {b.get('error') or a.get('error')}")
            continue
        print(f"  {a['schedule']:<8}  {mean(b['measured_idle']):.3f} -> "
              f"{mean(a['measured_idle']):.3f}   (simulated {mean(a['simulated_idle']):.3f})")


def main():
    global PP, SCHEDULES, SPLITS
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--pp", type=int, default=PP)
    ap.add_argument("--compare", help="another build to measure first (before -> after)")
    ap.add_argument("--schedules", default=",".join(SCHEDULES),
                    help="comma-separated schedules to measure (default: %(default)s)")
    ap.add_argument("--vocab", type=int, default=MODEL["vocab_size"],
                    help="vocabulary of the bench model (default: %(default)s)")
    ap.add_argument("--layers", type=int, default=MODEL["n_layer"],
                    help="n_layer of the bench model (default: %(default)s)")
    ap.add_argument("--splits", default=",".join(SPLITS),
                    help="comma-separated parallel.pipeline_layers to run each schedule with "
                         "(even, auto; default: %(default)s)")
    a = ap.parse_args()
    PP = a.pp
    MODEL["vocab_size"], MODEL["n_layer"] = a.vocab, a.layers
    SPLITS = tuple(x for x in a.splits.split(",") if x)
    SCHEDULES = tuple(x for x in a.schedules.split(",") if x)
    build = os.path.abspath(a.build)
    work = os.path.join(build, "bench-work")
    os.makedirs(work, exist_ok=True)
    before = None
    if a.compare:
        other = os.path.abspath(a.compare)
        before_work = os.path.join(work, "before")
        os.makedirs(before_work, exist_ok=True)
        before = run_pipeline(other, before_work, dict(os.environ))
        print_table(before)
    rows = run_pipeline(build, work, dict(os.environ))
    print_table(rows)
    if len(SPLITS) > 1:
        print_splits(rows)
    if before:
        print_compare(before, rows)
    out = os.environ.get("OUT") or work
    path = os.path.join(out, "pipeline-results.json")
    with open(path, "w") as f:
        json.dump(rows if before is None else {"before": before, "after": rows}, f, indent=2)
    print(f"results: {path}")
    return 1 if any("error" in r for r in rows + (before or [])) else 0


if __name__ == "__main__":
    sys.exit(main())
