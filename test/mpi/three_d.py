#!/usr/bin/env python3
"""The whole 3D composition (TP x PP x DP) on 8 ranks, with and without ZeRO-1, against the
serial run.

Layouts (tp x pp x dp): 2x2x2 (with sequence parallelism), 1x1x8, 8x1x1 (n_head 8),
1x2x4, 4x2x1 with zb-h1, 2x4x1 with interleaved-1f1b at vpp 2 (8 layers: one per virtual
stage). Each layout, with parallel.zero_stage 0 and (where dp > 1; at dp = 1 it is the
no-op checked bitwise on the serial run) 1, and small DP buckets
(parallel.grad_bucket_mb, so that several buckets overlap the backward):
  - `trident grad` gives the serial loss (1e-6 relative) and gradients
    (max|d| <= 1e-5 * max|g| per tensor); under ZeRO-1 (its reduce-scatter, then the
    all-gather a gradient dump or a checkpoint's moments take) at 1x2x4 only: in the other
    ZeRO-1 layouts the training checks below catch a wrong reduce-scatter (two gradient
    elements of one bucket swapped: final weights 4.7e-4, exp_avg 1.7e-3 at 1x1x8);
  - 10 training steps with clipping active give the serial loss curve (1e-5 relative),
    and the final checkpoint's /model the serial weights to 1e-5 relative (|dw|/|w|, L2
    over the whole model) and its /optimizer/exp_avg the serial first moments to 1e-4
    (the same measure; the moments carry the gradients' rounding unscaled by the lr). A
    per-tensor max|d|/max|w| is not used for the weights: AdamW's m/(sqrt(v)+eps) turns
    the rounding of a near-zero gradient into an O(lr) step, so a bias that starts at 0
    differs by ~4e-4 of its own max after 10 steps even under pure TP (8x1x1);
  - comm/dp/bytes per step on rank 0 equals the ring formula for rank 0's N0 parameters
    (from the start-up report): 2(p-1)/p * (4*N0 + 8) — every gradient allreduced, plus the
    loss (float64) — and with ZeRO-1 2(p-1)/p * (4*N0 + 16): reduce-scatter plus
    all-gather of the same N0 floats, the loss and the sharded grad norm;
  - the DP buckets start during the backward (the `dp sync:` line: all of them at 1x1x8);
  - the start-up report's optimizer-state bytes on rank 0 are 8*N0 without ZeRO and
    shrink by dp with it (between 8*N0/dp and 8*N0/dp + 8 per bucket).
Resume under ZeRO-1: the 1x2x4 run's step-5 checkpoint resumed in the same layout gives
steps 6..10 bitwise, and resumed at 2x2x2 (other shards) the serial curve.
Llama (model.arch = "llama", n_kv_head 2 of 8 heads, ffn_hidden 48): every layout above gives
the serial loss and gradients (kv heads split at tp 2, replicated at tp 4 and 8); 2x2x2 with
sequence parallelism and 1x2x4 with ZeRO-1 train on the serial curve to the serial final
weights; and the 2x2x2 run's step-5 checkpoint resumes at 1x1x1 and at 1x4x2 on the serial
curve. (Training in every layout was checked too, once: it costs 4 more minutes.)
2D tensor parallelism (parallel.tp_mode = "2d", tp 4 as a 2 x 2 grid, micro_batch_size 2):
tp4 x pp2 (1f1b, the tied wte over two stages) trains on the serial curve to the serial final
weights and moments; its step-5 checkpoint resumes in 1D (tp 4, 4 ranks), and the 1x2x4
ZeRO-1 run's (1D) resumes in 2D at tp4 x dp2 with ZeRO-1, both on the serial curve to the
serial final weights.
Bad input: a global batch that does not split over micro_batch_size * dp, and a world
size no layout of the deck fits, give one `trident: error:` line naming the key and a
non-zero exit; zero_stage = 1 at dp = 1 trains like the serial run (a no-op).
"""
import sys
import os
import re
import shutil
import subprocess

import h5py
import numpy as np

from layout_common import TRIDENT, LayoutTest, deck_text

V, T, L, H, C, MBS, GBS, STEPS = 101, 16, 8, 8, 32, 1, 8, 10
BUCKET_MB = 0.01  # 2621 floats: a block spans several buckets

