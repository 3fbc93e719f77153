#!/usr/bin/env python3
"""Checkpoint write and read bandwidth at 8 ranks (2x2x2), against dd to the same disk in
the same run (issue 6).

The bench model (L4 d256 vocab 4096 seq 128: 4.3 M parameters, so weights plus both Adam
moments are about 52 MB) trains one step and writes its checkpoint collectively (parallel
HDF5 over MPI-IO, one file); a second run resumes from it, reading it collectively. trident
logs each as "(X MB in Y s, Z MB/s)", timed around the whole write (create, every tensor,
flush, fsync, rename) and the whole read (open, checks, every tensor, checksums). dd
writes the same number of bytes with conv=fdatasync (so both include getting the data to
the disk) and reads them back (page cache: the checkpoint's read is as warm).

usage: bench/checkpoint_bench.py --build BUILD [--work DIR] [--json OUT.json]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
RANKS = 8
LAYOUT = (2, 2, 2)  # tp, pp, dp
MODEL = dict(vocab_size=4096, seq_len=128, n_layer=4, n_head=4, d_model=256)
RATE = re.compile(r"\(([\d.]+) MB in ([\d.]+) s, (\d+) MB/s\)")


def mpi_env():
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    return env


def deck(path, work, data, resume):
    tp, pp, dp = LAYOUT
    m = "\n".join(f"{k} = {v}" for k, v in MODEL.items())
    with open(path, "w") as f:
        f.write(f"""[model]
{m}
[parallel]
tp = {tp}
pp = {pp}
micro_batch_size = 1
[train]
steps = 1
global_batch_size = 2
warmup_steps = 0
[data]
train = "{data}"
[io]
out_dir = "{work}/run"
resume = "{resume}"
keep_checkpoints = 0
[runtime]
threads = 1
""")


def trident(build, deck_path, steps=1):
    cmd = ["mpirun", "-np", str(RANKS), "--oversubscribe", "--bind-to", "none",
           os.path.join(build, "trident"), "train", deck_path, "--set", f"train.steps={steps}"]
    p = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"checkpoint_bench: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return p.stdout


def dd(work, mb):
    path = os.path.join(work, "dd.bin")
    count = max(1, int(round(mb)))
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={count}",
                    "conv=fdatasync"], check=True, capture_output=True)
    w = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], check=True, capture_output=True)
    r = time.perf_counter() - t0
    os.remove(path)
    return count / w, count / r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    work = os.path.abspath(args.work or os.path.join(build, "bench-work", "checkpoint"))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # random byte tokens (only the I/O is measured; the deck's vocabulary may exceed the data's)
    sys.path.insert(0, os.path.join(SRC, "tools"))
    import h5py
    import numpy as np
    data = os.path.join(work, "tokens.h5")
    with h5py.File(data, "w") as f:
        f["tokens"] = np.random.default_rng(0).integers(0, 256, 50000).astype(np.int32)
        f.attrs["vocab_size"] = 256
        f.attrs["tokenizer"] = "byte"

    d = os.path.join(work, "deck.toml")
    deck(d, work, data, "none")
    out = trident(build, d)
    w = RATE.search(out.split("checkpoint ", 1)[-1]) if "checkpoint " in out else None
    deck(d, work, data, "auto")
    out2 = trident(build, d, steps=2)
    r = RATE.search(out2.split("resuming from", 1)[-1]) if "resuming from" in out2 else None
    if not w or not r:
        sys.exit(f"checkpoint_bench: no rate in trident's log:\n{out}\n{out2}")
    mb = float(w.group(1))
    dd_w, dd_r = dd(work, mb)
    res = {"ranks": RANKS, "layout": "x".join(map(str, LAYOUT)), "checkpoint_mb": mb,
           "write_mb_s": float(w.group(3)), "write_s": float(w.group(2)),
           "read_mb_s": float(r.group(3)), "read_s": float(r.group(2)),
           "dd_write_mb_s": dd_w, "dd_read_mb_s": dd_r,
           "write_vs_dd": float(w.group(3)) / dd_w, "read_vs_dd": float(r.group(3)) / dd_r}
    print(f"\ncheckpoint I/O at {RANKS} ranks ({res['layout']}, one {mb:.1f} MB file, parallel HDF5):")
    print(f"  {'':8}{'trident MB/s':>14}{'dd MB/s':>10}{'ratio':>8}")
    print(f"  {'write':8}{res['write_mb_s']:>14.0f}{dd_w:>10.0f}{res['write_vs_dd']:>8.2f}")
    print(f"  {'read':8}{res['read_mb_s']:>14.0f}{dd_r:>10.0f}{res['read_vs_dd']:>8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
