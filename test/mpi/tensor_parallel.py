#!/usr/bin/env python3
"""Tensor parallelism, with and without sequence parallelism, against the serial run.

For tp in {2, 4} and sequence_parallel in {false, true} (and tp 2 + SP + full recompute): `trident grad` on the serial
weights and batch gives the serial loss to 1e-6 relative and every serial gradient to
max|d| <= 1e-5 * max|g|; 5 training steps give the serial loss curve to 1e-5 relative;
and rank 0's TP traffic per step equals the closed form below, the same with and without
sequence parallelism (reduce-scatter + all-gather pairs move what allreduces move). The
vocabulary (101) is divisible by neither 2 nor 4: the padded vocab-parallel path runs.

Bytes are ring ("bus") bytes, FORMAT.md: allreduce of S bytes over p ranks counts
2(p-1)/p*S, reduce-scatter and all-gather (p-1)/p*S. Per microbatch of N = mbs*T tokens,
with S = 4*N*C and L layers on the stage, r = (p-1)/p:
  embedding  forward allreduce S (SP: reduce-scatter S, all-gather S in backward)  2rS
  each layer 2 forward + 2 backward allreduces of S (SP: 4 all-gathers, 4 RS)      8rS
  LM head    ln_f input-gradient allreduce S (SP: all-gather + reduce-scatter)     2rS
             row max (N floats) + sum-exp and target logit (2N floats)           24rN
per step: the grad-norm allreduce of one double 16r; SP adds the LayerNorm gradients'
allreduce, 2r * 4 * (4*C*L + 2*C).
"""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

TRIDENT = os.environ["TRIDENT"]
OUT = os.path.join(os.environ.get("TRIDENT_TEST_OUT", "/tmp"), "mpi.tensor_parallel")
V, T, L, H, C, MBS, GBS = 101, 16, 2, 4, 32, 2, 8
DECK = f"""
[model]
vocab_size = {V}
seq_len = {T}
n_layer = {L}
n_head = {H}
d_model = {C}
[parallel]
micro_batch_size = {MBS}
[train]
steps = 5
global_batch_size = {GBS}
warmup_steps = 1
lr = 3e-3
grad_clip = 0.5
[data]
train = "tokens.h5"
[io]
out_dir = "run"
resume = "none"
[runtime]
threads = 1
"""
failures = []


