#!/usr/bin/env python3
"""One run per out_dir (issue 32): the lock on <out_dir>/.trident.lock.

1. two runs on one out_dir: the second, started while the first trains, is refused with one
   `trident: error:` line naming the holder (host, pid, job id), exits non-zero, and the
   first's curve and final weights are bitwise those of an undisturbed run;
2. a requeued run waits (TRIDENT_LOCK_WAIT_S) for the old run to end, then goes on;
3. a stale lock, left by a run that died (TRIDENT_FAULT exit), is taken over with a warning
   naming the dead holder, and the run resumes;
4. `trident sample` streams (issue 32): with --tokens 10**8 (hours), the prompt and generated
   text arrive on the pipe while the process still runs, and they are the first bytes of what
   a --tokens 200 run prints.
"""
import os
import shutil
import socket
import subprocess
import sys
import time

import h5py
import numpy as np

TRIDENT = os.environ["TRIDENT"]
OUT = os.path.join(os.environ.get("TRIDENT_TEST_OUT", "/tmp"), "cli.out_dir_lock")
failures = []

DECK = """
[model]
seq_len = 32
n_layer = 1
n_head = 2
d_model = 32
[parallel]
micro_batch_size = 4
[train]
steps = 12
global_batch_size = 4
lr = 3e-3
warmup_steps = 2
eval_every = 0
[data]
train = "data/train.h5"
[io]
out_dir = "ref"
checkpoint_every = 4
keep_checkpoints = 0
[runtime]
threads = 1
"""


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def env_with(**extra):
    env = dict(os.environ)
    for k in ("TRIDENT_FAULT", "TRIDENT_LOCK_WAIT_S", "PBS_JOBID", "SLURM_JOB_ID"):
        env.pop(k, None)
    env.update(extra)
    return env


def run(*args, env=None, timeout=120):
    return subprocess.run([TRIDENT, *args], cwd=OUT, capture_output=True, text=True,
                          timeout=timeout, env=env or env_with())


