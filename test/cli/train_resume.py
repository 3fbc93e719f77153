#!/usr/bin/env python3
"""Training end to end, through the command line and the HDF5 files only.

1. prepare-data (byte tokenizer) on the King James Bible, or on a generated English-like
   text where `bible` is missing;
2. a shrunken default deck learns: the first loss is about ln(256), the final eval loss is
   well below the corpus' unigram (byte) entropy;
3. resume: the run is repeated from its step-10 checkpoint in a copy of its out_dir, and
   steps 11..20 give bitwise the same losses and final weights;
4. outputs: metrics.h5 has one row per step with every FORMAT.md column, config.toml
   parses, `trident sample` prints text;
5. full recompute gives bitwise the same losses; gpipe and one big microbatch the same up
   to rounding.
"""
import math
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

TRIDENT = os.environ["TRIDENT"]
OUT = os.path.join(os.environ.get("TRIDENT_TEST_OUT", "/tmp"), "cli.train_resume")
failures = []


def run(*args, cwd=None, timeout=300):
    p = subprocess.run([TRIDENT, *args], cwd=cwd or OUT, capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
        sys.exit(f"FAIL: trident {' '.join(args)} exited {p.returncode}")
    return p.stdout


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def corpus(path):
    try:
        text = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True,
                              text=True, check=True).stdout
        lines = [l.split(" ", 1)[1] if " " in l else l for l in text.splitlines()]
    except (OSError, subprocess.CalledProcessError):
        rng = np.random.default_rng(0)
        words = "and the of to in that he said unto for his lord shall they was is".split()
        lines = [" ".join(rng.choice(words, 12)) + "." for _ in range(30000)]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


DECK = """
[model]
seq_len = 64
n_layer = 2
n_head = 4
d_model = 96
[parallel]
micro_batch_size = 8
[train]
steps = {steps}
global_batch_size = 16
lr = 3e-3
min_lr = 3e-4
warmup_steps = 10
eval_every = {eval_every}
eval_batches = 2
[data]
train = "data/train.h5"
valid = "data/valid.h5"
[io]
out_dir = "{out_dir}"
checkpoint_every = 10
keep_checkpoints = 0
[runtime]
threads = 2
"""


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(os.path.join(OUT, "data"))
    corpus(os.path.join(OUT, "data", "corpus.txt"))
    run("prepare-data", "--input", "data/corpus.txt", "--output", "data/train.h5",
        "--valid-output", "data/valid.h5", "--valid-every", "20")
    with h5py.File(os.path.join(OUT, "data", "train.h5"), "r") as f:
        tokens = f["tokens"][:]
        check(int(f.attrs["vocab_size"]) == 256 and f.attrs["tokenizer"] == "byte",
              "token dataset attributes")
    counts = np.bincount(tokens.astype(np.int64), minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    unigram = float(-(p * np.log(p)).sum())
    print(f"unigram entropy of the corpus: {unigram:.3f} nats; ln(256) = {math.log(256):.3f}")

    # 2. it learns
    with open(os.path.join(OUT, "learn.toml"), "w") as f:
        f.write(DECK.format(steps=300, eval_every=100, out_dir="learn"))
    run("train", "learn.toml")
    with h5py.File(os.path.join(OUT, "learn", "metrics.h5"), "r") as m:
        loss = m["loss"][:]
        eval_loss = m["eval/loss"][:]
        check(list(m["step"][:]) == list(range(1, 301)), "metrics: one row per step")
        for col in ("step", "loss", "lr", "grad_norm", "step_time_s", "tokens_per_s"):
            check(col in m and len(m[col]) == 300, f"metrics column {col}")
        check(list(m["eval/step"][:]) == [100, 200, 300], "eval rows at 100, 200, 300")
    print(f"first loss {loss[0]:.3f}, final eval loss {eval_loss[-1]:.3f}")
    check(abs(loss[0] - math.log(256)) < 0.3, "first loss is about ln(vocab)")
    check(eval_loss[-1] < unigram - 0.5, "final eval loss well below the unigram entropy")
    check(np.all(np.isfinite(loss)), "losses finite")
    sample = run("sample", "--checkpoint", "learn/checkpoints/step-00000300.h5",
                 "--prompt", "And God said", "--tokens", "40")
    check(sample.startswith("And God said") and len(sample) > 30, "sample continues the prompt")

    # 3. resume is bitwise
    with open(os.path.join(OUT, "full.toml"), "w") as f:
        f.write(DECK.format(steps=20, eval_every=0, out_dir="full"))
    run("train", "full.toml")
    shutil.copytree(os.path.join(OUT, "full"), os.path.join(OUT, "resumed"))
    os.remove(os.path.join(OUT, "resumed", "checkpoints", "step-00000020.h5"))
    out = run("train", "full.toml", "--set", "io.out_dir=resumed")
    check("resuming from" in out and "step-00000010.h5" in out, "resumed from step 10")
    with h5py.File(os.path.join(OUT, "full", "metrics.h5"), "r") as a, \
         h5py.File(os.path.join(OUT, "resumed", "metrics.h5"), "r") as b:
        check(list(b["step"][:]) == list(range(1, 21)), "resumed metrics: steps 1..20 once")
        check(np.array_equal(a["loss"][:], b["loss"][:]), "resumed losses bitwise equal")
    with h5py.File(os.path.join(OUT, "full", "checkpoints", "step-00000020.h5"), "r") as a, \
         h5py.File(os.path.join(OUT, "resumed", "checkpoints", "step-00000020.h5"), "r") as b:
        same = all(np.array_equal(a["model"][k][:], b["model"][k][:]) for k in a["model"])
        same = same and all(np.array_equal(a["optimizer/exp_avg_sq"][k][:],
                                           b["optimizer/exp_avg_sq"][k][:])
                            for k in a["optimizer/exp_avg_sq"])
        check(same, "resumed final weights and moments bitwise equal")
        check(int(b.attrs["step"]) == 20 and int(b.attrs["consumed_samples"]) == 320,
              "checkpoint step and consumed_samples")
    with open(os.path.join(OUT, "full", "config.toml")) as f:
        check("global_batch_size = 16" in f.read(), "config.toml holds the resolved deck")

    # 5. the same run through other executions of the same step: full and selective recompute
    # are bitwise the same; the gpipe order (wte's head and embedding gradients add up in another order)
    # and one microbatch of 16 instead of two of 8 differ only by rounding (FORMAT.md: the
    # schedule and micro_batch_size do not change the curve).
    with h5py.File(os.path.join(OUT, "full", "metrics.h5"), "r") as a:
        ref = a["loss"][:]
    for name, sets, bitwise in (("recompute", ["parallel.recompute=full"], True),
                                ("recompute_selective", ["parallel.recompute=selective"], True),
                                ("gpipe", ["parallel.schedule=gpipe"], False),
                                ("one_microbatch", ["parallel.micro_batch_size=16"], False)):
        args = ["train", "full.toml", "--set", f"io.out_dir={name}"]
        for kv in sets:
            args += ["--set", kv]
        run(*args)
        with h5py.File(os.path.join(OUT, name, "metrics.h5"), "r") as b:
            got = b["loss"][:]
        if bitwise:
            check(np.array_equal(ref, got), f"{name}: losses bitwise equal to the reference run")
        else:
            rel = float(np.max(np.abs(got - ref) / np.abs(ref)))
            check(rel < 1e-5, f"{name}: losses within 1e-5 relative (max {rel:.2e})")

    if failures:
        sys.exit(f"{len(failures)} check(s) failed: {failures}")
    print("cli.train_resume: PASS")


if __name__ == "__main__":
    main()
