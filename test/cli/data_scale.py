#!/usr/bin/env python3
"""Token data at scale, through the command line and the HDF5 files only (issue 17).

1. Resident memory: a training rank on a 100 M-token corpus stays within 10% of one on a
   5 M-token corpus (both generated here and deleted; the second run of each measures,
   after the first built the sample index).
2. A blend deck (`train = [{path, weight}, ...]`, one entry a directory of shards, one shard
   written gzip-compressed in odd chunks as another tool might): 6 steps straight and 3 + a
   resume of 3 give bitwise the same losses, mid-epoch, and the same as with the shard stored
   plainly; metrics.h5 has
   `epoch` and `consumed_tokens`; the resolved config.toml keeps the list.
3. prepare-data under `mpirun -np 2` writes the same tokens (and documents) as one rank.
"""
import os
import resource
import shutil
import subprocess
import sys

import h5py
import numpy as np

TRIDENT = os.environ["TRIDENT"]
OUT = os.path.join(os.environ.get("TRIDENT_TEST_OUT", "/tmp"), "cli.data_scale")
failures = []


def env():
    e = dict(os.environ)
    e.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
             OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1",
             OPENBLAS_NUM_THREADS="1")
    return e


def run(*args, np_=0, timeout=300):
    cmd = (["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none"] if np_ else [])
    p = subprocess.run(cmd + [TRIDENT, *args], cwd=OUT, capture_output=True, text=True,
                       timeout=timeout, env=env())
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
        sys.exit(f"FAIL: trident {' '.join(args)} exited {p.returncode}")
    return p.stdout + p.stderr


def peak_rss_mb(*args):
    """Peak resident memory of one trident process (a fresh child Python measures it)."""
    code = ("import resource, subprocess, sys\n"
            "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
            "sys.stderr.write(p.stdout[-2000:] + p.stderr[-2000:]) if p.returncode else None\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if p.returncode == 0 "
            "else -1)\n")
    p = subprocess.run([sys.executable, "-c", code, TRIDENT, *args], cwd=OUT,
                       capture_output=True, text=True, env=env(), timeout=300)
    kb = int(p.stdout.strip() or -1)
    if kb < 0:
        print(p.stderr)
        sys.exit(f"FAIL: trident {' '.join(args)}")
    return kb / 1024


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def write_tokens(path, n, seed, **storage):
    """An old-style byte dataset (no checksum, no documents): the reader must cope.
    storage: h5py's chunking and filters, as another tool might write the file."""
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        f.attrs["vocab_size"] = np.int64(256)
        f.attrs["tokenizer"] = "byte"
        ds = f.create_dataset("tokens", shape=(n,), dtype=np.uint16, **storage)
        step = 10_000_000
        for at in range(0, n, step):
            m = min(step, n - at)
            ds[at:at + m] = rng.integers(0, 256, m, dtype=np.uint16)


DECK = """
[model]
vocab_size = 256
seq_len = {T}
n_layer = 1
n_head = 2
d_model = 32
[parallel]
micro_batch_size = 2
[train]
steps = {steps}
global_batch_size = 4
warmup_steps = 0
lr = 1e-3
seed = 7
[data]
train = {train}
[io]
out_dir = "{out}"
checkpoint_every = {ck}
resume = "{resume}"
[runtime]
threads = 1
"""


def deck(name, train, steps, out, T=256, ck=0, resume="auto"):
    path = os.path.join(OUT, name)
    with open(path, "w") as f:
        f.write(DECK.format(T=T, steps=steps, train=train, out=out, ck=ck, resume=resume))
    return path


def rss_case():
    rss = {}
    for name, n in (("small", 5_000_000), ("large", 100_000_000)):
        data = os.path.join(OUT, f"{name}.h5")
        write_tokens(data, n, seed=1)
        d = deck(f"{name}.toml", f'"{data}"', 3, f"run-{name}")
        run("train", d)  # builds the sample index
        rss[name] = peak_rss_mb("train", d, "--set", "io.resume=none", "--set", "io.overwrite=true")
        os.remove(data)
        shutil.rmtree(os.path.join(OUT, f"run-{name}"))
        print(f"  {name}: {n / 1e6:.0f} M tokens, peak RSS {rss[name]:.1f} MB", flush=True)
    check(abs(rss["large"] - rss["small"]) <= 0.10 * rss["small"],
          f"peak RSS of a training rank: {rss['small']:.1f} MB on 5 M tokens, "
          f"{rss['large']:.1f} MB on 100 M tokens (within 10%)")


