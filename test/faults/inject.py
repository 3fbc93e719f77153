#!/usr/bin/env python3
"""Injected faults (TRIDENT_FAULT, core/fault.hpp) on a 2-rank job (dp = 2): the job ends,
what was written survives, and a resume continues the uninterrupted curve (issues 6, 9).

1. the reference: 12 steps uninterrupted, checkpoints every 4 steps;
2. `exit` of rank 1 at step 6, and `abort` (SIGABRT) of rank 0 at step 10: the job ends
   non-zero within 60 s; the newest checkpoint (4, then 8) is intact; a plain rerun resumes
   there and the finished metrics are bitwise the reference's;
3. `kill-in-checkpoint` (SIGKILL of rank 1 in the middle of the checkpoint of step 8,
   after the model and before the Adam moments): the job ends, step-00000008.h5 does not
   exist (at worst a .tmp), step-00000004.h5 verifies; the rerun resumes at 4 and matches;
4. `nan` (rank 1's gradients NaN at step 5) with train.on_nonfinite = "abort": exit 1 with
   one `trident: error:` line naming the step and train.on_nonfinite, a checkpoint of step
   4 written by the abort (optimizer_steps 4), and a rerun resumes the reference curve;
5. the same with on_nonfinite = "skip": the run finishes; step 5's row has a NaN norm and
   skipped = 1 (every other row 0); the checkpoint of step 5 holds the weights and Adam
   moments of step 4 bitwise, optimizer_steps = 4; a resume from step 5 continues bitwise
   the run that went through.
A malformed TRIDENT_FAULT is one agreed error line.
"""
import os
import shutil
import subprocess
import sys
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import tinyrun as T  # noqa: E402

OUT = T.out_dir("faults.inject")
STEPS = 12
check = T.Checks("faults.inject")


def train(run, fault=None, extra=(), timeout=60):
    """trident train on 2 ranks with TRIDENT_FAULT = fault; (returncode, output, seconds)."""
    env = T.mpi_env()
    env.pop("TRIDENT_FAULT", None)
    if fault:
        env["TRIDENT_FAULT"] = fault
    cmd = T.mpirun(2) + [T.TRIDENT, "train", "deck.toml", "--set", f"io.out_dir={run}",
                         *[a for kv in extra for a in ("--set", kv)]]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=OUT, env=env, capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout + p.stderr, time.time() - t0
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        subprocess.run(["pkill", "-9", "-f", f"io.out_dir={run}"], check=False)
        return None, out, time.time() - t0


def metrics(run):
    return T.read_metrics(os.path.join(OUT, run, "metrics.h5"))


def ck(run, step):
    return T.checkpoint_path(os.path.join(OUT, run), step)


def verifies(path):
    """The checkpoint opens and every tensor matches its checksum (an export reads it all)."""
    p = T.trident("export", "--checkpoint", path, "--out", path + ".export.h5", cwd=OUT,
                  check=False)
    ok = p.returncode == 0
    if os.path.exists(path + ".export.h5"):
        os.remove(path + ".export.h5")
    return ok


def group(path, name):
    with h5py.File(path, "r") as f:
        return {k: f[name][k][:] for k in f[name]}


