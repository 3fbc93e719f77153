#!/usr/bin/env python3
"""Elastic restarts (issue 32): parallel.layout = "auto" lets a requeued job go on with the
ranks it was given.

1. a run on 4 ranks with parallel.layout = "auto" and no machine file measures the machine
   (cached as <out_dir>/machine-1x4.toml), prints the layout the planner chose for 4 ranks,
   checkpoints step 2 and dies at the start of step 3 (TRIDENT_FAULT exit: a lost node);
2. the requeue on 2 ranks, with a machine file named by parallel.machine, prints a layout of
   2 ranks, resumes the step-2 checkpoint in it and finishes; steps 1-4 of its metrics.h5 are
   the serial run's to 1e-5 relative (layouts differ in summation order only), and its
   config.toml records the layout it ran (parallel.layout = "deck", the chosen keys), which
   `trident train config.toml` would accept as it stands;
3. a third start on 4 ranks reuses the cached machine file (nothing measured again).
"""
import os
import re
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import tinyrun as T  # noqa: E402

OUT = T.out_dir("cli.elastic_layout")
MACHINE = os.path.join(T.SOURCE, "input", "machines", "h100-sxm-dgx.toml")
check = T.Checks("cli.elastic_layout")

DECK = """
[model]
seq_len = 32
n_layer = 2
n_head = 2
d_model = 32
[parallel]
{parallel}
[train]
steps = 4
global_batch_size = 4
lr = 3e-3
warmup_steps = 1
[data]
train = "data/train.h5"
[io]
out_dir = "{out}"
checkpoint_every = 2
[runtime]
threads = 1
"""
CHOSEN = re.compile(r'parallel\.layout = "auto": tp(\d+)(?: cp(\d+))? pp(\d+) dp(\d+) ')


def run(np_, *args, fault=None, expect=0):
    if fault:
        os.environ["TRIDENT_FAULT"] = fault
    try:
        p = T.trident(*args, cwd=OUT, np_=np_, timeout=240, check=False)
    finally:
        os.environ.pop("TRIDENT_FAULT", None)
    if (p.returncode == 0) != (expect == 0):
        print(p.stdout, p.stderr)
    check((p.returncode == 0) == (expect == 0),
          f"{' '.join(args)} on {np_} ranks exits {'0' if expect == 0 else 'non-zero'} "
          f"(got {p.returncode})")
    return p.stdout + p.stderr


def chosen_world(out, what):
    m = CHOSEN.search(out)
    check(m is not None, f"{what}: prints the layout the planner chose")
    return int(m.group(1)) * int(m.group(2) or 1) * int(m.group(3)) * int(m.group(4)) if m else 0


def losses(out_dir):
    m = T.read_metrics(os.path.join(OUT, out_dir, "metrics.h5"))
    return {int(s): float(v) for s, v in zip(m["step"], m["loss"]) if s > 0}


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    T.make_data(OUT)
    with open(os.path.join(OUT, "serial.toml"), "w") as f:
        f.write(DECK.format(parallel="micro_batch_size = 4", out="serial"))
    with open(os.path.join(OUT, "auto.toml"), "w") as f:
        f.write(DECK.format(parallel='layout = "auto"', out="run"))
    run(1, "train", "serial.toml")

    # 1. four ranks, the machine measured and cached; a rank lost at the start of step 3
    out = run(4, "train", "auto.toml", fault="exit:0:3", expect=1)
    check("measuring this machine" in out, "4 ranks: measures the machine (no machine file)")
    check(chosen_world(out, "4 ranks") == 4, "4 ranks: the chosen layout has 4 ranks")
    check(os.path.exists(os.path.join(OUT, "run", "machine-1x4.toml")),
          "4 ranks: the measured machine is cached in the out_dir")
    check(os.path.exists(os.path.join(OUT, "run", "checkpoints", "step-00000002.h5")),
          "4 ranks: the step-2 checkpoint is there")

    # 2. requeued on 2 ranks with a machine file: resumes in the layout chosen for 2
    out = run(2, "train", "auto.toml", "--set", f"parallel.machine={MACHINE}")
    check("measuring" not in out, "2 ranks: a named machine file is not measured")
    check(chosen_world(out, "2 ranks") == 2, "2 ranks: the chosen layout has 2 ranks")
    check("resuming from run/checkpoints/step-00000002.h5" in out, "2 ranks: resumes step 2")
    ref, got = losses("serial"), losses("run")
    check(sorted(got) == [1, 2, 3, 4], f"steps 1-4 in metrics.h5 (got {sorted(got)})")
    rel = max(abs(got.get(s, np.inf) - ref[s]) / abs(ref[s]) for s in ref)
    check(rel <= 1e-5, f"losses of steps 1-4 to 1e-5 relative of the serial run's ({rel:.1e})")
    with open(os.path.join(OUT, "run", "config.toml")) as f:
        resolved = f.read()
    check('layout = "deck"' in resolved and 'machine = ""' in resolved,
          "config.toml records the layout as keys (parallel.layout = \"deck\")")
    run(2, "train", "run/config.toml", "--set", "train.steps=4")  # accepted: nothing to do

    # 3. four ranks again: the cached machine file, nothing measured
    out = run(4, "train", "auto.toml")
    check("measuring" not in out and "machine-1x4.toml" in out,
          "4 ranks again: the cached machine file is used")

    check.finish()


if __name__ == "__main__":
    main()
