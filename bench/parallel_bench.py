"""Parallel layouts on this machine, for bench/bench.py: `trident train` under mpirun at
several TP x PP x DP shapes of the bench model, one thread per rank, each rank's step
time (median after warm-up, metrics.h5), tokens/s and the bytes every group moved per
step (rank 0's counters), with TP bytes checked against the closed form of
test/mpi/tensor_parallel.py, and where dp > 1 the share of the DP gradient reduction hidden
behind the backward (from the run's `dp sync:` line: the median final wait for the
buckets against the same buckets reduced alone, blocking)."""

import os
import re
import statistics
import subprocess

WARMUP = 3


def tp_bytes_per_step(model, micro_batch, microbatches, tp, sequence_parallel=False):
    """Ring bytes rank 0 moves over TP in one step (FORMAT.md, comm/<group>/bytes)."""
    if tp == 1:
        return 0.0
    r = (tp - 1) / tp
    C, L, T = model["d_model"], model["n_layer"], model["seq_len"]
    N = micro_batch * T
    S = 4 * N * C
    per_mb = 2 * r * S + 8 * r * S * L + 2 * r * S + 24 * r * N
    per_step = 16 * r + (2 * r * 4 * (4 * C * L + 2 * C) if sequence_parallel else 0)
    return microbatches * per_mb + per_step


def run_layout(trident, write_deck, work, env, model, data, name, shape, batch, micro_batch,
               steps, extra=None):
    """shape = (tp, pp, dp). Returns a result dict (or one with "error")."""
    import h5py
    import numpy as np

    tp, pp, dp = shape
    ranks = tp * pp * dp
    out_dir = os.path.join(work, f"layout-{name}")
    deck = os.path.join(work, f"layout-{name}.toml")
    parallel = {"tp": tp, "pp": pp, "dp": dp, "micro_batch_size": micro_batch}
    parallel.update(extra or {})
    write_deck(deck, {
        "model": model, "parallel": parallel,
        "train": {"steps": steps, "global_batch_size": batch, "warmup_steps": 2, "eval_every": 0},
        "data": {"train": data},
        "io": {"out_dir": out_dir, "checkpoint_every": 0, "resume": "none"},
        "runtime": {"threads": 1},
    })
    e = dict(env)
    e.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    cmd = [trident, "train", deck]
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none", *cmd]
    p = subprocess.run(cmd, env=e, capture_output=True, text=True)
    if p.returncode != 0:
        return {"name": name, "error": f"exited {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}"}
    with h5py.File(os.path.join(out_dir, "metrics.h5"), "r") as f:
        st = np.asarray(f["step_time_s"][...], dtype=np.float64)
        groups = {g: float(np.median(f[f"comm/{g}/bytes"][...]))
                  for g in ("tp", "dp", "pp", "embedding") if f"comm/{g}/bytes" in f}
    steady = st[WARMUP:] if len(st) > WARMUP else st
    step_s = float(statistics.median(steady))
    res = {"name": name, "shape": shape, "ranks": ranks, "median_step_s": step_s,
           "tokens_per_s": batch * model["seq_len"] / step_s, "bytes_per_step": groups}
    microbatches = batch // (micro_batch * dp)
    m = re.search(r"dp sync: (\d+) of (\d+) buckets started during the backward; final wait "
                  r"([\d.]+) ms \(median step\), the same buckets alone ([\d.]+) ms", p.stdout)
    if m:
        wait, alone = float(m.group(3)), float(m.group(4))
        res.update({"dp_buckets": int(m.group(2)), "dp_buckets_early": int(m.group(1)),
                    "dp_wait_ms": wait, "dp_alone_ms": alone,
                    "dp_hidden": max(0.0, 1.0 - wait / alone) if alone > 0 else None})
    res["tp_bytes_formula"] = tp_bytes_per_step(model, micro_batch, microbatches, tp,
                                                bool(parallel.get("sequence_parallel")))
    return res
