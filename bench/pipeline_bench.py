#!/usr/bin/env python3
"""Pipeline bubbles on this machine, measured against the simulator (bench/bench.py calls
run_pipeline; also runs alone: /usr/bin/python3 bench/pipeline_bench.py --build build).

pp = 2 ranks, one thread each, m = 8 microbatches of 1 sequence, the bench model; for gpipe,
1f1b and zb-h1 `trident train` runs STEPS steps with io.trace_step = STEPS (a warm step) and
tools/plot_pipeline.py reads the two traces: the measured idle fraction of each stage is the
time of the step (first action's start to last action's end over both ranks) it spent
outside F/B/W actions; the bubble is their mean. The simulator's figures (`trident
schedule`: unit costs F = 1, B = 2, or B = W = 1 where the schedule splits B) are the
reference. Prints a table; returns rows for results.json.

Reading the table: the simulator assumes uniform stages, B = 2F (zb-h1: B = W = F) and free
communication. Here the last stage's F also runs the LM head's forward and backward
(vocabulary 4096), so the stages are unequal and the lighter first stage waits; the cores
are shared with other work, so the figures move from run to run (the table prints the load).
BENCH_PIPELINE_WATCHDOG_S > 0 runs with the watchdog, whose waits sleep between polls instead
of spinning (Open MPI's MPI_Wait spins, taking a core from the other rank when they share).
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
PLOT = os.path.join(SRC, "tools", "plot_pipeline.py")
PYTHON = os.environ.get("PYTHON", "/usr/bin/python3")

MODEL = dict(vocab_size=4096, seq_len=128, n_layer=4, n_head=4, d_model=256)
PP, M, MBS = 2, 8, 1
STEPS = int(os.environ.get("BENCH_PIPELINE_STEPS", "3"))
SCHEDULES = ("gpipe", "1f1b", "zb-h1")
WATCHDOG_S = float(os.environ.get("BENCH_PIPELINE_WATCHDOG_S", "0"))


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


def simulate(trident, sched):
    p = subprocess.run([trident, "schedule", "--schedule", sched, "--pp", str(PP),
                        "--microbatches", str(M)], capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_one(trident, work, env, data, sched):
    out_dir = os.path.join(work, f"pipeline-{sched}")
    deck = os.path.join(work, f"pipeline-{sched}.toml")
    model = "\n".join(f"{k} = {v}" for k, v in MODEL.items())
    with open(deck, "w") as f:
        f.write(f"""[model]
{model}
[parallel]
pp = {PP}
schedule = "{sched}"
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
        return {"schedule": sched, "error": f"exited {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}"}
    summary = os.path.join(out_dir, "trace-summary.json")
    q = subprocess.run([PYTHON, PLOT, os.path.join(out_dir, "trace"), "--summary", summary,
                        "--out", os.path.join(out_dir, "timeline.png")],
                       capture_output=True, text=True)
    if q.returncode != 0:
        return {"schedule": sched, "error": f"plot_pipeline.py: {q.stderr.strip()[-400:]}"}
    with open(summary) as f:
        s = json.load(f)
    sim = simulate(trident, sched)
    return {"schedule": sched, "pp": PP, "microbatches": M,
            "measured_idle": [r["idle_fraction"] for r in s["ranks"]],
            "measured_bubble": s["bubble_fraction"], "step_span_ms": s["span_us"] / 1e3,
            "busy_ms": [r["busy_us"] / 1e3 for r in s["ranks"]],
            "simulated_idle": sim["idle_fraction"], "simulated_bubble": sim["bubble_fraction"],
            "timeline": os.path.join(out_dir, "timeline.png")}


def run_pipeline(build, work, env):
    trident = os.path.join(build, "trident")
    data = random_tokens(os.path.join(work, "pipeline-tokens.h5"), MODEL["vocab_size"])
    return [run_one(trident, work, env, data, s) for s in SCHEDULES]


def print_table(rows):
    print(f"\n  pipeline bubbles: pp={PP}, m={M}, 1 thread per rank, bench model "
          f"(L={MODEL['n_layer']}, d_model={MODEL['d_model']}, seq_len={MODEL['seq_len']})")
    try:
        print(f"  (1-minute load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
    except OSError:
        pass
    print("  schedule  step (ms)  busy s0 / s1 (ms)  measured idle s0 / s1   bubble  |"
          "  simulated idle s0 / s1   bubble")
    for r in rows:
        if "error" in r:
            print(f"  {r['schedule']:<8}  {r['error']}")
            continue
        mi, si = r["measured_idle"], r["simulated_idle"]
        bz = r["busy_ms"]
        print(f"  {r['schedule']:<8}  {r['step_span_ms']:9.1f}  {bz[0]:7.1f} / {bz[1]:7.1f}"
              f"  {mi[0]:8.3f} / {mi[1]:.3f}"
              f"       {r['measured_bubble']:.3f}  |  {si[0]:9.3f} / {si[1]:.3f}"
              f"        {r['simulated_bubble']:.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    work = os.path.join(build, "bench-work")
    os.makedirs(work, exist_ok=True)
    rows = run_pipeline(build, work, dict(os.environ))
    print_table(rows)
    out = os.environ.get("OUT") or work
    path = os.path.join(out, "pipeline-results.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=2)
    print(f"results: {path}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
