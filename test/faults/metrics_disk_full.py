#!/usr/bin/env python3
"""metrics.h5 when the disk fills between the room check and the flush (issue 32; FORMAT.md
"Full disks"). Before each flush the writer reserves on disk the blocks the flush may write
(fallocate); TRIDENT_FAULT=disk-full-in-metrics:0:<step> makes that reservation fail with
ENOSPC at one step, as when another process fills the file system after the room check.

At 1 and 2 ranks, 12 steps, checkpoints and evaluations every 4:
1. the reference, uninterrupted;
2. the disk full at the row of step 6: exit non-zero within 20 s (every rank gone, no crash
   trace), exactly one `trident: error:` line, naming metrics.h5 and `disk full`; metrics.h5 opens with h5py
   and holds the rows of steps 1..5 and the evaluation of step 4, bitwise the reference's
   (the last good flush; no row of step -1 or NaN); a rerun resumes at step 4 and ends on
   the reference curve;
3. the disk full as a fresh run creates the file (step 0): the same one line, and no
   metrics.h5 is left (it held nothing);
4. a real full disk (a small tmpfs, where mounting is allowed; root): a fresh run with the
   room checks of its rows skipped (no-room-check) beside a filler that leaves 72 to 320 KiB
   free: whichever write meets the full disk, metrics.h5 is readable or absent afterwards.
   Without the reservation, 96 to 240 KiB left it unreadable ("addr overflow": the
   superblock pointed past the end of the file).
"""
import os
import re
import shutil
import subprocess
import sys
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import tinyrun as T  # noqa: E402

OUT = T.out_dir("faults.metrics_disk_full")
STEPS = 12
check = T.Checks("faults.metrics_disk_full")


def train(run, np_, fault=None):
    env = T.mpi_env()
    env.pop("TRIDENT_FAULT", None)
    if fault:
        env["TRIDENT_FAULT"] = fault
    cmd = T.mpirun(np_) + [T.TRIDENT, "train", "deck.toml", "--set", f"io.out_dir={run}"]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=OUT, env=env, capture_output=True, text=True, timeout=20)
        return p.returncode, p.stdout + p.stderr, time.time() - t0
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        return None, out, time.time() - t0


def crashed(out):
    """A crash trace after the error (HDF5's shutdown once segfaulted on a failed file)."""
    return any(w in out for w in ("Segmentation fault", "signal 11", "H5F__close", "Aborted"))


def rows(path):
    """The step table and the eval table as read by h5py (the finding if it cannot)."""
    try:
        with h5py.File(path, "r") as f:
            return {k: f[k][:] for k in ("step", "loss", "grad_norm")}, \
                   {k: f["eval"][k][:] for k in ("step", "loss")}
    except Exception as e:  # noqa: BLE001 - any failure to read it is the finding
        return str(e), None


def disk_full(run, np_, step, train_rows, eval_rows):
    rc, out, sec = train(run, np_, f"disk-full-in-metrics:0:{step}")
    errors = [l for l in out.splitlines() if l.startswith("trident: error:")]
    ok = rc not in (0, None) and sec < 20 and not crashed(out)
    check(ok, f"{run}: exit non-zero within 20 s, every rank gone (rc {rc}, {sec:.1f} s)")
    check(len(errors) == 1 and "metrics.h5" in errors[0]
          and "disk full" in errors[0], f"{run}: one error line naming metrics.h5 ({errors})")
    if not ok or len(errors) != 1:
        print(out[-3000:])
    path = os.path.join(OUT, run, "metrics.h5")
    got, got_eval = rows(path)
    if not check(got_eval is not None, f"{run}: metrics.h5 readable with h5py ({got})"):
        return
    ref, ref_eval = rows(os.path.join(OUT, f"ref{np_}", "metrics.h5"))
    check(list(got["step"]) == list(range(1, train_rows + 1)),
          f"{run}: train rows 1..{train_rows} (got {list(got['step'])})")
    check(all(np.array_equal(got[k], ref[k][:train_rows]) for k in ("loss", "grad_norm")),
          f"{run}: those rows bitwise the reference's")
    check(list(got_eval["step"]) == eval_rows
          and np.array_equal(got_eval["loss"], ref_eval["loss"][:len(eval_rows)]),
          f"{run}: eval rows {eval_rows} (got {list(got_eval['step'])})")
    rc, out, _ = train(run, np_)
    resumed = re.search(r"at step (\d+)", out)
    check(rc == 0 and resumed is not None, f"{run}: the rerun finished (resumed "
          f"{resumed.group(1) if resumed else '?'})")
    T.same_curve(check, os.path.join(OUT, f"ref{np_}", "metrics.h5"), path, f"{run} rerun")


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    T.make_data(OUT)
    T.write_deck(os.path.join(OUT, "deck.toml"), "ref", STEPS, eval_every=4, checkpoint_every=4)
    for np_ in (1, 2):
        rc, out, _ = train(f"ref{np_}", np_)
        if not check(rc == 0, f"reference run on {np_} rank(s)"):
            print(out[-3000:])
            check.finish()
        disk_full(f"row{np_}", np_, 6, 5, [4])

    rc, out, _ = train("fresh", 2, "disk-full-in-metrics:0:0")
    errors = [l for l in out.splitlines() if l.startswith("trident: error:")]
    check(rc not in (0, None) and not crashed(out) and len(errors) == 1 and "metrics.h5" in errors[0]
          and "disk full" in errors[0], f"fresh: one error line naming metrics.h5 ({errors})")
    check(not os.path.exists(os.path.join(OUT, "fresh", "metrics.h5")),
          "fresh: no metrics.h5 left (it held no row)")
    real_disk()
    check.finish()


def real_disk():
    mnt = os.path.join(OUT, "full")
    os.makedirs(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", mnt],
                      capture_output=True).returncode != 0:
        print("real disk: cannot mount a tmpfs here (not root?); skipped")
        return
    try:
        for free_k in (72, 160, 240, 320):
            for f in os.listdir(mnt):
                shutil.rmtree(os.path.join(mnt, f), ignore_errors=True)
                if os.path.exists(os.path.join(mnt, f)):
                    os.remove(os.path.join(mnt, f))
            st = os.statvfs(mnt)
            with open(os.path.join(mnt, "filler"), "wb") as f:  # the sample index needs ~40 KiB
                f.write(b"\0" * (st.f_bavail * st.f_frsize - (free_k + 40) * 1024))
            rc, out, sec = train("full/run", 1, "no-room-check:0:1,no-room-check:0:4")
            errors = [l for l in out.splitlines() if l.startswith("trident: error:")]
            check(rc not in (0, None) and len(errors) == 1 and not crashed(out),
                  f"real disk, {free_k} KiB free: one error line ({errors})")
            path = os.path.join(mnt, "run", "metrics.h5")
            got, _ = rows(path) if os.path.exists(path) else ({"step": []}, None)
            check(not isinstance(got, str), f"real disk, {free_k} KiB free: metrics.h5 readable "
                  f"or absent ({got if isinstance(got, str) else list(got['step'])})")
    finally:
        subprocess.run(["umount", "-l", mnt], capture_output=True)


if __name__ == "__main__":
    main()
