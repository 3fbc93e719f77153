#!/usr/bin/env python3
"""Token data at scale (issue 17), `make bench`'s data part. Not a test: it prints figures.

1. Reads: random sequences by HDF5 hyperslab (what training does) against a memory map of
   the contiguous /tokens (trident_bench_data_read): microseconds per sequence, resident
   growth.
2. Training on 10 M, 100 M and 1 G tokens (generated here, deleted after; BENCH_DATA_SIZES):
   time to the first step and peak resident memory of the rank, on the first start (which
   checks every token and builds the sample index) and on a later one (index cached); the
   data time per step as a share of the step (metrics.h5: data_s / step_time_s).
3. prepare-data on the King James Bible repeated to BENCH_PREPARE_MB (1024) MB, with the
   SentencePiece model of the KJV: MB/s on 1 and 2 ranks against SentencePiece's own
   `spm_encode` (one thread, the same model and input) in the same run.
usage: data_bench.py --build BUILD [--json OUT.json]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import h5py
import numpy as np

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64(x):
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def write_tokens(path, n, seed=0, contiguous=True, checksum=True):
    """A byte token dataset of n random ids (with tokens_checksum, as prepare-data writes)."""
    rng = np.random.default_rng(seed)
    total = np.uint64(0)
    step = 1 << 24
    with np.errstate(over="ignore"), h5py.File(path, "w") as f:
        f.attrs["vocab_size"] = np.int64(256)
        f.attrs["tokenizer"] = "byte"
        ds = f.create_dataset("tokens", shape=(n,), dtype=np.uint16,
                              chunks=None if contiguous else (1 << 20,))
        for at in range(0, n, step):
            m = min(step, n - at)
            ids = rng.integers(0, 256, m, dtype=np.uint16)
            ds[at:at + m] = ids
            if checksum:
                i = np.arange(at, at + m, dtype=np.uint64)
                total = total + mix64((i * np.uint64(0x9E3779B97F4A7C15)) ^ ids.astype(np.uint64)).sum(dtype=np.uint64)
        if checksum:
            f.attrs["tokens_checksum"] = np.uint64(total)


def env():
    e = dict(os.environ)
    e.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
             OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return e


# Runs the command from a small Python: the peak resident set of a child forked from this
# (large) process would count this one's pages too (Linux keeps the high-water mark across
# exec).
RUNNER = r"""
import json, os, subprocess, sys, time
marker = sys.argv[1] or None
t0 = time.monotonic()
p = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
first, out = None, []
for line in p.stdout:
    out.append(line)
    if first is None and marker and marker in line:
        first = time.monotonic() - t0
_, status, ru = os.wait4(p.pid, 0)
print(json.dumps(dict(rc=os.waitstatus_to_exitcode(status), first=first, total=time.monotonic() - t0,
                      rss_mb=ru.ru_maxrss / 1024, cpu_s=ru.ru_utime + ru.ru_stime,
                      out="".join(out[-40:]))))