def start(*args, env):
    return subprocess.Popen([TRIDENT, *args], cwd=OUT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def wait_for_record(out_dir, timeout=60):
    path = os.path.join(OUT, out_dir, ".trident.lock")
    t0 = time.time()
    while time.time() - t0 < timeout:
        if os.path.exists(path) and "pid=" in open(path).read():
            return True
        time.sleep(0.05)
    return False


def curve(out_dir):
    with h5py.File(os.path.join(OUT, out_dir, "metrics.h5"), "r") as m:
        return m["step"][:], m["loss"][:]


def weights(out_dir):
    with h5py.File(os.path.join(OUT, out_dir, "checkpoints", "step-00000012.h5"), "r") as f:
        out = {}
        f["model"].visititems(lambda n, d: out.__setitem__(n, d[...]) if isinstance(d, h5py.Dataset) else None)
        return out


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(os.path.join(OUT, "data"))
    rng = np.random.default_rng(0)
    words = "and the of to in that he said unto for his lord shall they was is".split()
    with open(os.path.join(OUT, "data", "corpus.txt"), "w") as f:
        f.write("\n".join(" ".join(rng.choice(words, 12)) + "." for _ in range(2000)) + "\n")
    p = run("prepare-data", "--input", "data/corpus.txt", "--output", "data/train.h5")
    if p.returncode != 0:
        sys.exit("FAIL: prepare-data: " + p.stderr)
    with open(os.path.join(OUT, "deck.toml"), "w") as f:
        f.write(DECK)

    p = run("train", "deck.toml")
    check(p.returncode == 0, "undisturbed run")
    ref_steps, ref_loss = curve("ref")

    # 1. a second run while the first trains
    first = start("train", "deck.toml", "--set", "io.out_dir=shared",
                  env=env_with(TRIDENT_FAULT="slow:0:250", PBS_JOBID="4242.pbs"))
    check(wait_for_record("shared"), "the first run's lock record appears")
    second = run("train", "deck.toml", "--set", "io.out_dir=shared",
                 env=env_with(TRIDENT_LOCK_WAIT_S="0.5"))
    err_lines = [l for l in second.stderr.splitlines() if l.startswith("trident: error:")]
    print(second.stderr.strip())
    check(second.returncode != 0, "second run exits non-zero")
    check(len(err_lines) == 1 and "in use by another run" in err_lines[0],
          "second run: one error line saying the out_dir is in use")
    if err_lines:
        e = err_lines[0]
        check(f"pid {first.pid}" in e and socket.gethostname() in e and "PBS_JOBID=4242.pbs" in e,
              "the error names the holder's host, pid and job id")
    check("sample index" not in second.stdout and "resuming" not in second.stdout,
          "second run neither built an index nor resumed")
    out1, err1 = first.communicate(timeout=120)
    check(first.returncode == 0, "first run finishes")
    steps, loss = curve("shared")
    check(np.array_equal(steps, ref_steps) and np.array_equal(loss, ref_loss),
          "first run's curve is bitwise the undisturbed one")
    a, b = weights("ref"), weights("shared")
    check(a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a),
          "first run's final weights are bitwise the undisturbed ones")
    check(open(os.path.join(OUT, "shared", ".trident.lock")).read() == "",
          "a clean exit leaves the lock file empty")

    # 1b. io.resume = "none" over another run's files: refused, unless io.overwrite = true
    def digests(d):
        import hashlib
        out = {}
        for root, _, files in os.walk(os.path.join(OUT, d)):
            for f in files:
                p = os.path.join(root, f)
                out[os.path.relpath(p, OUT)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
        return out
    before = digests("shared")
    p = run("train", "deck.toml", "--set", "io.out_dir=shared", "--set", "io.resume=none")
    print(p.stderr.strip())
    check(p.returncode != 0 and "io.resume" in p.stderr and "io.overwrite" in p.stderr,
          "resume = none over another run's files is refused naming io.overwrite")
    check(digests("shared") == before, "and touches none of them")
    p = run("train", "deck.toml", "--set", "io.out_dir=shared", "--set", "io.resume=none",
            "--set", "io.overwrite=true")
    check(p.returncode == 0 and "deleted the previous run" in p.stderr,
          "io.overwrite = true deletes the old run's files, with a warning")
    ck = sorted(os.listdir(os.path.join(OUT, "shared", "checkpoints")))
    check(ck == ["step-00000004.h5", "step-00000008.h5", "step-00000012.h5"], f"only the new run's checkpoints: {ck}")
    steps, loss = curve("shared")
    check(np.array_equal(loss, ref_loss), "the new run's curve starts afresh (= the undisturbed one)")

    # 2. a requeued job waits for the old one's ranks to exit
    first = start("train", "deck.toml", "--set", "io.out_dir=requeue",
                  env=env_with(TRIDENT_FAULT="slow:0:150"))
    check(wait_for_record("requeue"), "the old run's lock record appears")
    later = run("train", "deck.toml", "--set", "io.out_dir=requeue",
                env=env_with(TRIDENT_LOCK_WAIT_S="60"))
    first.communicate(timeout=120)
    print(later.stdout.strip())
    check(later.returncode == 0 and "waiting up to 60 s" in later.stdout
          and "nothing to do" in later.stdout, "the requeued run waited for the lock, then went on")

    # 3. a stale lock: a run that died holding it
    dead = run("train", "deck.toml", "--set", "io.out_dir=stale",
               env=env_with(TRIDENT_FAULT="exit:0:7"))
    check(dead.returncode != 0, "the dying run ends at step 7")
    rec = open(os.path.join(OUT, "stale", ".trident.lock")).read()
    check("pid=" in rec, "the dead run's record is left in the lock file")
    p = run("train", "deck.toml", "--set", "io.out_dir=stale")
    print(p.stderr.strip())
    check(p.returncode == 0, "the next run goes on")
    check("stale lock" in p.stderr and "trident: warning:" in p.stderr, "with a warning")
    check("resuming from" in p.stdout and "step-00000004.h5" in p.stdout, "and resumes from step 4")
    steps, loss = curve("stale")
    check(np.array_equal(loss, ref_loss), "its curve is the undisturbed one")

    # 4. sample streams its tokens
    ck = os.path.join("ref", "checkpoints", "step-00000012.h5")
    short = run("sample", "--checkpoint", ck, "--prompt", "and the", "--tokens", "200")
    check(short.returncode == 0 and short.stdout.startswith("and the"), "sample --tokens 200")
    proc = subprocess.Popen([TRIDENT, "sample", "--checkpoint", ck, "--prompt", "and the",
                             "--tokens", str(10**8)], cwd=OUT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env_with())
    got = b""
    while len(got) < len("and the") + 50:
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        got += chunk
    running = proc.poll() is None
    proc.kill()
    proc.wait()
    print(f"streamed {len(got)} bytes before the end: {got[:60]!r}")
    check(running and len(got) >= len("and the") + 50, "sample's tokens arrive while it runs")
    # The longer run's stream continues the shorter one's tokens: compare the bytes both have
    # (a read may return more than the 200-token run printed in all). The shorter run ends its
    # output with a newline where the longer one goes on with a token: that byte is left out.
    tokens = short.stdout.encode().rstrip(b"\n")
    both = min(len(got), len(tokens))
    check(both >= len("and the") + 50 and got[:both] == tokens[:both],
          "and they are those of the shorter run")

    if failures:
        sys.exit(f"FAIL: {len(failures)} check(s): {failures}")
    print("PASS")


if __name__ == "__main__":
    main()
