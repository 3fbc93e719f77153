#!/usr/bin/env python3
"""A requeue chain goes on past a damaged checkpoint (issue 32).

A 2-rank run (dp 2) checkpoints steps 2 and 4 and dies at the start of step 5 (TRIDENT_FAULT
exit). Then its newest checkpoint is damaged in three ways, each on its own copy of the
out_dir: a weight changed under its checksum, a moment dataset deleted, the file cut in half.
Each time `io.resume = "auto"`:
  - warns once, naming the file and what is wrong, and keeps it as step-00000004.h5.damaged;
  - resumes from step 2 and finishes step 6 with the losses of an uninterrupted run, bitwise;
  - a later save of step 4 leaves the damaged copy alone.
What is not damage stays an error and renames nothing: the damaged file named by
`io.resume = PATH`, and a good checkpoint resumed with another train.seed.
"""
import os
import shutil
import sys

import h5py

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import tinyrun as T  # noqa: E402

OUT = T.out_dir("checkpoint.damaged_fallback")
check = T.Checks("checkpoint.damaged_fallback")

DECK = """
[model]
seq_len = 32
n_layer = 2
n_head = 2
d_model = 32
[parallel]
micro_batch_size = 2
[train]
steps = 6
global_batch_size = 4
lr = 3e-3
warmup_steps = 1
[data]
train = "data/train.h5"
[io]
out_dir = "run"
checkpoint_every = 2
keep_checkpoints = 3
[runtime]
threads = 1
"""
CK4 = "checkpoints/step-00000004.h5"


def train(out_dir, *sets, fault=None):
    args = ["train", "deck.toml", "--set", f"io.out_dir={out_dir}"]
    for s in sets:
        args += ["--set", s]
    if fault:
        os.environ["TRIDENT_FAULT"] = fault
    try:
        p = T.trident(*args, cwd=OUT, np_=2, timeout=120, check=False)
    finally:
        os.environ.pop("TRIDENT_FAULT", None)
    return p.returncode, p.stdout + p.stderr


def losses(out_dir):
    m = T.read_metrics(os.path.join(OUT, out_dir, "metrics.h5"))
    return {int(s): float(v) for s, v in zip(m["step"], m["loss"]) if s > 0}


def damage_checksum(path):
    with h5py.File(path, "r+") as f:
        d = f["model/h.0.mlp.c_fc.weight"]
        w = d[...]
        w.flat[7] += 1e-3
        d[...] = w


def damage_missing_dataset(path):
    with h5py.File(path, "r+") as f:
        del f["optimizer/exp_avg_sq/h.1.attn.c_proj.weight"]


def damage_truncated(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    T.make_data(OUT)
    with open(os.path.join(OUT, "deck.toml"), "w") as f:
        f.write(DECK)

    rc, out = train("ref")
    check(rc == 0, "the uninterrupted run finishes")
    ref = losses("ref")
    rc, out = train("died", fault="exit:0:5")
    check(rc != 0 and os.path.exists(os.path.join(OUT, "died", CK4)),
          "a run that dies at step 5 leaves the checkpoints of steps 2 and 4")

    for name, damage, needle in [("checksum", damage_checksum, "checksum"),
                                 ("missing_dataset", damage_missing_dataset, "exp_avg_sq"),
                                 ("truncated", damage_truncated, "")]:
        run = f"run-{name}"
        shutil.copytree(os.path.join(OUT, "died"), os.path.join(OUT, run))
        damage(os.path.join(OUT, run, CK4))
        rc, out = train(run)
        warn = [l for l in out.splitlines() if l.startswith("trident: warning:")
                and "step-00000004.h5" in l]
        check(rc == 0, f"{name}: the requeued run finishes")
        check(len(warn) == 1 and "kept as" in warn[0] and needle in warn[0],
              f"{name}: one warning names the damaged file and what is wrong: {warn}")
        check("resuming from " + run + "/checkpoints/step-00000002.h5" in out,
              f"{name}: resumes from the step-2 checkpoint")
        check(os.path.exists(os.path.join(OUT, run, CK4 + ".damaged")),
              f"{name}: the damaged checkpoint is kept as step-00000004.h5.damaged")
        got = losses(run)
        check(got == ref, f"{name}: losses of steps 1-6 bitwise the uninterrupted run's")

    # Not damage: an explicit path is the user's choice, a seed mismatch the deck's error.
    run = "run-explicit"
    shutil.copytree(os.path.join(OUT, "died"), os.path.join(OUT, run))
    damage_checksum(os.path.join(OUT, run, CK4))
    rc, out = train(run, f"io.resume={run}/{CK4}")
    check(rc != 0 and "checksum" in out and os.path.exists(os.path.join(OUT, run, CK4)),
          "io.resume = PATH to a damaged checkpoint: an error, the file left where it is")
    run = "run-seed"
    shutil.copytree(os.path.join(OUT, "died"), os.path.join(OUT, run))
    rc, out = train(run, "train.seed=7")
    check(rc != 0 and "seed" in out and os.path.exists(os.path.join(OUT, run, CK4))
          and not os.path.exists(os.path.join(OUT, run, CK4 + ".damaged")),
          "another train.seed: an error, no checkpoint set aside")

    check.finish()


if __name__ == "__main__":
    main()
