#!/usr/bin/env python3
"""The Slurm jobscripts under a real, single-node Slurm started for the test (issue 8).

Skipped (exit 77) where slurmctld, slurmd or munged are missing, or when not root (slurmd
and munged need it). test/slurm/minislurm.py starts the cluster in a temporary folder and
stops every daemon it started, whatever happens.

1. jobscripts/slurm/cpu.sbatch: two ranks through srun --mpi=pmix; exit code 0:0,
   COMPLETED, the run's metrics.h5 (one row per step, eval rows), its last checkpoint and
   config.toml;
2. an uninterrupted run of N steps (the reference for the chains' curves);
3. a time limit that the run outlives, twice: `--time=1 --signal=B:USR1@50` with
   jobscripts/slurm/chain.sbatch, CHAIN=requeue and then CHAIN=successor (its options as
   SBATCH_TIMELIMIT/SBATCH_SIGNAL). The batch shell gets SIGUSR1 from Slurm, forwards it
   to srun, trident checkpoints step K and exits 0, the job requeues itself / submits its
   successor with --dependency=afterok, the next job resumes at K (resume = "auto") and
   finishes: exit 0, the checkpoint of K, and the finished metrics bitwise those of the
   uninterrupted run;
4. an elastic chain (issue 32): chain.sbatch with CHAIN=successor and
   `parallel.layout = "auto"`, the first job on 4 ranks, its successors on the jobscript's 2:
   the planner chooses a layout of 4 ranks, then one of 2, which resumes the 4-rank
   checkpoint on the uninterrupted curve (to 1e-5 near the resume; layouts differ in
   summation order only).

cpu.sbatch, the reference and the three chains run side by side (the node declares 12 CPUs;
the chains are paced, so they mostly sleep), cpu.sbatch and the reference while the chains
wait for their tick. On a 2-core machine loaded by other work (load ~4): 74-78 s, against
113 s when cpu.sbatch ran alone first and the chains ran 20 s (their second jobs outlived
the next tick: three jobs a chain, see RUN_SECONDS). The elastic chain still took three
there: its first job, 4 ranks on 2 busy cores, loaded for ~10 s and wrote its checkpoint in
19-30 s.

Slurm checks time limits (and sends --signal) on a 30 s timer that starts with
slurmctld; the chains are submitted 12 s before a tick so that the signal lands mid-run
without waiting for a whole minute. A signal can still land while a job's ranks are loading
(slow on a loaded machine): chain.sbatch then continues from the last checkpoint, which the
checks below allow (such a job prints "still starting" and is not counted as a stop).
"""
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
import minislurm  # noqa: E402
import tinyrun as T  # noqa: E402

OUT = T.out_dir("slurm.jobs")
JOBSCRIPTS = os.path.join(T.SOURCE, "jobscripts", "slurm")
TICK = 30.0       # slurmctld's PERIODIC_TIMEOUT: time limits and --signal are checked then
LEAD = 12.0       # submit a chain this long before a tick (the job and trident start in ~2-7 s)
# A chain's run lasts at least RUN_SECONDS (paced, see PACE), r = RUN_SECONDS * (1 + a step's
# compute / PACE_MS) in all. Its first job is in its loop s = 1-7 s after submission, so it
# outlasts the tick when s + r > LEAD (4 s to spare at s = 1); what is left after the stop,
# s + r - LEAD, must end before the next tick, in the next job that starts ~7 s after the
# tick and loads in ~3 s: s + r - LEAD < 20 (else a third job runs: the test passes, 30 s
# later). At s = 7 that holds up to 14 ms of compute per step (20 s: up to 5 ms; loaded, the
# steps took 12 ms).
RUN_SECONDS = 15
PACE_MS = 20      # each step of a chain sleeps this long (TRIDENT_FAULT=slow:0:PACE_MS)
PACE = f"TRIDENT_FAULT=slow:0:{PACE_MS}"
check = T.Checks("slurm.jobs")