def trident(np_, *args):
    cmd = [TRIDENT, *args]
    if np_ > 1:
        cmd = ["mpirun", "-np", str(np_), "--oversubscribe", *cmd]
    p = subprocess.run(cmd, cwd=OUT, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}")


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def expected_tp_bytes(p, sp):
    r = (p - 1) / p
    N = MBS * T
    S = 4 * N * C
    m = GBS // MBS
    per_mb = 2 * r * S + 8 * r * S * L + 2 * r * S + 24 * r * N
    per_step = 16 * r + (2 * r * 4 * (4 * C * L + 2 * C) if sp else 0)
    return m * per_mb + per_step


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    with open(os.path.join(OUT, "deck.toml"), "w") as f:
        f.write(DECK)
    rng = np.random.default_rng(11)
    with h5py.File(os.path.join(OUT, "batch.h5"), "w") as f:
        f["inputs"] = rng.integers(0, V, (GBS, T)).astype(np.int32)
        f["targets"] = rng.integers(0, V, (GBS, T)).astype(np.int32)
    tokens = (np.arange(20000) * 7 + rng.integers(0, 3, 20000)) % V
    with h5py.File(os.path.join(OUT, "tokens.h5"), "w") as f:
        f["tokens"] = tokens.astype(np.int32)
        f.attrs["vocab_size"] = V
        f.attrs["tokenizer"] = "byte"
    trident(1, "init", "deck.toml", "--out", "w.h5")
    trident(1, "grad", "deck.toml", "--weights", "w.h5", "--batch", "batch.h5", "--out", "g1.h5")
    with h5py.File(os.path.join(OUT, "g1.h5"), "r") as f:
        ref_loss = float(f.attrs["loss"])
        ref = {k: f["grad"][k][:] for k in f["grad"]}

    def curve(np_, out_dir, sets):
        args = ["train", "deck.toml", "--set", f"io.out_dir={out_dir}"]
        for kv in sets:
            args += ["--set", kv]
        trident(np_, *args)
        with h5py.File(os.path.join(OUT, out_dir, "metrics.h5"), "r") as f:
            return f["loss"][:], f["comm/tp/bytes"][:], f["comm/tp/calls"][:]

    ref_curve, ref_bytes, _ = curve(1, "serial", [])
    check(np.all(ref_bytes == 0), "serial: no TP traffic")
    calls, measured = {}, {}
    # Full recompute re-runs each block's forward (and its collectives) in the backward.
    trident(2, "grad", "deck.toml", "--weights", "w.h5", "--batch", "batch.h5", "--out",
            "g_rc.h5", "--set", "parallel.tp=2", "--set", "parallel.sequence_parallel=true",
            "--set", "parallel.recompute=full")
    with h5py.File(os.path.join(OUT, "g_rc.h5"), "r") as f:
        worst = max(float(np.abs(f["grad"][k][:] - g).max() / np.abs(g).max()) for k, g in ref.items())
    check(worst <= 1e-5, f"grad tp2 sp recompute=full: worst max|d|/max|g| = {worst:.2e}")
    for tp in (2, 4):
        for sp in (False, True):
            name = f"tp{tp}{'_sp' if sp else ''}"
            sets = [f"parallel.tp={tp}", f"parallel.sequence_parallel={'true' if sp else 'false'}"]
            args = ["grad", "deck.toml", "--weights", "w.h5", "--batch", "batch.h5",
                    "--out", f"g_{name}.h5"]
            for kv in sets:
                args += ["--set", kv]
            trident(tp, *args)
            with h5py.File(os.path.join(OUT, f"g_{name}.h5"), "r") as f:
                loss = float(f.attrs["loss"])
                worst = max((float(np.abs(f["grad"][k][:] - g).max() / np.abs(g).max()), k)
                            for k, g in ref.items())
            check(abs(loss - ref_loss) <= 1e-6 * abs(ref_loss),
                  f"grad {name}: loss {loss:.9f} vs serial {ref_loss:.9f}")
            check(worst[0] <= 1e-5, f"grad {name}: worst max|d|/max|g| = {worst[0]:.2e} ({worst[1]})")

            got, tp_bytes, tp_calls = curve(tp, f"train_{name}", sets)
            rel = float(np.max(np.abs(got - ref_curve) / np.abs(ref_curve)))
            check(rel <= 1e-5, f"train {name}: 5 losses within 1e-5 relative of serial ({rel:.2e})")
            want = expected_tp_bytes(tp, sp)
            check(np.allclose(tp_bytes, want, rtol=1e-12, atol=1e-6),
                  f"train {name}: comm/tp/bytes per step {tp_bytes[0]:.1f} = formula {want:.1f}")
            calls[name], measured[name] = tp_calls[0], tp_bytes[0]
    for tp in (2, 4):
        ln_bytes = 2 * (tp - 1) / tp * 4 * (4 * C * L + 2 * C)
        check(abs(measured[f"tp{tp}_sp"] - ln_bytes - measured[f"tp{tp}"]) < 1e-6,
              f"tp{tp}: measured activation bytes equal with and without sequence parallelism")
        # Per microbatch SP turns 2 + 4L allreduces of activations into 4 + 8L RS/AG calls.
        m = GBS // MBS
        check(calls[f"tp{tp}_sp"] - calls[f"tp{tp}"] == m * (2 + 4 * L) + 1,
              f"tp{tp}: SP makes {m * (2 + 4 * L)} more calls per step (+1 LayerNorm allreduce)")
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("mpi.tensor_parallel: PASS")


if __name__ == "__main__":
    main()