def crash_and_resume(run, fault, expect_ck, lost_ck=None):
    rc, out, sec = train(run, fault)
    check(rc not in (0, None) and sec < 60,
          f"{fault}: the job ended non-zero in {sec:.1f} s (rc {rc})")
    check(os.path.exists(ck(run, expect_ck)) and verifies(ck(run, expect_ck)),
          f"{fault}: checkpoint {expect_ck} intact and verified")
    if lost_ck is not None:
        check(not os.path.exists(ck(run, lost_ck)),
              f"{fault}: no step-{lost_ck:08d}.h5 from the interrupted write "
              f"({sorted(os.listdir(os.path.join(OUT, run, 'checkpoints')))})")
    rc, out, _ = train(run)
    check(rc == 0 and f"at step {expect_ck}" in out, f"{fault}: rerun resumed at {expect_ck}")
    T.same_curve(check, os.path.join(OUT, "ref", "metrics.h5"),
                 os.path.join(OUT, run, "metrics.h5"), fault)


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    T.make_data(OUT)
    T.write_deck(os.path.join(OUT, "deck.toml"), "ref", STEPS, eval_every=4, checkpoint_every=4)

    rc, out, _ = train("ref")
    if not check(rc == 0, "reference run"):
        print(out[-3000:])
        check.finish()

    crash_and_resume("exit", "exit:1:6", 4)
    crash_and_resume("abort", "abort:0:10", 8)
    crash_and_resume("killck", "kill-in-checkpoint:1:8", 4, lost_ck=8)

    # non-finite gradients, abort: the checkpoint of the last good step, one error line
    rc, out, _ = train("nanabort", "nan:1:5", extra=["io.checkpoint_every=0"])
    errors = [l for l in out.splitlines() if l.startswith("trident: error:")]
    check(rc == 1 and len(errors) == 1 and "step 5" in errors[0]
          and "train.on_nonfinite" in errors[0] and "not finite" in errors[0],
          f"nan/abort: exit 1 with one error line naming step 5 ({errors})")
    check(os.path.exists(ck("nanabort", 4)), "nan/abort: the checkpoint of step 4 was written")
    if os.path.exists(ck("nanabort", 4)):
        with h5py.File(ck("nanabort", 4), "r") as f:
            check(int(f.attrs["optimizer_steps"]) == 4, "nan/abort: optimizer_steps = 4")
    rc, out, _ = train("nanabort", extra=["io.checkpoint_every=0"])
    check(rc == 0 and "at step 4" in out, "nan/abort: the rerun resumed at step 4")
    T.same_curve(check, os.path.join(OUT, "ref", "metrics.h5"),
                 os.path.join(OUT, "nanabort", "metrics.h5"), "nan/abort")

    # non-finite gradients, skip: the step is left undone and counted
    rc, out, _ = train("nanskip", "nan:1:5", extra=["io.checkpoint_every=1", 'train.on_nonfinite="skip"'])
    check(rc == 0, f"nan/skip: the run finished (rc {rc})")
    with h5py.File(os.path.join(OUT, "nanskip", "metrics.h5"), "r") as f:
        loss, norm, skipped = f["loss"][:], f["grad_norm"][:], f["skipped"][:]
    check(np.isnan(norm[4]) and np.all(np.isfinite(np.delete(norm, 4))) and np.all(np.isfinite(loss)),
          "nan/skip: step 5's gradient norm is NaN, the other norms and all losses finite")
    check(list(skipped) == [0] * 4 + [1] + [0] * (STEPS - 5), f"nan/skip: skipped = {list(skipped)}")
    ref = metrics("ref")
    check(np.array_equal(ref["loss"][:4], loss[:4]), "nan/skip: steps 1-4 equal the reference")
    same = all(np.array_equal(group(ck("nanskip", 4), g)[k], group(ck("nanskip", 5), g)[k])
               for g in ("model", "optimizer/exp_avg", "optimizer/exp_avg_sq")
               for k in group(ck("nanskip", 4), g))
    check(same, "nan/skip: the checkpoint of step 5 holds step 4's weights and moments bitwise")
    with h5py.File(ck("nanskip", 5), "r") as f:
        check(int(f.attrs["optimizer_steps"]) == 4 and int(f.attrs["step"]) == 5,
              "nan/skip: step 5's checkpoint has optimizer_steps = 4")
    # resume from step 5 in a copy: the same curve as the run that went through
    shutil.copytree(os.path.join(OUT, "nanskip"), os.path.join(OUT, "nanskip2"))
    for s in range(6, STEPS + 1):
        os.remove(ck("nanskip2", s))
    rc, out, _ = train("nanskip2", extra=["io.checkpoint_every=1", 'train.on_nonfinite="skip"'])
    check(rc == 0 and "at step 5" in out, "nan/skip: resumed from step 5")
    a, b = metrics("nanskip"), metrics("nanskip2")
    check(all(np.array_equal(a[c], b[c], equal_nan=True) for c in ("step", "loss", "lr", "grad_norm")),
          "nan/skip: the resumed curve is bitwise the one that went through")

    rc, out, _ = train("bad", "explode:1:5")
    errors = [l for l in out.splitlines() if l.startswith("trident: error:")]
    check(rc not in (0, None) and len(errors) == 1 and "TRIDENT_FAULT" in errors[0],
          f"a malformed TRIDENT_FAULT: one error line ({errors})")
    check.finish()


if __name__ == "__main__":
    main()
