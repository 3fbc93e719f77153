#!/usr/bin/env python3
"""The watchdog (runtime.watchdog_s) ends a stalled pipeline with a diagnosis, not a hang.

pp = 2, 1f1b, 4 microbatches, 3 training steps, runtime.watchdog_s = 2. With
TRIDENT_FAULT=stall:1:2 pipeline rank 1 sleeps before its first action of step 2; rank 0
runs F0 F1 and then waits in B0 for the gradient from pp rank 1. The job must end non-zero
well within the time limit (the watchdog's 2 s plus start-up, far below the stall's hour),
with one line on stderr naming rank 0, the action B0, the peer (pp rank 1) and the
communicator (pp). At dp = 2 the same stall leaves rank 0 in the gradients' allreduce, and
the line names that allreduce and the dp communicator; at tp = 2 with sequence parallelism,
the tp collective (the embedding's reduce-scatter). Without the fault the same deck
trains to the end under the watchdog.
TRIDENT_FAULT=exit:1:2 (rank 1 vanishes) also ends the job without a hang, and a
malformed TRIDENT_FAULT is one `trident: error:` line.
"""
import os
import subprocess
import sys
import time

from layout_common import LayoutTest, deck_text, TRIDENT

V, T, L, H, C, MBS, GBS = 101, 16, 4, 4, 32, 2, 8
LIMIT_S = 2.0
BUDGET_S = 60  # start-up of 2 ranks on shared cores + the limit, with a wide margin


def mpirun(t, fault, name, extra=()):
    env = dict(os.environ)
    env.pop("TRIDENT_FAULT", None)
    if fault:
        env["TRIDENT_FAULT"] = fault
    cmd = ["mpirun", "-np", "2", "--oversubscribe", TRIDENT, "train", "deck.toml",
           "--set", "parallel.pp=2", "--set", "parallel.schedule=1f1b",
           "--set", f"runtime.watchdog_s={LIMIT_S}", "--set", f"io.out_dir=run_{name}",
           "--set", "io.resume=none", *extra]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=t.out, env=env, capture_output=True, text=True,
                           timeout=BUDGET_S * 3)
    except subprocess.TimeoutExpired:
        return None, "", BUDGET_S * 3
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t0


def main():
    t = LayoutTest("mpi.pipeline_watchdog", deck_text(V, T, L, H, C, MBS, GBS, 3, 1), V, T, GBS, 4)

    rc, out, dt = mpirun(t, "", "ok")
    t.check(rc == 0, f"no fault: trains 3 steps under the watchdog (exit {rc}, {dt:.1f} s)")
    rc, out, dt = mpirun(t, "stall:1:2", "stall")
    lines = [l for l in out.splitlines() if "watchdog" in l]
    print("\n".join(lines) or out[-2000:])
    t.check(rc not in (None, 0) and dt < BUDGET_S, f"stall: the job ends non-zero in {dt:.1f} s "
            f"(exit {rc}, limit {LIMIT_S} s, budget {BUDGET_S} s)")
    want = ("trident: error: watchdog: rank 0 (pp rank 0) in B0 waits for the gradient from "
            f"pp rank 1 on communicator pp for more than {LIMIT_S:g} s")
    t.check(any(l.startswith(want) for l in lines), f"stall: stderr names the action: '{want}'")
    t.check(len(lines) == 1, f"stall: one watchdog line ({len(lines)})")

    # A stall seen from a collective: at dp = 2 (pp = 1) rank 0 finishes its backward and
    # waits for the gradients' bucketed allreduce over dp (train/grad_sync).
    rc, out, dt = mpirun(t, "stall:1:2", "stall_dp", ("--set", "parallel.pp=1",
                                                      "--set", "parallel.dp=2"))
    lines = [l for l in out.splitlines() if "watchdog" in l]
    print("\n".join(lines) or out[-2000:])
    want = "trident: error: watchdog: rank 0 (dp rank 0) waits in the DP gradient reduction "
    t.check(rc not in (None, 0) and dt < BUDGET_S and len(lines) == 1 and
            lines[0].startswith(want) and "on communicator dp for more than" in lines[0],
            f"stall at dp 2: the job ends in {dt:.1f} s (exit {rc}), naming the dp allreduce")

    # Inside a TP group under sequence parallelism: rank 0 waits in the embedding's
    # reduce-scatter (a blocking collective, watched too).
    rc, out, dt = mpirun(t, "stall:1:2", "stall_tp", ("--set", "parallel.pp=1",
                                                      "--set", "parallel.tp=2",
                                                      "--set", "parallel.sequence_parallel=true"))
    lines = [l for l in out.splitlines() if "watchdog" in l]
    print("\n".join(lines) or out[-2000:])
    want = "trident: error: watchdog: rank 0 (tp rank 0) waits in "
    t.check(rc not in (None, 0) and dt < BUDGET_S and len(lines) == 1 and
            lines[0].startswith(want) and "on communicator tp for more than" in lines[0],
            f"stall at tp 2 with SP: the job ends in {dt:.1f} s (exit {rc}), naming the tp "
            f"collective: {lines[:1]}")

    rc, out, dt = mpirun(t, "exit:1:2", "exit")
    t.check(rc not in (None, 0) and dt < BUDGET_S, f"exit: the job ends non-zero in {dt:.1f} s (exit {rc})")

    rc, out, dt = mpirun(t, "stall:one:2", "bad")
    errs = [l for l in out.splitlines() if l.startswith("trident: error:")]
    t.check(rc not in (None, 0) and len(errs) == 1 and
            errs[0].startswith("trident: error: TRIDENT_FAULT = 'stall:one:2'"),
            f"bad TRIDENT_FAULT: one error line (exit {rc}): {errs}")

    # Bad input that only the world size reveals: interleaved-1f1b with vpp = 2 needs the
    # microbatches per rank divisible by pp; 8 / (2 * 1) = 4 are, 6 / 2 = 3 are not.
    rc, out, dt = mpirun(t, "", "interleaved_m3", ("--set", "parallel.vpp=2", "--set",
                                                   "parallel.schedule=interleaved-1f1b",
                                                   "--set", "train.global_batch_size=6"))
    errs = [l for l in out.splitlines() if l.startswith("trident: error:")]
    t.check(rc not in (None, 0) and len(errs) == 1 and "parallel.pp" in errs[0] and
            "interleaved-1f1b" in errs[0] and dt < BUDGET_S,
            f"interleaved with 3 microbatches on pp 2: one error line, exit {rc}, {dt:.1f} s: "
            f"{errs[:1]}")
    t.finish()


if __name__ == "__main__":
    main()
