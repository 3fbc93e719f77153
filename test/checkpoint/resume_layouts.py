#!/usr/bin/env python3
"""Checkpoints do not depend on the layout (issue 6): a run of 10 steps at TP×PP×DP =
2×2×2 (8 ranks) writes a checkpoint at step 5; resuming from it at 1×4×2, 4×1×2, 1×1×8,
2×2×2 with ZeRO-1 (8 ranks) and 1×2×1 (2 ranks) gives the uninterrupted run's losses of
steps 6-10 to 1e-5 relative, and its final weights to 1e-5 relative (max|Δ| / max|w| per
tensor; the attention key biases, whose gradient is zero in exact arithmetic, are held to
staying at rounding noise instead); resuming at 2×2×2 itself gives them bitwise. Clipping is
active (grad_clip 0.5).
Then the reverse direction: a ZeRO-1 checkpoint (2×2×2) resumed serially; and PipeDream-2BW,
whose checkpoint also keeps the older weight version (pipedream_2bw below).
h5py reads the checkpoint and finds FORMAT.md's names, shapes and attributes.
"""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import tinyrun as T  # noqa: E402

OUT = T.out_dir("checkpoint.resume_layouts")
STEPS, AT = 10, 5
V, SEQ, L, H, C = 256, 16, 4, 4, 32
check = T.Checks("checkpoint.resume_layouts")

DECK = f"""
[model]
seq_len = {SEQ}
n_layer = {L}
n_head = {H}
d_model = {C}
[parallel]
micro_batch_size = 1
[train]
steps = {STEPS}
global_batch_size = 8
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

# name, ranks, tp, pp, zero
RESUMES = [("same-2x2x2", 8, 2, 2, 0), ("1x4x2", 8, 1, 4, 0), ("4x1x2", 8, 4, 1, 0),
           ("1x1x8", 8, 1, 1, 0), ("2x2x2-zero1", 8, 2, 2, 1), ("1x2x1", 2, 1, 2, 0)]


def train(run, ranks, tp, pp, zero, resume="none", timeout=300, extra=()):
    args = ["train", "deck.toml", "--set", f"io.out_dir={run}", "--set", f"parallel.tp={tp}",
            "--set", f"parallel.pp={pp}", "--set", f"io.resume={resume}", *extra]
    if zero:
        args += ["--set", "parallel.zero_stage=1"]
    p = T.trident(*args, cwd=OUT, np_=ranks, timeout=timeout, check=False)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
    return p


def losses(run):
    with h5py.File(os.path.join(OUT, run, "metrics.h5"), "r") as f:
        return f["step"][:], f["loss"][:]


def model(path):
    with h5py.File(path, "r") as f:
        return {k: f["model"][k][:] for k in f["model"]}


def compare(name, run, ref_final, bitwise, ref="ref"):
    step, loss = losses(run)
    ref_step, ref_loss = losses(ref)
    check(list(step) == list(range(1, STEPS + 1)), f"{name}: metrics rows 1..{STEPS}")
    if len(step) != STEPS:
        return
    tail, ref_tail = loss[AT:], ref_loss[AT:]
    if bitwise:
        check(np.array_equal(tail, ref_tail), f"{name}: steps {AT + 1}-{STEPS} bitwise equal")
    else:
        rel = float(np.max(np.abs(tail - ref_tail) / np.abs(ref_tail)))
        check(rel <= 1e-5, f"{name}: steps {AT + 1}-{STEPS} losses to 1e-5 relative ({rel:.1e})")
    got = model(T.checkpoint_path(os.path.join(OUT, run), STEPS))
    if not bitwise:
        key_bias_noise(name, got)
    worst = max(float(np.max(np.abs(mask_key_bias(k, got[k]) - mask_key_bias(k, ref_final[k])))
                      / max(np.max(np.abs(ref_final[k])), 1e-30))
                for k in ref_final)
    check(worst <= (0 if bitwise else 1e-5), f"{name}: final weights max|Δ|/max|w| = {worst:.1e}")


# The key slice of c_attn.bias has zero gradient in exact arithmetic (softmax does not change
# when every score of a row moves by q·b_k), so what it receives is rounding noise that Adam
# scales up; that noise differs between layouts (seen: 1.1e-5 of max|w| at 4x1x2 under ASan
# while every other weight agreed to 2e-7). It is held to "stays at noise level" instead.
def key_bias_slice(k):
    return slice(C, 2 * C) if k.endswith("attn.c_attn.bias") else None


def mask_key_bias(k, w):
    s = key_bias_slice(k)
    if s is None:
        return w
    w = w.copy()
    w[s] = 0
    return w


def key_bias_noise(name, weights):
    worst = max(float(np.max(np.abs(w[key_bias_slice(k)])))
                for k, w in weights.items() if key_bias_slice(k) is not None)
    # A real gradient would move it by ~lr per step (3e-3); rounding noise stays near 1e-7.
    check(worst <= 1e-5, f"{name}: attention key biases stay at rounding noise (max|b_k| = {worst:.1e})")


def format_check(path):
    """FORMAT.md's names, shapes and attributes, as h5py sees them."""
    with h5py.File(path, "r") as f:
        a = f.attrs
        ok = (a["format"] in ("trident-checkpoint", b"trident-checkpoint")
              and int(a["step"]) == AT and int(a["consumed_samples"]) == AT * 8
              and all(int(a[k]) == v for k, v in dict(vocab_size=V, seq_len=SEQ, n_layer=L,
                                                         n_head=H, d_model=C).items())
              and "format_version" in a and "[model]" in str(a["config"]))
        check(ok, "h5py: root attributes format, format_version, step, consumed_samples, "
              "config and the model's shape")
        shapes = {"wte": (V, C), "wpe": (SEQ, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
        for i in range(L):
            p = f"h.{i}."
            shapes.update({p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
                           p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,),
                           p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
                           p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
                           p + "mlp.c_fc.weight": (C, 4 * C), p + "mlp.c_fc.bias": (4 * C,),
                           p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,)})
        for g in ("model", "optimizer/exp_avg", "optimizer/exp_avg_sq"):
            got = {k: f[g][k].shape for k in f[g]}
            dtypes = {str(f[g][k].dtype) for k in f[g]}
            check(got == shapes and dtypes == {"float32"},
                  f"h5py: /{g} holds FORMAT.md's {len(shapes)} tensors, float32, logical shapes")


