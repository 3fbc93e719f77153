#!/usr/bin/env python3
"""Parallel layouts against the serial run, through the command line and HDF5 files.

`trident grad` at tp=2, tp=4, dp=2 and tp=2 x dp=2 gives the serial loss (1e-5 relative)
and gradients (max|d| <= 1e-5 * max|g| per tensor); 10 training steps at tp=2 and at dp=2
(clipping active) give the serial loss curve to 1e-5 relative. The vocabulary (101) is not
a multiple of tp, so the padded vocab-parallel embedding and cross-entropy are exercised.
"""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

TRIDENT = os.environ["TRIDENT"]
OUT = os.path.join(os.environ.get("TRIDENT_TEST_OUT", "/tmp"), "mpi.layouts")
DECK = """
[model]
vocab_size = 101
seq_len = 16
n_layer = 2
n_head = 4
d_model = 32
[parallel]
micro_batch_size = 2
[train]
steps = 10
global_batch_size = 8
warmup_steps = 2
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


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    with open(os.path.join(OUT, "deck.toml"), "w") as f:
        f.write(DECK)
    rng = np.random.default_rng(7)
    with h5py.File(os.path.join(OUT, "batch.h5"), "w") as f:
        f["inputs"] = rng.integers(0, 101, (8, 16)).astype(np.int32)
        f["targets"] = rng.integers(0, 101, (8, 16)).astype(np.int32)
    # A token stream with structure (a noisy counter), so training has something to learn.
    tokens = (np.arange(20000) * 7 + rng.integers(0, 3, 20000)) % 101
    with h5py.File(os.path.join(OUT, "tokens.h5"), "w") as f:
        f["tokens"] = tokens.astype(np.int32)
        f.attrs["vocab_size"] = 101
        f.attrs["tokenizer"] = "sentencepiece"
        f["tokenizer/model"] = np.zeros(1, np.uint8)  # never decoded by training
    trident(1, "init", "deck.toml", "--out", "w.h5")
    trident(1, "grad", "deck.toml", "--weights", "w.h5", "--batch", "batch.h5", "--out", "g1.h5")
    with h5py.File(os.path.join(OUT, "g1.h5"), "r") as f:
        ref_loss = float(f.attrs["loss"])
        ref = {k: f["grad"][k][:] for k in f["grad"]}
    for name, np_, sets in (("tp2", 2, ["parallel.tp=2"]), ("tp4", 4, ["parallel.tp=4"]),
                            ("dp2", 2, []), ("tp2dp2", 4, ["parallel.tp=2"])):
        args = ["grad", "deck.toml", "--weights", "w.h5", "--batch", "batch.h5",
                "--out", f"g_{name}.h5"]
        for kv in sets:
            args += ["--set", kv]
        trident(np_, *args)
        with h5py.File(os.path.join(OUT, f"g_{name}.h5"), "r") as f:
            loss = float(f.attrs["loss"])
            worst = max((float(np.abs(f["grad"][k][:] - g).max() / np.abs(g).max()), k)
                        for k, g in ref.items())
        check(abs(loss - ref_loss) <= 1e-5 * abs(ref_loss),
              f"grad {name}: loss {loss:.9f} vs serial {ref_loss:.9f}")
        check(worst[0] <= 1e-5, f"grad {name}: worst max|d|/max|g| = {worst[0]:.2e} ({worst[1]})")

    def curve(np_, out_dir, *sets):
        args = ["train", "deck.toml", "--set", f"io.out_dir={out_dir}"]
        for kv in sets:
            args += ["--set", kv]
        trident(np_, *args)
        with h5py.File(os.path.join(OUT, out_dir, "metrics.h5"), "r") as f:
            comm = {g: f[f"comm/{g}/bytes"][:] for g in ("tp", "dp", "pp")}
            return f["loss"][:], f["grad_norm"][:], comm

    ref_curve, ref_norm, ref_comm = curve(1, "serial")
    check(all(np.all(v == 0) for v in ref_comm.values()), "serial run: no communication counted")
    check(np.all(ref_norm > 0.5), "clipping is active in the reference run")
    for name, np_, sets in (("tp2", 2, ["parallel.tp=2"]), ("dp2", 2, [])):
        got, _, comm = curve(np_, f"train_{name}", *sets)
        # dp=2: one allreduce of every gradient (float32) and of the loss (float64) per step.
        if name == "dp2":
            with h5py.File(os.path.join(OUT, "w.h5"), "r") as w:
                n_params = sum(w["model"][k].size for k in w["model"])
            check(np.all(comm["dp"] == 4 * n_params + 8),
                  f"dp2: comm/dp/bytes per step = 4 * {n_params} + 8 (got {comm['dp'][0]:.0f})")
        if name == "tp2":
            check(np.all(comm["tp"] > 0) and np.all(comm["dp"] == 0), "tp2: traffic on tp only")
        rel = float(np.max(np.abs(got - ref_curve) / np.abs(ref_curve)))
        check(rel <= 1e-5, f"train {name}: 10 losses within 1e-5 relative of serial ({rel:.2e})")
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("mpi.layouts: PASS")


if __name__ == "__main__":
    main()
