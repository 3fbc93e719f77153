#!/usr/bin/env python3
"""A graceful stop (issue 6): SIGTERM or SIGUSR1 makes every rank agree, checkpoint the
step it has finished, print it and exit 0; `resume = "auto"` then continues the curve
bitwise (same layout: mpirun -np 2, dp = 2).

1. the reference: the run uninterrupted;
2. SIGTERM to rank 1 alone (as a batch system or the OOM-killer's cousin would signal one
   process): rank 0 hears of it through the step-boundary MPI_Allreduce, both ranks stop
   after the same step K and exit 0; step-K.h5 exists (step attribute K), metrics.h5 has
   rows 1..K; a second `trident train` resumes at K and the finished metrics equal the
   reference's, train and eval rows;
3. SIGUSR1 to mpirun (Open MPI forwards it to every rank): the same;
4. SIGUSR1 to rank 1 while the job is still starting (at rank 0's first line of output,
   before any step): not fatal; the run stops after its first step, checkpoints it and
   exits 0 (a scheduler's signal can land during a slow start-up).

SIGTERM to mpirun itself is not a graceful path with Open MPI 4.1: mpirun takes it as an
abort (SIGCONT, SIGTERM and SIGKILL to the ranks a second apart, exit 1), which is why the
jobscripts turn a TERM into a USR1 for the launcher.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tinyrun as T  # noqa: E402

OUT = T.out_dir("tools.signals")
STEPS = 400
check = T.Checks("tools.signals")


def interrupted_run(name, deliver, after_step=20):
    """Starts the run, waits for step `after_step` on rank 0's output (None: its first line
    of any kind), calls deliver(p) and returns (exit status, output, seconds from the
    signal to the exit)."""
    cmd = T.mpirun(2) + [T.TRIDENT, "train", "deck.toml", "--set", f"io.out_dir={name}"]
    p = subprocess.Popen(cmd, cwd=OUT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=T.mpi_env())
    lines, sent = [], None
    try:
        for line in p.stdout:
            lines.append(line)
            m = re.match(r"step\s+(\d+)/", line)
            due = after_step is None or (m and int(m.group(1)) >= after_step)
            if sent is None and due:
                deliver(p)
                sent = time.time()
        rc = p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    return rc, "".join(lines), (time.time() - sent) if sent else None


def to_rank1(p, sig=signal.SIGTERM):
    pids = {}
    for _ in range(50):
        pids = T.rank_pids(p.pid)
        if 1 in pids:
            break
        time.sleep(0.1)
    check(1 in pids, f"found rank 1's process under mpirun ({pids})")
    os.kill(pids[1], sig)


def to_mpirun(p):
    os.kill(p.pid, signal.SIGUSR1)


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    T.make_data(OUT)
    T.write_deck(os.path.join(OUT, "deck.toml"), "ref", STEPS, eval_every=50,
                 checkpoint_every=100)
    t0 = time.time()
    T.trident("train", "deck.toml", cwd=OUT, np_=2)
    print(f"reference: {STEPS} steps in {time.time() - t0:.1f} s")
    ref = os.path.join(OUT, "ref", "metrics.h5")

    for name, sig, deliver, after in (
            ("term_rank1", "SIGTERM", to_rank1, 20),
            ("usr1_mpirun", "SIGUSR1", to_mpirun, 20),
            ("usr1_startup", "SIGUSR1", lambda p: to_rank1(p, signal.SIGUSR1), None)):
        rc, out, dt = interrupted_run(name, deliver, after)
        check(rc == 0, f"{name}: exit 0 after {sig} (got {rc})")
        m = re.search(rf"{sig}: stopped after step (\d+) of {STEPS}", out)
        if not check(m is not None, f"{name}: '{sig}: stopped after step K' printed"):
            print(out[-3000:])
            continue
        k = int(m.group(1))
        print(f"{name}: stopped after step {k}, {dt:.2f} s after the signal")
        check((after or 1) <= k < STEPS, f"{name}: stopped early (step {k})")
        ck = T.checkpoint_path(os.path.join(OUT, name), k)
        check(os.path.exists(ck) and T.checkpoint_step(ck) == k,
              f"{name}: checkpoint step-{k:08d}.h5 with step = {k}")
        check(f"checkpoint {name}/checkpoints/step-{k:08d}.h5" in out,
              f"{name}: the checkpoint is logged")
        got = T.read_metrics(os.path.join(OUT, name, "metrics.h5"))
        check(list(got["step"]) == list(range(1, k + 1)), f"{name}: metrics rows 1..{k}")
        again = T.trident("train", "deck.toml", "--set", f"io.out_dir={name}", cwd=OUT, np_=2)
        check(f"resuming from {name}/checkpoints/step-{k:08d}.h5 at step {k}" in again.stdout,
              f"{name}: resumed at step {k}")
        T.same_curve(check, ref, os.path.join(OUT, name, "metrics.h5"), f"{name} resumed")
    check.finish()


if __name__ == "__main__":
    main()
