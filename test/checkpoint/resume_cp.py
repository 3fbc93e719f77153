#!/usr/bin/env python3
"""Context parallelism in training (issue 30): a run at cp 2 (ZeRO-1 over its 2 ranks, clipping
on) follows the serial run's curve (steps 1-8, losses to 1e-5 relative), and its checkpoint of
step 4, which does not record cp, resumes at cp 1 (one rank) and at cp 4 (four ranks) on the
cp 2 run's own curve (steps 5-8 to 1e-5 relative, final weights to 1e-5 of max|w|); resumed at
cp 2 it goes on bitwise, and resumed at cp 2 with parallel.cp_mode = "ulysses" (all-to-all over
heads) on the same curve. The metrics count the ring's traffic (comm/cp) and the gradient sums
over DP x CP (comm/dp_cp) at cp 2, and have no such columns at cp 1; under Ulysses comm/cp is
exactly its five all-to-alls per layer and microbatch.
"""
import os
import shutil
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import tinyrun as T  # noqa: E402

OUT = T.out_dir("checkpoint.resume_cp")
STEPS, AT = 8, 4
check = T.Checks("checkpoint.resume_cp")

# seq_len 16: two chunks of 2 rows per rank at cp 4.
DECK = f"""
[model]
seq_len = 16
n_layer = 2
n_head = 2
d_model = 32
[parallel]
micro_batch_size = 2
[train]
steps = {STEPS}
global_batch_size = 4
lr = 3e-3
warmup_steps = 2
grad_clip = 0.5
[data]
train = "data/train.h5"
[io]
out_dir = "ref"
checkpoint_every = {AT}
keep_checkpoints = 0
resume = "none"
[runtime]
threads = 1
"""


def train(run, cp, resume="none", extra=()):
    args = ["train", "deck.toml", "--set", f"io.out_dir={run}", "--set", f"parallel.cp={cp}",
            "--set", f"io.resume={resume}", *extra]
    p = T.trident(*args, cwd=OUT, np_=cp, check=False)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
    return check(p.returncode == 0, f"{run}: trident train at cp {cp} exits 0")


def metrics(run):
    """Every column of a metrics.h5, by its path ("loss", "comm/cp/bytes", ...)."""
    cols = {}
    with h5py.File(os.path.join(OUT, run, "metrics.h5"), "r") as f:
        f.visititems(lambda k, d: cols.__setitem__(k, d[:]) if isinstance(d, h5py.Dataset) else None)
    return cols


def final_weights(run):
    with h5py.File(T.checkpoint_path(os.path.join(OUT, run), STEPS), "r") as f:
        return {k: f["model"][k][:] for k in f["model"]}


def close_losses(what, got, ref, rows):
    rel = float(np.max(np.abs(got["loss"][rows] - ref["loss"][rows]) / np.abs(ref["loss"][rows])))
    check(rel <= 1e-5, f"{what}: losses of steps {rows.start + 1}-{rows.stop} to 1e-5 relative "
          f"({rel:.1e})")


def resume(run, cp, ref, bitwise, extra=()):
    os.makedirs(os.path.join(OUT, run, "checkpoints"))
    shutil.copy(T.checkpoint_path(os.path.join(OUT, "cp2"), AT),
                os.path.join(OUT, run, "checkpoints"))
    shutil.copy(os.path.join(OUT, "cp2", "metrics.h5"), os.path.join(OUT, run))
    if not train(run, cp, resume="auto", extra=["--set", "parallel.zero_stage=1", *extra]):
        return
    got = metrics(run)
    check(list(got["step"]) == list(range(1, STEPS + 1)), f"{run}: metrics rows 1..{STEPS}")
    if len(got["step"]) != STEPS:
        return
    tail = slice(AT, STEPS)
    if bitwise:
        check(np.array_equal(got["loss"][tail], ref["loss"][tail]),
              f"{run}: steps {AT + 1}-{STEPS} bitwise equal to the uninterrupted cp 2 run")
    else:
        close_losses(run, got, ref, tail)
    a, b = final_weights(run), final_weights("cp2")
    worst = max(float(np.max(np.abs(a[k] - b[k])) / max(np.max(np.abs(b[k])), 1e-30)) for k in b)
    # The attention key biases have zero gradient in exact arithmetic (resume_layouts.py):
    # Adam scales their rounding noise, so the bound is on the other tensors' relative change.
    limit = 0 if bitwise else 1e-5
    worst_no_kb = max(float(np.max(np.abs(a[k] - b[k])) / max(np.max(np.abs(b[k])), 1e-30))
                      for k in b if not k.endswith("attn.c_attn.bias"))
    check((worst if bitwise else worst_no_kb) <= limit,
          f"{run}: final weights max|Δ|/max|w| = {worst_no_kb:.1e} (all: {worst:.1e})")


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    T.make_data(OUT)
    with open(os.path.join(OUT, "deck.toml"), "w") as f:
        f.write(DECK)
    if not (train("serial", 1) and train("cp2", 2, extra=["--set", "parallel.zero_stage=1"])):
        check.finish()
    serial, cp2 = metrics("serial"), metrics("cp2")
    check(list(cp2["step"]) == list(range(1, STEPS + 1)), f"cp2: metrics rows 1..{STEPS}")
    close_losses("cp 2 against the serial run", cp2, serial, slice(0, STEPS))
    for col in ("comm/cp/bytes", "comm/dp_cp/bytes"):
        check(col in cp2 and float(np.min(cp2[col])) > 0, f"cp2: metrics column {col} > 0 every step")
        check(col not in serial, f"serial: no metrics column {col}")
    with h5py.File(T.checkpoint_path(os.path.join(OUT, "cp2"), AT), "r") as f:
        config = f.attrs["config"]
        config = config.decode() if isinstance(config, bytes) else str(config)
        check("seq_len = 16" in config, "the cp 2 checkpoint keeps the deck (h5py reads it)")
        check(all(f["model"][k].shape == f["optimizer/exp_avg"][k].shape for k in f["model"]),
              "the cp 2 checkpoint's moments have the model's logical shapes (ZeRO-1 gathered)")
    resume("resume-cp1", 1, cp2, bitwise=False)
    resume("resume-cp4", 4, cp2, bitwise=False)
    resume("resume-cp2", 2, cp2, bitwise=True)
    resume("resume-cp2-ulysses", 2, cp2, bitwise=False,
           extra=["--set", "parallel.cp_mode=ulysses"])
    if os.path.exists(os.path.join(OUT, "resume-cp2-ulysses", "metrics.h5")):
        # Per layer and microbatch five all-to-alls leave (cp - 1) / cp of their buffers: q|k|v
        # and out forward, out|dout, q|k|v and dq|dk|dv backward; 16 local rows of 32 channels
        # (tp 1: k and v as wide as q), 2 layers, 2 microbatches a step.
        per_call = 0.5 * 4 * 16 * (3 * 96 + 3 * 32)
        got = metrics("resume-cp2-ulysses")["comm/cp/bytes"][AT:]
        check(np.all(got == 2 * 2 * per_call),
              f"resume-cp2-ulysses: comm/cp/bytes {sorted(set(got.tolist()))} per step = "
              f"{2 * 2 * per_call:.0f} (its all-to-alls)")
    check.finish()


if __name__ == "__main__":
    main()
