#!/usr/bin/env python3
"""Peak activation memory of the split-backward schedules against 1F1B (issue 29: ZB-V at no
more than 1F1B's): `trident train` 2 steps of the pipeline bench's model with a 32k vocabulary
(bench/pipeline_bench.py's MODEL, --vocab), m = 8 microbatches of 1 sequence, and rank 0's
start-up / end-of-run memory lines: predicted and measured (RSS above the level before the
stash) activations. Rank 0 is the worst rank in each case here: under 1F1B it holds the most
microbatches in flight, under zb-v it also holds the head. Cases: plain, selective and full
recompute, tp 2 with sequence parallelism (4 ranks), and pp 4 (8 layers: zb-v needs pp*2).
The measured figure includes what the libraries first touch during the step (OpenBLAS's
buffers, ~30 MiB here): compare runs with each other, or raise --seq-len / --micro-batch.

  /usr/bin/python3 bench/activation_memory_bench.py --build build [--out /tmp/actmem]
      [--seq-len 128] [--micro-batch 1] [--cases "pp2,pp2 selective"]
"""
import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from pipeline_bench import random_tokens  # noqa: E402

SIZE = r"([0-9.]+ [KMG]iB)"
END = re.compile(rf"activations {SIZE} \(predicted {SIZE}\)")


def mib(text):
    v, unit = text.split()
    return float(v) * {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[unit]


def run(trident, work, data, name, pp, layers, vocab, sched, sets, seq_len, mbs):
    vpp = 2 if sched == "zb-v" else 1
    out = os.path.join(work, name)
    deck = os.path.join(work, name + ".toml")
    with open(deck, "w") as f:
        f.write(f"""[model]
vocab_size = {vocab}
seq_len = {seq_len}
n_layer = {layers}
n_head = 4
d_model = 256
[parallel]
pp = {pp}
vpp = {vpp}
schedule = "{sched}"
micro_batch_size = {mbs}
[train]
steps = 2
global_batch_size = {8 * mbs}
warmup_steps = 1
[data]
train = "{data}"
[io]
out_dir = "{out}"
resume = "none"
overwrite = true
final_checkpoint = false
[runtime]
threads = 1
""")
    args = []
    for s in sets:
        args += ["--set", s]
    tp = 2 if any(s.startswith("parallel.tp=") for s in sets) else 1
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(["mpirun", "-np", str(pp * tp), "--oversubscribe", "--bind-to", "none",
                        trident, "train", deck] + args, env=env, capture_output=True, text=True)
    m = END.search(p.stdout + p.stderr)
    if p.returncode != 0 or not m:
        return None, None
    return mib(m.group(2)), mib(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="/tmp/activation_memory_bench")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    a = ap.parse_args()
    trident = os.path.join(os.path.abspath(a.build), "trident")
    os.makedirs(a.out, exist_ok=True)
    data = random_tokens(os.path.join(a.out, f"tokens-{a.vocab}.h5"), a.vocab)
    cases = [("pp2", 2, 4, []),
             ("pp2 selective", 2, 4, ["parallel.recompute=selective"]),
             ("pp2 full", 2, 4, ["parallel.recompute=full"]),
             ("tp2 sp pp2", 2, 4, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
             ("pp4", 4, 8, [])]
    print(f"{'case':16s} {'schedule':8s} {'predicted MiB':>14s} {'measured MiB':>13s}")
    for name, pp, layers, sets in cases:
        if a.cases and name not in a.cases.split(","):
            continue
        for sched in ("1f1b", "zb-h1", "zb-v"):
            tag = f"{name.replace(' ', '_')}_{sched}"
            pred, meas = run(trident, a.out, data, tag, pp, layers, a.vocab, sched, sets,
                             a.seq_len, a.micro_batch)
            fmt = lambda x: f"{x:.2f}" if x is not None else "failed"
            print(f"{name:16s} {sched:8s} {fmt(pred):>14s} {fmt(meas):>13s}", flush=True)


if __name__ == "__main__":
    main()