def job_env(**extra):
    env = {"TRIDENT": os.path.abspath(T.TRIDENT), "CPU_BIND": "none"}
    env.update(extra)
    return "ALL," + ",".join(f"{k}={v}" for k, v in env.items())


def sbatch(cluster, *args, env=None, timeout=240):
    cmd = ["sbatch", "--parsable"] + list(args)
    p = subprocess.run(cmd, cwd=OUT, env=env or cluster.env(), capture_output=True, text=True,
                       timeout=timeout)
    jobid = p.stdout.strip().split(";")[0] if p.stdout.strip() else None
    return p.returncode, jobid, p.stderr


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def show_output(text, lines=30):
    tail = [l for l in text.splitlines() if not l.startswith("step ")][-lines:]
    print("    | " + "\n    | ".join(tail))


def wait_for_tick(cluster):
    """Sleeps until LEAD seconds before slurmctld's next 30 s timer tick."""
    now = time.time()
    phase = (now - cluster.started_at) % TICK
    time.sleep((TICK - phase - LEAD) % TICK)


def check_chain(name, outputs, steps, ref_metrics):
    """Checks a finished chain: its stops, checkpoints, resumes and the curve."""
    text = "".join(outputs)
    stops = [int(k) for k in re.findall(rf"SIGUSR1: stopped after step (\d+) of {steps}", text)]
    check(len(stops) >= 1, f"{name}: trident stopped on the time limit's SIGUSR1 "
          f"(after steps {stops})")
    check("jobscript: stop signal" in text, f"{name}: the batch shell trapped SIGUSR1")
    for k in stops:
        ck = T.checkpoint_path(os.path.join(OUT, name), k)
        check(os.path.exists(ck) and T.checkpoint_step(ck) == k,
              f"{name}: checkpoint step-{k:08d}.h5 of the stop")
        check(f"resuming from {name}/checkpoints/step-{k:08d}.h5 at step {k}" in text,
              f"{name}: the next job resumed at step {k}")
    # Jobs that need no stop line: one signalled while its ranks were still loading (they
    # die of the signal; the jobscript goes on from the last checkpoint), and one that
    # resumed an already finished run because the signal came during the last step (the
    # run completed, but the jobscript saw a signal and continued the chain once more).
    early = text.count("while trident was still starting")
    late = text.count(f"at step {steps} (")
    check(text.count("jobscript: trident exited 0") == len(stops) + late + 1,
          f"{name}: every job's trident exited 0 ({len(stops)} stops, {early} signalled while "
          f"starting, {late} signalled in the last step, and the finish)")
    check(os.path.exists(T.checkpoint_path(os.path.join(OUT, name), steps)),
          f"{name}: the final checkpoint (step {steps})")
    T.same_curve(check, ref_metrics, os.path.join(OUT, name, "metrics.h5"), name)
    if not stops:
        show_output(text)


def elastic_deck(path, steps):
    """chain.toml's model, data and batch with the layout left to the planner (issue 32)."""
    deck = T.DECK.format(steps=steps, eval_every=0, out_dir="elastic", checkpoint_every=0,
                         data="data")
    deck = deck.replace("micro_batch_size = 4", 'layout = "auto"\nmachine = "{}"'.format(
        os.path.join(T.SOURCE, "input", "machines", "h100-sxm-dgx.toml")))
    with open(path, "w") as f:
        f.write(deck)