LAYOUTS = [  # name, tp, pp, dp, extra --set
    ("2x2x2_sp", 2, 2, 2, ["parallel.sequence_parallel=true"]),
    ("1x1x8", 1, 1, 8, []),
    ("8x1x1", 8, 1, 1, []),
    ("1x2x4", 1, 2, 4, []),
    ("4x2x1_zbh1", 4, 2, 1, ["parallel.schedule=zb-h1"]),
    ("2x4x1_interleaved_vpp2", 2, 4, 1, ["parallel.schedule=interleaved-1f1b",
                                         "parallel.vpp=2"]),
]


def overlap(stdout):
    """(buckets started during the backward, buckets) from the `dp sync:` line, or None."""
    m = re.search(r"dp sync: (\d+) of (\d+) buckets started during the backward", stdout)
    return (int(m.group(1)), int(m.group(2))) if m else None


def startup(stdout):
    """(N0, state bytes on rank 0, buckets) from the start-up report."""
    m = re.search(r"(\d+) parameters on rank 0 .*optimizer state (\d+) bytes on rank 0 .*?"
                  r"(\d+) DP buckets?", stdout)
    assert m, f"no start-up report in:\n{stdout[-1500:]}"
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def rel_l2(path, ref_path, group):
    """|d|/|ref| over every tensor of the group, and the tensor with the largest |d|."""
    with h5py.File(path, "r") as f, h5py.File(ref_path, "r") as r:
        d2 = {k: float(((f[group][k][:].astype(np.float64) - r[group][k][:]) ** 2).sum())
              for k in r[group]}
        ref2 = sum(float((r[group][k][:].astype(np.float64) ** 2).sum()) for k in r[group])
    return float(np.sqrt(sum(d2.values()) / ref2)), max(d2, key=d2.get)


def resume_checks(t, ref_curve, sets):
    src = "train_1x2x4_zero1"
    with h5py.File(t.path(src, "metrics.h5"), "r") as f:  # the uninterrupted run
        full = f["loss"][:]
    shutil.copytree(t.path(src), t.path("resume_same"))
    os.remove(t.path("resume_same", "checkpoints", f"step-{STEPS:08d}.h5"))
    (got,) = t.train(8, "resume_same", [*sets, "io.resume=auto"])
    t.check(np.array_equal(got, full),
            "resume 1x2x4 zero1 from step 5 in the same layout: steps 6..10 bitwise")
    cross = ["parallel.tp=2", "parallel.pp=2", "parallel.zero_stage=1",
             f"parallel.grad_bucket_mb={BUCKET_MB}",
             f"io.resume={src}/checkpoints/step-{5:08d}.h5"]
    (got,) = t.train(8, "resume_cross", cross)
    got = got[-5:]
    rel = float(np.max(np.abs(got - ref_curve[5:]) / np.abs(ref_curve[5:])))
    t.check(len(got) == 5 and rel <= 1e-5,
            f"resume the 1x2x4 zero1 step-5 checkpoint at 2x2x2 zero1: steps 6..10 within "
            f"1e-5 of serial ({rel:.2e})")


def two_d(t, ref_curve, ref_ck, bucket):
    """2D TP against the serial run, and checkpoints across 1D and 2D (3 runs: the
    gradients of 2D alone and with pp 2 are oracle.grad's tp4_2d and tp4_pp2_2d)."""
    base = ["parallel.tp=4", "parallel.tp_mode=2d", "parallel.micro_batch_size=2", bucket]
    name = "2d_4x2x1"
    got = t.train(8, f"train_{name}", [*base, "parallel.pp=2", "io.checkpoint_every=5"])[0]
    t.check_curve(name, got, ref_curve)
    ck = t.path(f"train_{name}", "checkpoints", f"step-{STEPS:08d}.h5")
    w = rel_l2(ck, ref_ck, "model")
    t.check(w[0] <= 1e-5, f"train {name}: final weights |d|/|w| = {w[0]:.2e} (most in {w[1]})")
    m = rel_l2(ck, ref_ck, "optimizer/exp_avg")
    t.check(m[0] <= 1e-4, f"train {name}: final exp_avg |d|/|m| = {m[0]:.2e} (most in {m[1]})")
    for what, np_, src, sets in (
            ("the 2D tp4 x pp2 step-5 checkpoint resumed in 1D tp4", 4, "train_2d_4x2x1",
             ["parallel.tp=4"]),
            ("the 1D 1x2x4 step-5 checkpoint resumed in 2D tp4 x dp2 with ZeRO-1", 8,
             "train_1x2x4_zero1", [*base, "parallel.zero_stage=1"])):
        out = f"resume_{np_}_{src}"
        got = t.train(np_, out, [*sets, f"io.resume={src}/checkpoints/step-{5:08d}.h5"])[0]
        rel = float(np.max(np.abs(got[-5:] - ref_curve[5:]) / np.abs(ref_curve[5:])))
        t.check(len(got) == 5 and rel <= 1e-5,
                f"{what}: steps 6..10 within 1e-5 of serial ({rel:.2e})")
        w = rel_l2(t.path(out, "checkpoints", f"step-{STEPS:08d}.h5"), ref_ck, "model")
        t.check(w[0] <= 1e-5, f"{what}: final weights |d|/|w| = {w[0]:.2e} (most in {w[1]})")