"""


def timed_run(cmd, cwd, first_marker=None):
    """(seconds to the first output line containing first_marker, total seconds, peak RSS MB
    of the process, its last lines)."""
    p = subprocess.run([sys.executable, "-c", RUNNER, first_marker or ""] + cmd, cwd=cwd,
                       capture_output=True, text=True, env=env())
    r = json.loads(p.stdout.strip().splitlines()[-1])
    if r["rc"] != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed:\n{r['out']}")
    timed_run.cpu_s = r["cpu_s"]  # user + system of the process and the ranks it waited for
    return r["first"], r["total"], r["rss_mb"], r["out"]


DECK = """
[model]
vocab_size = 256
seq_len = 256
n_layer = 2
n_head = 4
d_model = 128
[parallel]
micro_batch_size = 8
[train]
steps = 20
global_batch_size = 16
warmup_steps = 0
[data]
train = "{data}"
[io]
out_dir = "{out}"
resume = "none"
overwrite = true
[runtime]
threads = 1
"""


def reads(build, work, results):
    exe = os.path.join(build, "bench", "trident_bench_data_read")
    a, b = os.path.join(work, "contig.h5"), os.path.join(work, "chunked.h5")
    write_tokens(a, 100_000_000, contiguous=True)
    write_tokens(b, 100_000_000, contiguous=False)
    out = subprocess.run([exe, a, b, "1024", "20000"], capture_output=True, text=True, check=True).stdout
    print("\n== reads of 1025-token sequences from a 100 M-token file (random, 20000) ==")
    print(out, end="")
    results["reads"] = out.strip().splitlines()
    os.remove(a)
    os.remove(b)


def training(trident, work, results, sizes):
    print("\n== training start-up and data share (1 rank, 2 layers, d_model 128, T 256, G 16) ==")
    print(f"{'tokens':>8} {'first start':>12} {'RSS':>9} {'later start':>12} {'RSS':>9} "
          f"{'data/step':>10}")
    rows = []
    for n in sizes:
        data = os.path.join(work, f"t{n}.h5")
        t0 = time.monotonic()
        write_tokens(data, n)
        gen = time.monotonic() - t0
        deck = os.path.join(work, "deck.toml")
        with open(deck, "w") as f:
            f.write(DECK.format(data=data, out=os.path.join(work, "run")))
        first = timed_run([trident, "train", deck], work, "step      1/")
        later = timed_run([trident, "train", deck], work, "step      1/")
        with h5py.File(os.path.join(work, "run", "metrics.h5"), "r") as f:
            share = float(np.median(f["data_s"][1:] / f["step_time_s"][1:]))
            data_ms = float(np.median(f["data_s"][1:])) * 1e3
        row = dict(tokens=n, generate_s=gen, first_start_s=first[0], first_rss_mb=first[2],
                   later_start_s=later[0], later_rss_mb=later[2], data_share=share,
                   data_ms=data_ms)
        rows.append(row)
        print(f"{n / 1e6:7.0f}M {first[0]:11.2f}s {first[2]:7.1f}MB {later[0]:11.2f}s "
              f"{later[2]:7.1f}MB {100 * share:9.3f}% ({data_ms:.2f} ms)", flush=True)
        os.remove(data)
        shutil.rmtree(os.path.join(work, "run"))
    results["training"] = rows


def prepare(trident, work, results, mb):
    print(f"\n== prepare-data on the KJV repeated to {mb} MB, SentencePiece BPE 4096 ==")
    kjv = os.path.join(work, "kjv.txt")
    try:
        text = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        print("bench: no `bible` (Debian bible-kjv): prepare-data part skipped")
        return
    text = "\n".join(l.split(" ", 1)[1] if " " in l else l for l in text.splitlines()) + "\n"
    with open(kjv, "w") as f:
        f.write(text)
    subprocess.run([trident, "prepare-data", "--input", kjv, "--output", "kjv.h5",
                    "--tokenizer", "sentencepiece", "--vocab-size", "4096"], cwd=work, check=True,
                   capture_output=True, env=env())
    with h5py.File(os.path.join(work, "kjv.h5"), "r") as f:
        model = f["tokenizer/model"][:].tobytes()
    with open(os.path.join(work, "kjv.model"), "wb") as f:
        f.write(model)
    big = os.path.join(work, "big.txt")
    data = text.encode()
    with open(big, "wb") as f:
        for _ in range((mb * 1_000_000 + len(data) - 1) // len(data)):
            f.write(data)
    size = os.path.getsize(big) / 1e6
    rows = {}
    for np_ in (1, 2):
        cmd = (["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none"] if np_ > 1 else [])
        _, secs, _, out = timed_run(cmd + [trident, "prepare-data", "--input", big, "--output",
                                           "big.h5", "--tokenizer-model", "kjv.model"], work)
        cpu = timed_run.cpu_s
        rows[f"trident_np{np_}"] = dict(seconds=secs, mb_s=size / secs, mb_s_per_rank=size / secs / np_,
                                        cpu_s=cpu, mb_per_cpu_s=size / cpu)
        print(f"trident prepare-data, {np_} rank(s): {secs:7.1f} s, {size / secs:6.1f} MB/s, "
              f"{size / secs / np_:6.1f} MB/s per rank; {size / cpu:6.2f} MB per CPU second",
              flush=True)
        os.remove(os.path.join(work, "big.h5"))
    spm = shutil.which("spm_encode")
    if spm:
        # The same runner; spm_encode reads the file and writes ids to a file, as trident does.
        _, secs, _, _ = timed_run(["sh", "-c", f'exec "{spm}" --model=kjv.model --output_format=id '
                                               f'--output=spm.ids --input="{big}"'], work)
        cpu = timed_run.cpu_s
        rows["spm_encode"] = dict(seconds=secs, mb_s=size / secs, cpu_s=cpu, mb_per_cpu_s=size / cpu)
        print(f"spm_encode (1 thread):            {secs:7.1f} s, {size / secs:6.1f} MB/s; "
              f"{size / cpu:6.2f} MB per CPU second", flush=True)
        os.remove(os.path.join(work, "spm.ids"))
    else:
        print("bench: no spm_encode (Debian sentencepiece): the comparison is skipped")
    results["prepare"] = dict(input_mb=size, **rows)
    os.remove(big)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--json")
    ap.add_argument("--parts", default="reads,training,prepare")
    args = ap.parse_args()
    trident = os.path.abspath(os.path.join(args.build, "trident"))
    work = os.path.abspath(os.path.join(args.build, "bench-work", "data"))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    sizes = [int(float(s)) for s in os.environ.get("BENCH_DATA_SIZES", "1e7,1e8,1e9").split(",")]
    results = {}
    parts = args.parts.split(",")
    if "reads" in parts:
        reads(args.build, work, results)
    if "training" in parts:
        training(trident, work, results, sizes)
    if "prepare" in parts:
        prepare(trident, work, results, int(os.environ.get("BENCH_PREPARE_MB", "1024")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