def check_elastic(outputs, state, steps, ref_metrics):
    """A chain whose successor has half the ranks: it resumes in another layout."""
    check(state == "COMPLETED" and len(outputs) >= 2,
          f"elastic: a successor ran and COMPLETED ({state}, {len(outputs)} jobs)")
    layouts = [re.findall(r'parallel\.layout = "auto": tp(\d+) pp(\d+) dp(\d+) ', o)
               for o in outputs]
    worlds = [int(t) * int(p) * int(d) for l in layouts for t, p, d in l[:1]]
    check(len(worlds) == len(outputs) and worlds[0] == 4 and all(w == 2 for w in worlds[1:]),
          f"elastic: the planner chose a layout of 4 ranks, then of 2 ({layouts})")
    text = "".join(outputs)
    stops = re.findall(rf"SIGUSR1: stopped after step (\d+) of {steps}", text)
    check(stops and f"resuming from elastic/checkpoints/step-{int(stops[0]):08d}.h5" in text,
          f"elastic: the 2-rank job resumed the 4-rank job's checkpoint (stops {stops})")
    # Another layout sums in another order, and the difference grows over the steps (float32
    # chaos: 3e-7 relative by step 100, 2e-3 by step 1000 in one run). So: tight around the
    # resume (a wrong resume, say fresh optimizer moments, is off by far more at once), loose
    # over the whole curve.
    a, b = T.read_metrics(ref_metrics), T.read_metrics(os.path.join(OUT, "elastic", "metrics.h5"))
    if not check(np.array_equal(a["step"], b["step"]), f"elastic: steps 1..{steps} once each"):
        return
    err = np.abs(b["loss"] / a["loss"] - 1)
    if stops:
        near = min(int(stops[0]) + 20, 300)
        check(err[:near].max() <= 1e-5, f"elastic: steps 1..{near}, past the resume at "
              f"{stops[0]}, on the uninterrupted curve to {err[:near].max():.1e} relative")
    check(err.max() <= 2e-2, f"elastic: the whole curve within {err.max():.1e} relative")
    if not stops:
        show_output(text)


def submit_cpu(cluster):
    """Submits jobscripts/slurm/cpu.sbatch (60 steps, eval and checkpoints); its job runs
    while the chains wait for their tick. Returns the job id."""
    T.write_deck(os.path.join(OUT, "cpu.toml"), "cpu", 60, eval_every=20, checkpoint_every=30)
    rc, jobid, err = sbatch(cluster, "--output=cpu-%j.out", f"--export={job_env(DECK='cpu.toml')}",
                            os.path.join(JOBSCRIPTS, "cpu.sbatch"))
    check(rc == 0 and jobid, f"cpu.sbatch submitted ({err.strip()})")
    return jobid


def check_cpu(cluster, jobid, state, seconds):
    """What `sbatch --wait` of cpu.sbatch would show: exit 0, COMPLETED, and the run's files."""
    out = read(os.path.join(OUT, f"cpu-{jobid}.out"))
    print(f"cpu.sbatch: job {jobid} {state} {seconds:.1f} s after its submission")
    exit_code = cluster.job(jobid).get("ExitCode")
    check(state == "COMPLETED" and exit_code == "0:0",
          f"cpu.sbatch: job COMPLETED with exit code 0:0 (got {state}, {exit_code})")
    check("layout tp=1 x pp=1 x dp=2" in out, "cpu.sbatch: two ranks through srun --mpi=pmix")
    check("jobscript: trident exited 0" in out, "cpu.sbatch: trident exited 0")
    if state != "COMPLETED" or "trident exited 0" not in out:
        show_output(out)
        cluster.dump_logs()
        return
    run = os.path.join(OUT, "cpu")
    m = T.read_metrics(os.path.join(run, "metrics.h5"))
    check(list(m["step"]) == list(range(1, 61)), "cpu.sbatch: metrics rows 1..60")
    check(list(m.get("eval/step", [])) == [20, 40, 60], "cpu.sbatch: eval rows 20, 40, 60")
    check(np.all(np.isfinite(m["loss"])) and m["loss"][-1] < m["loss"][0],
          "cpu.sbatch: finite losses that fall")
    check(os.path.exists(T.checkpoint_path(run, 60)) and os.path.exists(T.checkpoint_path(run, 30)),
          "cpu.sbatch: checkpoints of steps 30 and 60")
    check("steps = 60" in read(os.path.join(run, "config.toml")), "cpu.sbatch: config.toml")
    t = m["step_time_s"][1:]  # the pace, for the record
    print(f"cpu.sbatch steps: median {np.median(t) * 1e3:.2f} ms, 10th percentile "
          f"{np.percentile(t, 10) * 1e3:.2f} ms")