def bad_input(t):
    cases = [  # what, np, sets, key the message must name
        ("global batch over mbs*dp", 2, ["parallel.micro_batch_size=8"], "train.global_batch_size"),
        # 3 ranks: config.cpp's resolve_world takes the same branches as at 6 or 8 (tp * pp
        # does not divide the world; tp * pp * dp is not the world), at half the start-up.
        ("world no layout fits", 3, ["parallel.tp=2"], "parallel.tp * parallel.pp"),
        ("dp fixed against the world", 3, ["parallel.dp=2"], "parallel.dp"),
    ]
    for what, np_, sets, key in cases:
        cmd = ["mpirun", "-np", str(np_), "--oversubscribe", TRIDENT, "train", "deck.toml",
               "--set", "io.out_dir=bad"]
        for kv in sets:
            cmd += ["--set", kv]
        try:
            p = subprocess.run(cmd, cwd=t.out, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            t.check(False, f"bad input ({what}): no hang")
            continue
        errs = [l for l in p.stderr.splitlines() if l.startswith("trident: error:")]
        t.check(p.returncode != 0 and len(set(errs)) == 1 and key in errs[0],
                f"bad input ({what}): exit {p.returncode}, one error naming {key}: "
                f"{errs[0] if errs else p.stderr[-300:]!r}")


LLAMA_KEYS = 'arch = "llama"\nn_kv_head = 2\nffn_hidden = 48\n'


def llama(bucket):
    """The layouts of LAYOUTS with Llama blocks against their own serial run, and resuming
    the 2x2x2 checkpoint elsewhere."""
    deck = deck_text(V, T, L, H, C, MBS, GBS, STEPS, 2).replace("[parallel]",
                                                                LLAMA_KEYS + "[parallel]", 1)
    t = LayoutTest("mpi.three_d_llama", deck, V, T, GBS, 12)
    ref = t.grad(1, "g1.h5")
    ref_curve = t.train(1, "serial")[0]
    ref_ck = t.path("serial", "checkpoints", f"step-{STEPS:08d}.h5")
    for i, (name, tp, pp, dp, extra) in enumerate(LAYOUTS):
        tag = f"{name}_zero{i % 2}"
        sets = [f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.zero_stage={i % 2}",
                bucket, "io.checkpoint_every=5", *extra]
        t.check_grad(f"llama {tag}", t.grad(8, f"g_{tag}.h5", sets), ref, 1e-6)
        if name not in ("2x2x2_sp", "1x2x4"):
            continue
        got = t.train(8, f"train_{tag}", sets)[0]
        t.check_curve(f"llama {tag}", got, ref_curve)
        w = rel_l2(t.path(f"train_{tag}", "checkpoints", f"step-{STEPS:08d}.h5"), ref_ck, "model")
        t.check(w[0] <= 1e-5, f"train llama {tag}: final weights |d|/|w| = {w[0]:.2e} (most in {w[1]})")
    ck = f"train_{LAYOUTS[0][0]}_zero0/checkpoints/step-{5:08d}.h5"
    for np_, tp, pp in ((1, 1, 1), (8, 1, 4)):
        out = f"resume_{tp}x{pp}x{np_ // (tp * pp)}"
        got = t.train(np_, out, [f"parallel.tp={tp}", f"parallel.pp={pp}", f"io.resume={ck}"])[0]
        rel = float(np.max(np.abs(got[-5:] - ref_curve[5:]) / np.abs(ref_curve[5:])))
        t.check(len(got) == 5 and rel <= 1e-5,
                f"llama: the 2x2x2 step-5 checkpoint resumed at {out}: steps 6..10 within 1e-5 "
                f"of serial ({rel:.2e})")
    return t


def main():
    bucket = f"parallel.grad_bucket_mb={BUCKET_MB}"
    if sys.argv[1:] == ["llama"]:  # mpi.three_d.llama: its own CTest entry and time limit
        llama(bucket).finish()
        return
    t = LayoutTest("mpi.three_d", deck_text(V, T, L, H, C, MBS, GBS, STEPS, 2), V, T, GBS, 11)
    ref = t.grad(1, "g1.h5")
    ref_curve, ref_norm = t.train(1, "serial", columns=("loss", "grad_norm"))
    t.check(np.all(ref_norm > 0.5), "clipping is active in the reference run")
    ref_ck = t.path("serial", "checkpoints", f"step-{STEPS:08d}.h5")

    # zero_stage = 1 at dp = 1: a no-op, the serial curve.
    got = t.train(1, "serial_zero1", ["parallel.zero_stage=1"])[0]
    t.check(np.array_equal(got, ref_curve), "zero_stage=1 at dp=1: the serial curve, bitwise")

    for name, tp, pp, dp, extra in LAYOUTS:
        # At dp = 1 ZeRO-1 has nothing to shard (checked bitwise above): one run is enough.
        for zero in ((0, 1) if dp > 1 else (0,)):
            tag = f"{name}_zero{zero}"
            sets = [f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.zero_stage={zero}",
                    bucket, "io.checkpoint_every=5", *extra]
            # `trident grad` under ZeRO-1 (reduce-scatter, then gather_gradients' all-gather)
            # in one layout, 1x2x4: elsewhere the zero-1 run's training below checks the
            # same reduce-scatter (curve, final weights and moments against serial), and its
            # zero-0 twin the local gradients.
            if not zero or name == "1x2x4":
                t.check_grad(tag, t.grad(8, f"g_{tag}.h5", sets), ref, 1e-6)
            got, dp_b = t.train(8, f"train_{tag}", sets, ("loss", "comm/dp/bytes"))
            n0, state, buckets = startup(t.last_stdout)
            if dp > 1:
                # Every bucket starts inside the backward, except (rank 0 is the first stage)
                # the one holding wte when it is tied across stages, and under sequence
                # parallelism those holding LayerNorms (both wait for a later reduction).
                early, total = overlap(t.last_stdout) or (0, 0)
                want_all = pp == 1 and "parallel.sequence_parallel=true" not in extra
                t.check(total == buckets and total > 1 and
                        (early == total if want_all else 1 <= early < total),
                        f"train {tag}: {early} of {total} DP buckets started during the backward")
            t.check_curve(tag, got, ref_curve)
            ck = t.path(f"train_{tag}", "checkpoints", f"step-{STEPS:08d}.h5")
            w = rel_l2(ck, ref_ck, "model")
            t.check(w[0] <= 1e-5,
                    f"train {tag}: final weights |d|/|w| = {w[0]:.2e} (most in {w[1]})")
            m = rel_l2(ck, ref_ck, "optimizer/exp_avg")
            t.check(m[0] <= 1e-4,
                    f"train {tag}: final exp_avg |d|/|m| = {m[0]:.2e} (most in {m[1]})")
            r = 2 * (dp - 1) / dp
            want = r * (4 * n0 + (16 if zero and dp > 1 else 8))
            t.check(np.allclose(dp_b, want, rtol=1e-12, atol=0),
                    f"train {tag}: comm/dp/bytes {dp_b[0]:.0f} = 2(p-1)/p*(4*{n0}+...) "
                    f"= {want:.0f}")
            if zero and dp > 1:
                t.check(8 * n0 / dp <= state <= 8 * n0 / dp + 8 * buckets,
                        f"train {tag}: optimizer state {state} bytes on rank 0 = 8*{n0}/{dp} "
                        f"(+ at most 8 per bucket, {buckets} buckets)")
            else:
                t.check(state == 8 * n0, f"train {tag}: optimizer state {state} bytes = 8*{n0}")
    resume_checks(t, ref_curve, ["parallel.pp=2", "parallel.zero_stage=1", bucket,
                                 "io.checkpoint_every=5"])
    two_d(t, ref_curve, ref_ck, bucket)
    bad_input(t)
    t.finish()


if __name__ == "__main__":
    main()
