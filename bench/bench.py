"""trident's CPU benchmark (bench/run.sh runs it): one rank, 2 threads, the GPT-2 below, and in
the same run its two yardsticks —
  1. PyTorch on the same model, batch and threads (bench/torch_bench.py), under each of a few
     thread environments, keeping the fastest: the peer;
  2. trident: `trident train` for ~30 steps, the median of metrics.h5's step_time_s after the
     warm-up steps;
  3. OpenBLAS SGEMM GFLOP/s on the model's largest GEMMs (bench/sgemm_bench.cpp): the ceiling;
  4. the model's FLOPs per step (flops_per_step below), hence trident's achieved GFLOP/s;
  5. pipeline bubbles at pp = 2, m = 8 (bench/pipeline_bench.py): each stage's measured idle
     fraction from the step's trace against the simulator's, for gpipe, 1f1b and zb-h1.
Goals: trident step / torch step <= 0.8; trident GFLOP/s / SGEMM GFLOP/s >= 0.7.
Prints a table and writes results.json ($OUT if set, else BUILD/bench-work/).

OpenBLAS picks its kernels from the CPU id; on CPUs it does not know (this machine's, under KVM)
it falls back to "Prescott" (SSE3) kernels, 4x slower than the AVX-512 ones. When OPENBLAS_CORETYPE
is unset and the library reports Prescott on a CPU with AVX-512 (AVX2), this script sets
OPENBLAS_CORETYPE=SkylakeX (Haswell) for all three measurements, and says so.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
PYTHON = os.environ.get("PYTHON", "/usr/bin/python3")

# The bench model and step (the task's fixed point; change here, nowhere else).
MODEL = dict(vocab_size=4096, seq_len=128, n_layer=4, n_head=4, d_model=256)
# The same size with Llama blocks: 2 kv heads of 4 (grouped-query), Llama's MLP rule (768).
LLAMA = dict(MODEL, arch="llama", n_kv_head=2)
BATCH = 8           # global batch = micro-batch: one microbatch per step
THREADS = int(os.environ.get("BENCH_THREADS", "2"))
TRIDENT_STEPS = int(os.environ.get("BENCH_TRIDENT_STEPS", "30"))
TRIDENT_WARMUP = 5  # steps left out of the median
TORCH_STEPS = int(os.environ.get("BENCH_TORCH_STEPS", "20"))
TORCH_WARMUP = 3


def flops_per_step(vocab_size, seq_len, n_layer, n_head, d_model, batch):
    """FLOPs of one training step (forward + backward), multiply-add = 2 FLOPs:
         6 * N * P_mm  +  12 * B * T^2 * C * L
    with N = B*T tokens and P_mm = L * 12 C^2 + V C the parameters that take part in matmuls
    (per block: c_attn 3C^2, attn.c_proj C^2, c_fc 4C^2, mlp.c_proj 4C^2; plus the tied LM head
    V C; the embedding lookups are not matmuls): 2 N P_mm forward and 4 N P_mm backward (input
    and weight gradients). Attention: per layer Q K^T and A V are 2 B T^2 C FLOPs each forward,
    twice that backward: 12 B T^2 C per layer, counting the full T x T (not the causal half),
    as PaLM's and llm.c's counts do. LayerNorm, GELU, softmax and AdamW are left out (O(N C))."""
    del n_head  # heads split C; the count does not depend on them
    N, C, L, V, T = batch * seq_len, d_model, n_layer, vocab_size, seq_len
    p_mm = L * 12 * C * C + V * C
    return 6 * N * p_mm + 12 * batch * T * T * C * L


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def base_env():
    env = dict(os.environ)
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def choose_coretype(sgemm, env):
    if "OPENBLAS_CORETYPE" in env:
        return env["OPENBLAS_CORETYPE"], "set by the user"
    core = subprocess.run([sgemm, "--corename"], env=env, capture_output=True,
                          text=True).stdout.strip()
    flags, vendor = "", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags") and not flags:
                    flags = line
                if line.startswith("vendor_id") and not vendor:
                    vendor = line.split(":", 1)[1].strip()
    except OSError:
        pass
    if core.lower() == "prescott":
        fl = set(flags.split())
        # Never the AVX-512 core types on AMD (see include/trident/ops/blas_core.hpp).
        if {"avx512f", "avx512bw", "avx512vl"} <= fl and vendor != "AuthenticAMD":
            return "SkylakeX", "OpenBLAS detected Prescott on an AVX-512 CPU: overridden"
        if "avx2" in fl:
            return "Haswell", "OpenBLAS detected Prescott on an AVX2 CPU: overridden"
    return None, f"OpenBLAS's own choice ({core})"


def run_sgemm(sgemm, env):
    p = subprocess.run([sgemm, str(THREADS), "20"], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": f"sgemm bench exited {p.returncode}: {p.stderr.strip()}"}
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    return {r["gemm"]: r for r in rows}


TORCH_ENVS = [  # torch's own OpenMP pool for elementwise ops, OpenBLAS's pthreads for GEMMs
    {"OMP_NUM_THREADS": str(THREADS), "OPENBLAS_NUM_THREADS": str(THREADS)},
    {"OMP_NUM_THREADS": str(THREADS), "OPENBLAS_NUM_THREADS": "1"},
    {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": str(THREADS)},
]


def run_torch(env, model=MODEL):
    def once(extra, steps, warmup):
        e = dict(env)
        e.update(extra)
        cmd = [PYTHON, os.path.join(HERE, "torch_bench.py"), "--threads", str(THREADS),
               "--steps", str(steps), "--warmup", str(warmup), "--batch", str(BATCH)]
        for k, v in model.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        p = subprocess.run(cmd, env=e, capture_output=True, text=True)
        if p.returncode != 0:
            return {"error": f"torch bench exited {p.returncode}: {p.stderr.strip()[-500:]}"}
        return json.loads(p.stdout.strip().splitlines()[-1])

    trials = []
    for extra in TORCH_ENVS:
        r = once(extra, 6, 2)
        trials.append({"env": extra, "median_step_s": r.get("median_step_s"),
                       "error": r.get("error")})
        log(f"torch trial {extra}: " + (f"{r['median_step_s'] * 1e3:.1f} ms" if "error" not in r
                                        else r["error"]))
    ok = [t for t in trials if t["median_step_s"]]
    if not ok:
        return {"error": trials[0]["error"], "trials": trials}
    best = min(ok, key=lambda t: t["median_step_s"])
    r = once(best["env"], TORCH_STEPS, TORCH_WARMUP)
    r["trials"] = trials
    return r


def token_dataset(build, work, trident, env):
    """A token dataset with vocab 4096: the KJV SentencePiece data of `make data` if built, else
    `trident prepare-data` on the KJV text (cached in work/), else random ids written here."""
    import h5py
    import numpy as np

    def vocab_of(path):
        try:
            with h5py.File(path, "r") as f:
                return int(f.attrs["vocab_size"])
        except (OSError, KeyError):
            return None

    made = os.path.join(SRC, "input", "data", "kjv-train.h5")
    if vocab_of(made) == MODEL["vocab_size"]:
        return made, "input/data/kjv-train.h5 (make data)"
    cached = os.path.join(work, "kjv-4096.h5")
    if vocab_of(cached) == MODEL["vocab_size"]:
        return cached, "KJV, SentencePiece 4096 (cached)"
    text = os.path.join(work, "kjv.txt")
    try:
        if not os.path.exists(text):
            verses = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True,
                                    text=True, check=True).stdout
            with open(text + ".tmp", "w") as f:
                f.writelines(line.split(" ", 1)[1] + "\n" if " " in line else line + "\n"
                             for line in verses.splitlines())
            os.replace(text + ".tmp", text)
        p = subprocess.run([trident, "prepare-data", "--input", text, "--output", cached,
                            "--tokenizer", "sentencepiece", "--vocab-size",
                            str(MODEL["vocab_size"])], env=env, capture_output=True, text=True)
        if p.returncode == 0 and vocab_of(cached) == MODEL["vocab_size"]:
            return cached, "KJV, SentencePiece 4096 (trident prepare-data)"
        log(f"trident prepare-data failed ({p.stderr.strip()[-300:]}); using random token ids")
    except (OSError, subprocess.CalledProcessError) as e:
        log(f"no KJV text ({e}); using random token ids")
    # The reader accepts only "byte" (vocab 256) or "sentencepiece" with a model; training
    # does not tokenize, so a placeholder model stands in (labelled as such in the results).
    rand = os.path.join(work, "random-4096.h5")
    rng = np.random.default_rng(0)
    with h5py.File(rand, "w") as f:
        f.create_dataset("tokens", data=rng.integers(0, MODEL["vocab_size"], size=1 << 20,
                                                     dtype=np.int32))
        f.attrs["vocab_size"] = np.int64(MODEL["vocab_size"])
        f.attrs["tokenizer"] = "sentencepiece"
        f.create_dataset("tokenizer/model", data=np.frombuffer(b"placeholder", dtype=np.uint8))
    return rand, "random ids (placeholder SentencePiece model)"


def run_trident(build, work, env, model=MODEL, run_name="trident-run"):
    sys.path.insert(0, os.path.join(SRC, "tools"))
    import h5py
    import numpy as np
    import trident_torch as tt

    trident = os.path.join(build, "trident")
    data, data_what = token_dataset(build, work, trident, env)
    out_dir = os.path.join(work, run_name)
    deck = os.path.join(work, run_name + ".toml")
    tt.write_deck(deck, {
        "model": model,
        "parallel": {"micro_batch_size": BATCH},
        "train": {"steps": TRIDENT_STEPS, "global_batch_size": BATCH, "warmup_steps": 5,
                  "eval_every": 0},
        "data": {"train": data},
        "io": {"out_dir": out_dir, "checkpoint_every": 0, "keep_checkpoints": 1,
               "resume": "none", "overwrite": True},  # benchmarks rerun in one work dir
        "runtime": {"threads": THREADS},
    })
    metrics = os.path.join(out_dir, "metrics.h5")
    if os.path.exists(metrics):
        os.remove(metrics)
    e = dict(env)
    e.update({"OMP_NUM_THREADS": str(THREADS), "OPENBLAS_NUM_THREADS": str(THREADS)})
    t0 = time.perf_counter()
    p = subprocess.run([trident, "train", deck], env=e, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return {"error": f"trident train exited {p.returncode}: "
                         f"{(p.stderr or p.stdout).strip()[-500:]}", "data": data_what}
    try:
        with h5py.File(metrics, "r") as f:
            st = np.asarray(f["step_time_s"][...], dtype=np.float64)
            loss = np.asarray(f["loss"][...], dtype=np.float64)
    except (OSError, KeyError) as ex:
        return {"error": f"cannot read {metrics}: {ex}", "data": data_what}
    steady = st[TRIDENT_WARMUP:] if len(st) > TRIDENT_WARMUP else st
    if len(steady) == 0:
        return {"error": f"{metrics} has no step_time_s entries", "data": data_what}
    return {"median_step_s": float(statistics.median(steady)), "min_step_s": float(steady.min()),
            "steps": int(len(st)), "warmup": TRIDENT_WARMUP, "first_loss": float(loss[0]),
            "last_loss": float(loss[-1]), "wall_s": wall, "data": data_what, "deck": deck}


# TP scaling: the bench model at TP 1 and 2 (one thread per rank, so 2 ranks use the cores
# the 2-thread single-rank run uses), with TP sequence parallel as a third row.
LAYOUTS = [("tp1", (1, 1, 1), {}), ("tp2", (2, 1, 1), {}),
           ("tp2-sp", (2, 1, 1), {"sequence_parallel": True})]
LAYOUT_STEPS = int(os.environ.get("BENCH_LAYOUT_STEPS", "12"))

# 3D composition on 4 ranks (one thread each): tp x pp x dp, micro-batches of 2 sequences
# (1x1x4 runs one microbatch per rank, 2x2x1 four per pipeline).
LAYOUTS_4 = [("1x1x4", (1, 1, 4)), ("2x1x2", (2, 1, 2)), ("1x2x2", (1, 2, 2)),
             ("2x2x1", (2, 2, 1))]
MICRO_4 = 2
# The model's 17 MB of gradients would fit one default (25 MiB) bucket, which can only start
# once the backward is over: 2 MiB buckets let the backward hide them.
BUCKET_MB_4 = 2.0


def run_layouts(build, work, env):
    sys.path.insert(0, os.path.join(SRC, "tools"))
    import parallel_bench as pb
    import trident_torch as tt

    trident = os.path.join(build, "trident")
    data, _ = token_dataset(build, work, trident, env)
    rows = []
    for name, shape, extra in LAYOUTS:
        log(f"layout {name} ...")
        rows.append(pb.run_layout(trident, tt.write_deck, work, env, MODEL, data, name, shape,
                                  BATCH, BATCH, LAYOUT_STEPS, extra))
    return rows


def run_layouts_4(build, work, env):
    sys.path.insert(0, os.path.join(SRC, "tools"))
    import parallel_bench as pb
    import trident_torch as tt

    trident = os.path.join(build, "trident")
    data, _ = token_dataset(build, work, trident, env)
    rows = []
    for name, shape in LAYOUTS_4:
        log(f"4-rank layout {name} ...")
        r = pb.run_layout(trident, tt.write_deck, work, env, MODEL, data, name, shape,
                          BATCH, MICRO_4, LAYOUT_STEPS, {"grad_bucket_mb": BUCKET_MB_4})
        if shape[1] > 1:
            r.pop("tp_bytes_formula", None)  # its closed form assumes every layer on rank 0
        rows.append(r)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--sgemm", required=True)
    ap.add_argument("--skip-trident", action="store_true")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    work = os.path.join(build, "bench-work")
    os.makedirs(work, exist_ok=True)
    out = os.environ.get("OUT") or work
    os.makedirs(out, exist_ok=True)

    env = base_env()
    coretype, core_note = choose_coretype(a.sgemm, env)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    log(f"OPENBLAS_CORETYPE={env.get('OPENBLAS_CORETYPE', '(unset)')}: {core_note}")
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None

    log("SGEMM ...")
    sgemm = run_sgemm(a.sgemm, env)
    log("PyTorch ...")
    torch_r = run_torch(env)
    log("trident ...")
    trident_r = {"error": "not measured (the trident build failed)"} if a.skip_trident else run_trident(build, work, env)

    # The Llama step at the same size against PyTorch's Llama (tools/trident_torch.py) in the
    # same run.
    log("PyTorch Llama ...")
    torch_llama = run_torch(env, LLAMA)
    log("trident Llama ...")
    trident_llama = ({"error": "not measured (the trident build failed)"} if a.skip_trident
                     else run_trident(build, work, env, LLAMA, "trident-llama"))
    t_tl, t_pl = trident_llama.get("median_step_s"), torch_llama.get("median_step_s")
    llama = {"model": LLAMA, "trident": trident_llama, "torch": torch_llama,
             "trident_step_ms": t_tl * 1e3 if t_tl else None,
             "torch_step_ms": t_pl * 1e3 if t_pl else None,
             "ratio_trident_over_torch": t_tl / t_pl if t_tl and t_pl else None,
             "goal": "<= 0.6"}

    layouts = [] if a.skip_trident else run_layouts(build, work, env)
    layouts4 = [] if a.skip_trident else run_layouts_4(build, work, env)
    pipeline = []
    if not a.skip_trident:
        log("pipeline bubbles ...")
        sys.path.insert(0, HERE)
        import pipeline_bench
        pipeline = pipeline_bench.run_pipeline(build, work, env)

    flops = flops_per_step(**MODEL, batch=BATCH)
    t_tr, t_pt = trident_r.get("median_step_s"), torch_r.get("median_step_s")
    head = sgemm.get("lm_head_fwd", {}).get("gflops")
    res = {
        "model": MODEL, "batch": BATCH, "threads": THREADS, "flops_per_step": flops,
        "openblas_coretype": env.get("OPENBLAS_CORETYPE"), "openblas_note": core_note,
        "loadavg_1min_at_start": load,
        "trident": trident_r, "torch": torch_r, "sgemm": sgemm,
        "trident_step_ms": t_tr * 1e3 if t_tr else None,
        "torch_step_ms": t_pt * 1e3 if t_pt else None,
        "ratio_trident_over_torch": t_tr / t_pt if t_tr and t_pt else None,
        "trident_gflops": flops / t_tr * 1e-9 if t_tr else None,
        "torch_gflops": flops / t_pt * 1e-9 if t_pt else None,
        "sgemm_gflops": head,
        "ratio_trident_over_sgemm": flops / t_tr * 1e-9 / head if t_tr and head else None,
        "llama": llama,
        "layouts": layouts,
        "layouts_4": layouts4,
        "pipeline": pipeline,
        "goals": {"ratio_trident_over_torch": "<= 0.8", "ratio_trident_over_sgemm": ">= 0.7"},
    }
    path = os.path.join(out, "results.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=2)

    def fmt(v, spec):
        return format(v, spec) if v is not None else "n/a"

    print(f"\ntrident bench: GPT-2 L={MODEL['n_layer']} d_model={MODEL['d_model']} "
          f"n_head={MODEL['n_head']} seq_len={MODEL['seq_len']} vocab={MODEL['vocab_size']}, "
          f"batch {BATCH}, 1 rank x {THREADS} threads, {flops / 1e9:.2f} GFLOP/step, "
          f"OPENBLAS_CORETYPE={env.get('OPENBLAS_CORETYPE', '(auto)')}")
    if load is not None and load > 0.5:
        print(f"(note: 1-minute load average {load:.2f} at the start: other work shares the cores)")
    rows = [
        ("trident step (ms)", fmt(res["trident_step_ms"], ".1f"), ""),
        (f"torch {torch_r.get('torch_version', '')} step (ms)", fmt(res["torch_step_ms"], ".1f"),
         str(torch_r.get("env", ""))),
        ("ratio trident/torch", fmt(res["ratio_trident_over_torch"], ".3f"), "goal <= 0.8"),
        ("trident GFLOP/s", fmt(res["trident_gflops"], ".1f"), ""),
        ("torch GFLOP/s", fmt(res["torch_gflops"], ".1f"), ""),
        ("SGEMM GFLOP/s (LM head 1024x256x4096)", fmt(head, ".1f"), ""),
        ("SGEMM GFLOP/s (c_fc 1024x256x1024)",
         fmt(sgemm.get("mlp_c_fc_fwd", {}).get("gflops"), ".1f"), ""),
        ("ratio trident/SGEMM", fmt(res["ratio_trident_over_sgemm"], ".3f"), "goal >= 0.7"),
        ("Llama (n_kv_head 2): trident step (ms)", fmt(llama["trident_step_ms"], ".1f"), ""),
        ("Llama: torch step (ms)", fmt(llama["torch_step_ms"], ".1f"),
         str(torch_llama.get("env", ""))),
        ("Llama: ratio trident/torch", fmt(llama["ratio_trident_over_torch"], ".3f"),
         "goal <= 0.6"),
    ]
    w = max(len(r[0]) for r in rows)
    for name, val, note in rows:
        print(f"  {name:<{w}}  {val:>9}  {note}")
    if layouts:
        print("\n  layout   ranks  step (ms)  tokens/s  TP bytes/step  formula      DP bytes/step")
        base = next((r["median_step_s"] for r in layouts if r.get("name") == "tp1"), None)
        for r in layouts:
            if "error" in r:
                print(f"  {r['name']:<8} {r['error']}")
                continue
            b = r["bytes_per_step"]
            speedup = f"  ({base / r['median_step_s']:.2f}x tp1)" if base else ""
            print(f"  {r['name']:<8} {r['ranks']:>5}  {r['median_step_s'] * 1e3:9.1f}  "
                  f"{r['tokens_per_s']:8.0f}  {b.get('tp', 0):13.0f}  {r['tp_bytes_formula']:11.0f}"
                  f"  {b.get('dp', 0):13.0f}{speedup}")
    if layouts4:
        print(f"\n  4 ranks x 1 thread, tp x pp x dp, micro-batch {MICRO_4}, batch {BATCH}, "
              f"{BUCKET_MB_4:g} MiB DP buckets: bytes per step on rank 0; "
              "DP hidden = 1 - (final wait) / (same buckets alone)")
        print("  layout  step (ms)  tokens/s  TP bytes   PP bytes   DP bytes   emb bytes  "
              "DP hidden (wait/alone ms)")
        for r in layouts4:
            if "error" in r:
                print(f"  {r['name']:<7} {r['error']}")
                continue
            b = r["bytes_per_step"]
            hid = (f"{r['dp_hidden'] * 100:5.0f}%  ({r['dp_wait_ms']:.2f}/{r['dp_alone_ms']:.2f}, "
                   f"{r['dp_buckets_early']}/{r['dp_buckets']} buckets early)"
                   if r.get("dp_hidden") is not None else "    -")
            print(f"  {r['name']:<7} {r['median_step_s'] * 1e3:9.1f}  {r['tokens_per_s']:8.0f}  "
                  f"{b.get('tp', 0):9.0f}  {b.get('pp', 0):9.0f}  {b.get('dp', 0):9.0f}  "
                  f"{b.get('embedding', 0):9.0f}  {hid}")
    if pipeline:
        pipeline_bench.print_table(pipeline)
    for what, r in (("trident", trident_r), ("torch", torch_r), ("sgemm", sgemm)):
        if "error" in r:
            print(f"  {what}: {r['error']}")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