def wait_timed(cluster, jobid, timeout, t_submit):
    """The job's final state, and the seconds from t_submit until it was seen."""
    return cluster.wait_job(jobid, timeout), time.time() - t_submit


def follow_requeue(cluster, jobid, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        j = cluster.job(jobid)
        if j.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return j
        time.sleep(0.5)
    return cluster.job(jobid)


def follow_successors(cluster, jobid, timeout, prefix="succ"):
    """Follows the chain job -> successor (named in each output); returns the job ids."""
    ids, t0 = [jobid], time.time()
    while time.time() - t0 < timeout:
        j = cluster.job(ids[-1])
        st = j.get("JobState")
        if st in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return ids, st
        if st == "COMPLETED":
            m = re.search(r"successor job (\d+)", read(os.path.join(OUT, f"{prefix}-{ids[-1]}.out")))
            if not m:
                return ids, st
            ids.append(m.group(1))
        time.sleep(1)
    return ids, "TIMEOUT(test)"


def main():
    if os.geteuid() != 0:
        print("skipped: the local Slurm cluster needs root (slurmd, munged)")
        sys.exit(T.SKIP)
    missing = minislurm.installed()
    if missing:
        print(f"skipped: Slurm is not installed here (missing {', '.join(missing)}); "
              "apt-get install slurm-wlm munge")
        sys.exit(T.SKIP)
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    T.make_data(OUT)
    root = tempfile.mkdtemp(prefix="trident-slurm-")
    cluster = minislurm.MiniSlurm(root, cpus=12, cred_expire=5)
    t_start = time.time()
    try:
        cluster.start()
        print(f"cluster up in {time.time() - t_start:.1f} s ({root})")
        # 1. cpu.sbatch and 2. the uninterrupted reference (chain.toml, through the same
        # jobscript and layout) run while the chains wait for their tick (the node has CPUs
        # for all five jobs). The chains are paced (TRIDENT_FAULT=slow: PACE_MS of sleep in
        # every step), so that a chain lasts at least RUN_SECONDS whatever the load.
        t_cpu = time.time()
        cpu_id = submit_cpu(cluster)
        steps = RUN_SECONDS * 1000 // PACE_MS
        expect_s = 1.5 * steps * PACE_MS / 1e3  # the waits allow for more
        print(f"chains of {steps} steps paced at {PACE_MS} ms (at least {RUN_SECONDS} s each)")
        T.write_deck(os.path.join(OUT, "chain.toml"), "ref", steps)
        t_ref = time.time()
        rc, ref_id, _ = sbatch(cluster, "--output=ref-%j.out",
                               f"--export={job_env(DECK='chain.toml')}",
                               os.path.join(JOBSCRIPTS, "cpu.sbatch"))
        check(rc == 0, "reference run submitted")

        # 3. both chains at once, LEAD seconds before a tick: the requeue (the same job id
        # comes back after cred_expire) and the successor (each job submits the next with
        # --dependency=afterok). Paced, they leave the cores mostly idle.
        wait_for_tick(cluster)
        t0 = time.time()
        args = "TRIDENT_ARGS=--set io.out_dir=requeue"
        rc, req_id, err = sbatch(cluster, "--time=1", "--signal=B:USR1@50",
                                 "--output=requeue-%j.out",
                                 f"--export={job_env(DECK='chain.toml', CHAIN='requeue')},{args},{PACE}",
                                 os.path.join(JOBSCRIPTS, "chain.sbatch"))
        check(rc == 0, f"chain.sbatch (requeue) submitted ({err.strip()})")
        env = cluster.env(SBATCH_TIMELIMIT="1", SBATCH_SIGNAL="B:USR1@50",
                          SBATCH_OUTPUT=os.path.join(OUT, "succ-%j.out"))
        args = "TRIDENT_ARGS=--set io.out_dir=successor"
        rc, succ_id, err = sbatch(cluster, f"--export={job_env(DECK='chain.toml', CHAIN='successor')},{args},{PACE}",
                                  os.path.join(JOBSCRIPTS, "chain.sbatch"), env=env)
        check(rc == 0, f"chain.sbatch (successor) submitted ({err.strip()})")
        # 3c. elastic: the first job has 4 ranks (--ntasks-per-node on the command line),
        # its successor the jobscript's 2; parallel.layout = "auto" plans each job's layout.
        elastic_deck(os.path.join(OUT, "elastic.toml"), steps)
        args = "TRIDENT_ARGS=--set io.out_dir=elastic"
        env = cluster.env(SBATCH_TIMELIMIT="1", SBATCH_SIGNAL="B:USR1@50",
                          SBATCH_OUTPUT=os.path.join(OUT, "elastic-%j.out"))
        rc, el_id, err = sbatch(cluster, "--ntasks-per-node=4",
                                f"--export={job_env(DECK='elastic.toml', CHAIN='successor')},{args},{PACE}",
                                os.path.join(JOBSCRIPTS, "chain.sbatch"), env=env)
        check(rc == 0, f"chain.sbatch (elastic) submitted ({err.strip()})")
        timeout = 150 + 4 * expect_s
        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            cpu_f = pool.submit(wait_timed, cluster, cpu_id, 240, t_cpu) if cpu_id else None
            el_f = pool.submit(follow_successors, cluster, el_id, timeout, "elastic")
            ref_f = pool.submit(cluster.wait_job, ref_id, 120 + 4 * expect_s)
            req_f = pool.submit(follow_requeue, cluster, req_id, timeout)
            succ_f = pool.submit(follow_successors, cluster, succ_id, timeout)
            if cpu_f:
                check_cpu(cluster, cpu_id, *cpu_f.result())
            st = ref_f.result() if ref_id else "not submitted"
            print(f"reference: {steps} steps in {time.time() - t_ref:.1f} s")
            j = req_f.result()
            print(f"requeue chain: job {req_id} {j.get('JobState')} after {j.get('Restarts')} "
                  f"requeue(s), {time.time() - t0:.1f} s")
            ids, succ_st = succ_f.result()
            print(f"successor chain: jobs {ids} ({succ_st}), {time.time() - t0:.1f} s")
            el_ids, el_st = el_f.result()
            print(f"elastic chain: jobs {el_ids} ({el_st}), {time.time() - t0:.1f} s")

        if not check(st == "COMPLETED", f"reference run COMPLETED ({st})"):
            show_output(read(os.path.join(OUT, f"ref-{ref_id}.out")))
            check.finish()
        ref = os.path.join(OUT, "ref", "metrics.h5")
        check(j.get("JobState") == "COMPLETED" and int(j.get("Restarts", 0)) >= 1,
              "requeue: the job was requeued and COMPLETED")
        check_chain("requeue", [read(os.path.join(OUT, f"requeue-{req_id}.out"))], steps, ref)
        check(succ_st == "COMPLETED" and len(ids) >= 2, "successor: a successor ran and COMPLETED")
        if len(ids) >= 2:
            dep = re.search(r"successor job (\d+)", read(os.path.join(OUT, f"succ-{ids[0]}.out")))
            check(dep is not None and dep.group(1) == ids[1], "successor: named in the output")
        check_chain("successor", [read(os.path.join(OUT, f"succ-{i}.out")) for i in ids],
                    steps, ref)
        check_elastic([read(os.path.join(OUT, f"elastic-{i}.out")) for i in el_ids], el_st,
                      steps, ref)
    except BaseException:
        cluster.dump_logs()
        raise
    finally:
        daemons = dict(cluster.procs)
        cluster.stop()
        left = [n for n, pid in daemons.items() if minislurm.alive(pid)]
        check(not left, f"every daemon the test started has stopped ({', '.join(daemons)})"
              + (f"; left: {left}" if left else ""))
        shutil.rmtree(root, ignore_errors=True)
    print(f"slurm.jobs: {time.time() - t_start:.0f} s in all")
    check.finish()


if __name__ == "__main__":
    main()