def blend_resume_case():
    os.makedirs(os.path.join(OUT, "shards"), exist_ok=True)
    write_tokens(os.path.join(OUT, "a.h5"), 16 * 40 + 1, seed=2)      # 40 sequences of 16
    write_tokens(os.path.join(OUT, "shards", "s0.h5"), 16 * 5 + 1, seed=3)
    # s1 as another tool might write it: gzip with shuffle, in chunks of 37 tokens (sequences
    # straddle chunks); the same tokens stored plainly give bitwise the same run.
    write_tokens(os.path.join(OUT, "shards", "s1.h5"), 16 * 7 + 3, seed=4, compression="gzip",
                 shuffle=True, chunks=(37,))
    os.makedirs(os.path.join(OUT, "plain"), exist_ok=True)
    shutil.copy(os.path.join(OUT, "shards", "s0.h5"), os.path.join(OUT, "plain", "s0.h5"))
    write_tokens(os.path.join(OUT, "plain", "s1.h5"), 16 * 7 + 3, seed=4)
    train = '[{path = "a.h5", weight = 0.7}, {path = "shards", weight = 0.3}]'
    run("train", deck("blend.toml", train, 6, "run-blend", T=16, ck=3))
    run("train", deck("blend-plain.toml", train.replace('"shards"', '"plain"'), 6, "run-plain",
                      T=16))
    with h5py.File(os.path.join(OUT, "run-blend", "metrics.h5"), "r") as a, \
            h5py.File(os.path.join(OUT, "run-plain", "metrics.h5"), "r") as b:
        check(np.array_equal(a["loss"][:], b["loss"][:]),
              "a shard stored with gzip, shuffle and 37-token chunks trains bitwise as a plain one")
    # The step-3 checkpoint resumed in a fresh out_dir: its sample index is rebuilt there.
    ck = os.path.join(OUT, "run-blend", "checkpoints", "step-00000003.h5")
    run("train", deck("blend-resume.toml", train, 6, "run-split", T=16, resume=ck))
    with h5py.File(os.path.join(OUT, "run-blend", "metrics.h5"), "r") as a, \
            h5py.File(os.path.join(OUT, "run-split", "metrics.h5"), "r") as b:
        check(np.array_equal(a["loss"][3:], b["loss"][:]) and list(b["step"][:]) == [4, 5, 6],
              "blend: 3 steps + a resume of 3 (mid-epoch) give bitwise the losses of 6 straight")
        check(list(a["consumed_tokens"][:]) == [4 * 16 * s for s in range(1, 7)],
              "metrics.h5: consumed_tokens = step * global_batch * seq_len")
        # shards hold 5 + 7 = 12 sequences; 0.3 of 4 per step: epoch = 0.3 * 4 s / 12.
        check(np.allclose(a["epoch"][:], [0.3 * 4 * s / 12 for s in range(1, 7)]),
              f"metrics.h5: epoch of the most repeated dataset ({a['epoch'][:]})")
    text = open(os.path.join(OUT, "run-blend", "config.toml")).read()
    check('train = [{path = "a.h5", weight = 0.7}, {path = "shards", weight = 0.3}]' in text,
          "config.toml keeps the blend as a TOML list")
    with h5py.File(os.path.join(OUT, "run-blend", "data_index", "train.h5"), "r") as f:
        which = f["blend/dataset"][:]
        check(len(which) == 24 and int(which[:20].sum()) == 6,
              "the index's blend: 6 of the first 20 sequences from the shards (0.3)")


def prepare_parallel_case():
    rng = np.random.default_rng(5)
    words = "and the of to in that he said unto for his lord shall they was is".split()
    with open(os.path.join(OUT, "c1.txt"), "w") as f:
        f.write("\n".join(" ".join(rng.choice(words, 9)) for _ in range(3000)) + "\n")
    with open(os.path.join(OUT, "c2.jsonl"), "w") as f:
        for i in range(500):
            f.write('{"text": "%s\\nline two of %d", "id": %d}\n' % (" ".join(rng.choice(words, 7)), i, i))
    outs = {}
    for np_ in (0, 2):
        name = f"p{np_}"
        run("prepare-data", "--input", "c1.txt", "--input", "c2.jsonl", "--output", f"{name}.h5",
            "--valid-output", f"{name}-valid.h5", "--valid-every", "5", "--block-mb", "0.01",
            np_=np_)
        with h5py.File(os.path.join(OUT, f"{name}.h5"), "r") as f, \
                h5py.File(os.path.join(OUT, f"{name}-valid.h5"), "r") as v:
            outs[np_] = (f["tokens"][:], f["documents"][:], int(f.attrs["tokens_checksum"]),
                         v["tokens"][:])
    a, b = outs[0], outs[2]
    check(len(a[0]) > 100_000 and np.array_equal(a[0], b[0]) and np.array_equal(a[3], b[3]),
          f"prepare-data under mpirun -np 2 writes the same tokens as one rank ({len(a[0])})")
    # Units 3000..3499 are the records; those of block 34 (every 5th of 100) are held out.
    check(np.array_equal(a[1], b[1]) and len(a[1]) == 1 + 400,
          f"the same {len(a[1])} documents (the text file, then one per training record)")
    check(a[2] == b[2], "the same tokens_checksum")


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    cases = sys.argv[1:] or ["rss", "blend", "prepare"]
    if "rss" in cases:
        rss_case()
    if "blend" in cases:
        blend_resume_case()
    if "prepare" in cases:
        prepare_parallel_case()
    if failures:
        sys.exit(f"{len(failures)} check(s) failed: {failures}")
    shutil.rmtree(OUT, ignore_errors=True)
    print("cli.data_scale: PASS")


if __name__ == "__main__":
    main()
