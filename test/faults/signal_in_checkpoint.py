#!/usr/bin/env python3
"""Stop signals that land while a checkpoint is being written, and a second signal while
the first stop is in progress (issue 32; FORMAT.md "Stopping a run"). 2 ranks (dp = 2), 12
steps, checkpoints every 4. TRIDENT_FAULT=pause-in-checkpoint:<rank>:<step> holds a rank
for 3 s in the middle of that step's checkpoint (after the model, before the Adam moments),
announced by one line that the test waits for before it signals.

1. the reference: 12 steps uninterrupted;
2. SIGTERM to rank 1 in the middle of the (regular) checkpoint of step 8: the write is
   finished, both ranks stop after step 8 and exit 0 with `SIGTERM: stopped after step 8`;
   step-00000008.h5 verifies (every checksum), no .tmp is left, metrics rows 1..8; a rerun
   resumes at 8 on the reference curve, bitwise;
3. two signals in a row: SIGUSR1 to rank 1 during start-up (the run stops after step 1 and
   writes that step's checkpoint for the stop), then, in the middle of that checkpoint,
   SIGTERM to rank 1, SIGUSR1 to rank 0 and SIGUSR1 to mpirun (forwarded to both): the later
   signals change nothing: the checkpoint of step 1 is finished, exit 0 with `SIGUSR1:
   stopped after step 1` (the first signal's name), no crash, no hang (within 30 s of the
   first signal); the rerun resumes at 1 on the reference curve;
4. SIGUSR1 to rank 0 in the middle of the checkpoint of the last step: the run has nothing
   left to stop, finishes as usual (exit 0, no `stopped` line) with all 12 rows.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import tinyrun as T  # noqa: E402

OUT = T.out_dir("faults.signal_in_checkpoint")
STEPS = 12
PAUSE = re.compile(r"TRIDENT_FAULT: pausing in the checkpoint of step (\d+)")
check = T.Checks("faults.signal_in_checkpoint")


def run(name, fault, at_start=None, mid_checkpoint=None):
    """trident train on 2 ranks under TRIDENT_FAULT = fault. at_start(p) is called at the
    first line of output, mid_checkpoint(p) when a rank announces its pause in a checkpoint.
    Returns (exit status or None on a hang, output, seconds from the first signal to the
    exit)."""
    env = T.mpi_env()
    env["TRIDENT_FAULT"] = fault
    cmd = T.mpirun(2) + [T.TRIDENT, "train", "deck.toml", "--set", f"io.out_dir={name}"]
    p = subprocess.Popen(cmd, cwd=OUT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env)
    lines, first = [], None
    try:
        for line in p.stdout:
            lines.append(line)
            if at_start and first is None:
                at_start(p)
                first = time.time()
            if mid_checkpoint and PAUSE.search(line):
                mid_checkpoint(p)
                first = first or time.time()
        rc = p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return rc, "".join(lines), (time.time() - first) if first else None


def rank_pid(p, rank):
    for _ in range(50):
        pids = T.rank_pids(p.pid)
        if rank in pids:
            return pids[rank]
        time.sleep(0.1)
    check(False, f"found rank {rank}'s process under mpirun")
    return None


def to_rank(rank, sig):
    def deliver(p):
        pid = rank_pid(p, rank)
        if pid:
            os.kill(pid, sig)
    return deliver


def verifies(path):
    """The checkpoint opens and every tensor matches its checksum (an export reads it all)."""
    out = path + ".export.h5"
    p = T.trident("export", "--checkpoint", path, "--out", out, cwd=OUT, check=False)
    if os.path.exists(out):
        os.remove(out)
    return p.returncode == 0


def stopped_and_resumed(name, rc, out, sig, k):
    check(rc == 0, f"{name}: exit 0 (got {rc})")
    stops = re.findall(r"(SIG\w+): stopped after step (\d+) of", out)
    check(stops == [(sig, str(k))], f"{name}: one '{sig}: stopped after step {k}' ({stops})")
    ck = T.checkpoint_path(os.path.join(OUT, name), k)
    check(os.path.exists(ck) and T.checkpoint_step(ck) == k and verifies(ck),
          f"{name}: step-{k:08d}.h5 written whole (step = {k}, every checksum)")
    left = [f for f in os.listdir(os.path.join(OUT, name, "checkpoints")) if ".tmp" in f]
    check(not left, f"{name}: no .tmp left behind ({left})")
    got = T.read_metrics(os.path.join(OUT, name, "metrics.h5"))
    check(list(got["step"]) == list(range(1, k + 1)), f"{name}: metrics rows 1..{k}")
    again = T.trident("train", "deck.toml", "--set", f"io.out_dir={name}", cwd=OUT, np_=2,
                      check=False)
    check(again.returncode == 0 and f"at step {k}" in again.stdout,
          f"{name}: the rerun resumed at step {k}")
    T.same_curve(check, os.path.join(OUT, "ref", "metrics.h5"),
                 os.path.join(OUT, name, "metrics.h5"), f"{name} resumed")


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    T.make_data(OUT)
    T.write_deck(os.path.join(OUT, "deck.toml"), "ref", STEPS, eval_every=4, checkpoint_every=4)
    T.trident("train", "deck.toml", cwd=OUT, np_=2)

    # 2. one signal in the middle of a regular checkpoint
    rc, out, dt = run("term_mid_write", "pause-in-checkpoint:1:8",
                      mid_checkpoint=to_rank(1, signal.SIGTERM))
    check(PAUSE.search(out) is not None, "term_mid_write: the writer paused in step 8's checkpoint")
    print(f"term_mid_write: exit {rc}, {dt:.1f} s after the signal" if dt else out[-3000:])
    stopped_and_resumed("term_mid_write", rc, out, "SIGTERM", 8)

    # 3. a stop at start-up, then more signals in the middle of the stop's own checkpoint
    def more_signals(p):
        to_rank(1, signal.SIGTERM)(p)
        to_rank(0, signal.SIGUSR1)(p)
        os.kill(p.pid, signal.SIGUSR1)

    rc, out, dt = run("twice", "pause-in-checkpoint:1:1", at_start=to_rank(1, signal.SIGUSR1),
                      mid_checkpoint=more_signals)
    check(PAUSE.search(out) is not None, "twice: the stop's checkpoint paused (the second signals landed in it)")
    check(dt is not None and dt < 30, f"twice: exited {dt:.1f} s after the first signal"
          if dt else "twice: exited")
    stopped_and_resumed("twice", rc, out, "SIGUSR1", 1)

    # 4. a signal in the middle of the last step's checkpoint: nothing left to stop
    rc, out, _ = run("last", f"pause-in-checkpoint:0:{STEPS}", mid_checkpoint=to_rank(0, signal.SIGUSR1))
    check(rc == 0 and "stopped after" not in out and PAUSE.search(out) is not None,
          f"last: finished as usual, exit 0 (got {rc})")
    check(verifies(T.checkpoint_path(os.path.join(OUT, "last"), STEPS)),
          f"last: step-{STEPS:08d}.h5 written whole")
    T.same_curve(check, os.path.join(OUT, "ref", "metrics.h5"),
                 os.path.join(OUT, "last", "metrics.h5"), "last")
    check.finish()


if __name__ == "__main__":
    main()