def start_from(run, src_run, step=AT):
    """A fresh out_dir holding src_run's checkpoint of `step` and its metrics; the path."""
    os.makedirs(os.path.join(OUT, run, "checkpoints"))
    shutil.copy(T.checkpoint_path(os.path.join(OUT, src_run), step),
                os.path.join(OUT, run, "checkpoints"))
    shutil.copy(os.path.join(OUT, src_run, "metrics.h5"), os.path.join(OUT, run))
    return T.checkpoint_path(os.path.join(OUT, run), step)


# PipeDream-2BW: step t computes with the older weight version W(t-1), which the checkpoint
# keeps (/previous_model). Resumed at the same layout (pp 2 x dp 2) the run goes on bitwise,
# at pp 2 x dp 1 to 1e-5; the same checkpoint without /previous_model must not (its first
# resumed step computes with W(t)): that shows the group is what carries the state.
def pipedream_2bw():
    sched = ["--set", 'parallel.schedule="pipedream-2bw"']
    if train("2bw", 4, 1, 2, 0, extra=sched).returncode != 0:
        check(False, "the pipedream-2bw pp 2 x dp 2 run")
        return
    final = model(T.checkpoint_path(os.path.join(OUT, "2bw"), STEPS))
    for name, ranks, bitwise in (("2bw-same", 4, True), ("2bw-dp1", 2, False)):
        ck = start_from(f"resume-{name}", "2bw")
        if name == "2bw-same":
            with h5py.File(ck, "r") as f:
                check(sorted(f["previous_model"]) == sorted(f["model"]),
                      "pipedream-2bw: the checkpoint holds /previous_model, tensor by tensor")
        p = train(f"resume-{name}", ranks, 1, 2, 0, resume="auto", extra=sched)
        if check(p.returncode == 0, f"{name}: resumed on {ranks} ranks"):
            compare(name, f"resume-{name}", final, bitwise=bitwise, ref="2bw")
    ck = start_from("resume-2bw-no-previous", "2bw")
    with h5py.File(ck, "a") as f:
        del f["previous_model"]
    p = train("resume-2bw-no-previous", 4, 1, 2, 0, resume="auto", extra=sched)
    if check(p.returncode == 0, "2bw without /previous_model: resumed"):
        a, b = losses("2bw")[1], losses("resume-2bw-no-previous")[1]
        rel = float(np.max(np.abs(a[AT:] - b[AT:]) / np.abs(a[AT:])))
        check(rel > 1e-4, f"2bw without /previous_model departs from the uninterrupted run "
              f"({rel:.1e} relative > 1e-4)")


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    T.make_data(OUT)
    with open(os.path.join(OUT, "deck.toml"), "w") as f:
        f.write(DECK)
    if train("ref", 8, 2, 2, 0).returncode != 0:
        check(False, "the 2x2x2 reference run")
        check.finish()
    ck5 = T.checkpoint_path(os.path.join(OUT, "ref"), AT)
    format_check(ck5)
    ref_final = model(T.checkpoint_path(os.path.join(OUT, "ref"), STEPS))
    for name, ranks, tp, pp, zero in RESUMES:
        run = f"resume-{name}"
        os.makedirs(os.path.join(OUT, run, "checkpoints"))
        shutil.copy(ck5, os.path.join(OUT, run, "checkpoints"))
        shutil.copy(os.path.join(OUT, "ref", "metrics.h5"), os.path.join(OUT, run))
        p = train(run, ranks, tp, pp, zero, resume="auto")
        if check(p.returncode == 0 and f"at step {AT}" in p.stdout,
                 f"{name}: resumed at step {AT} on {ranks} ranks"):
            compare(name, run, ref_final, bitwise=name.startswith("same"))

    # a ZeRO-1 checkpoint (moments sharded over dp in memory) read by one rank
    if train("zero", 8, 2, 2, 1).returncode == 0:
        run = "zero-to-serial"
        os.makedirs(os.path.join(OUT, run, "checkpoints"))
        shutil.copy(T.checkpoint_path(os.path.join(OUT, "zero"), AT), os.path.join(OUT, run, "checkpoints"))
        shutil.copy(os.path.join(OUT, "zero", "metrics.h5"), os.path.join(OUT, run))
        p = train(run, 1, 1, 1, 0, resume="auto")
        if check(p.returncode == 0, "ZeRO-1 2x2x2 checkpoint resumed on one rank"):
            a, b = losses("zero")[1], losses(run)[1]
            rel = float(np.max(np.abs(a[AT:] - b[AT:]) / np.abs(a[AT:])))
            check(rel <= 1e-5, f"ZeRO-1 -> serial: steps {AT + 1}-{STEPS} to 1e-5 relative ({rel:.1e})")
    else:
        check(False, "the 2x2x2 ZeRO-1 run")
    pipedream_2bw()
    check.finish()


if __name__ == "__main__":
    main()
