#!/usr/bin/env python3
"""GPU training benchmark: `trident train` end to end on one GPU (runtime.device = "cuda",
runtime.precision = "bf16"), GPT-2 small and medium, a few steps each on random tokens, and the
rate the model reaches against two ceilings measured or stated in the same run.

For each model:
  1. a token dataset of random bytes, made by `trident prepare-data --tokenizer byte` (no
     tokenizer, no h5py needed; token ids < 256 while the model keeps its full 50304-entry
     vocabulary, so every product has GPT-2's shape: the ids do not change the work);
  2. `trident train` on one rank, run directly (an MPI singleton, no mpirun), STEPS optimizer
     steps of GLOBAL sequences of 1024 tokens in microbatches of MICRO (gradient accumulation);
  3. the per-step times: metrics.h5's step_time_s (FORMAT.md) when h5py is importable, else the
     tok/s of trident's progress lines; the first WARMUP steps are left out, the median kept;
  4. tokens/s = GLOBAL * seq_len / median step time, and the model FLOPs per token
         6 N + 12 n_layer seq_len d_model
     (N = every parameter, embeddings included, vocabulary padded to 50304; forward + backward
     products, 2 FLOPs per multiply-add; attention counted over the full T x T, as llm.c and
     PaLM's MFU do; LayerNorm, GELU, softmax, AdamW left out);
  5. MFU = FLOPs/s over (a) the GPU's dense bf16 tensor-core peak from NVIDIA's data sheet by
     its name (H100/H200 SXM 989.4 TFLOP/s, H100 PCIe 756.5, NVL parts 835.5; without
     sparsity: an ASSUMPTION of this script, printed with the results; --peak-tflops changes it) and (b) the rate cuBLAS reaches in the same run
     on the model's largest product, the LM head logits = x @ wte^T
     [MICRO*1024, d_model] x [d_model, 50304], bf16 inputs, fp32 output and accumulation (what
     the backend's bf16 products run), measured by build's trident_bench_cublas.

Writes gpu_train_bench.json and gpu_train_bench.txt (the table) to --out.

  --cuda-graphs  each model twice, without and with runtime.cuda_graphs = true: both median
               step times and whether the loss curves are equal bit for bit (metrics.h5;
               "cuda_graphs" in the json, a second table in the txt).

  --cpu-smoke  a tiny model on runtime.device = "cpu" (fp32) for a few steps, no cuBLAS: proves
               the script on a machine without a GPU (the "MFU" there is against the same GPU
               peak, i.e. meaningless, and labelled so).

Usage: gpu_train_bench.py [--trident PATH] [--cublas PATH] [--out DIR] [--models small,medium]
                          [--steps N] [--warmup N] [--timeout S] [--cpu-smoke] [--cuda-graphs]
(TRIDENT and TRIDENT_BENCH_CUBLAS in the environment also name the binaries.)
Exit status: 0 when every model ran, 1 when one failed (the others are still reported).
"""

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)

H200_BF16_DENSE_TFLOPS = 989.4  # assumption: NVIDIA H200 SXM data sheet, dense (no sparsity)
# Dense bf16 tensor-core peaks (TFLOP/s, NVIDIA's data sheets: half the "with sparsity" figure)
# by the GPU's name as nvidia-smi gives it; the device tool lends H100s as well as H200s, and
# an H100 PCIe's peak is a quarter below an SXM's. First match wins: the variants first.
GPU_BF16_DENSE_TFLOPS = [("H200 NVL", 835.5), ("H200", 989.4), ("GH200", 989.4),
                         ("H100 NVL", 835.5), ("H100 PCIe", 756.5), ("H100", 989.4),
                         ("A100", 312.0)]


def gpu_name():
    """The first GPU's name (nvidia-smi), or "" where there is none."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return p.stdout.strip().splitlines()[0].strip() if p.returncode == 0 and p.stdout.strip() else ""


def assumed_peak(given=None, name=None):
    """(TFLOP/s, what it is): the --peak-tflops given, else the data sheet's dense bf16 peak of
    this GPU (by name), else the H200's, labelled as a guess."""
    if given:
        return given, "given with --peak-tflops"
    name = gpu_name() if name is None else name
    for key, tflops in GPU_BF16_DENSE_TFLOPS:
        if key in name:
            return tflops, f"{name}: dense bf16, data sheet, assumed"
    return H200_BF16_DENSE_TFLOPS, f"H200 dense bf16 assumed (GPU {name or 'unknown'} not in the table)"
VOCAB = 50304                   # GPT-2's 50257 padded to a multiple of 128
SEQ = 1024

# name: model shape and the step: micro-batch (sequences) and microbatches per step
MODELS = {
    "small": dict(model=dict(n_layer=12, d_model=768, n_head=12), micro=8, accum=4),
    "medium": dict(model=dict(n_layer=24, d_model=1024, n_head=16), micro=8, accum=4),
}
SMOKE = dict(model=dict(n_layer=2, d_model=64, n_head=4), micro=2, accum=2, seq=64, vocab=512)


def log(msg):
    print(f"gpu_train_bench: {msg}", file=sys.stderr, flush=True)


def params(n_layer, d_model, vocab, seq):
    """Every parameter of the GPT-2 (FORMAT.md), the LM head tied to wte."""
    c = d_model
    per_block = 12 * c * c + 13 * c  # c_attn 3c^2+3c, c_proj c^2+c, fc 4c^2+4c, proj 4c^2+c, 2 LN 4c
    return vocab * c + seq * c + n_layer * per_block + 2 * c


def flops_per_token(n_layer, d_model, vocab, seq):
    return 6 * params(n_layer, d_model, vocab, seq) + 12 * n_layer * seq * d_model


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))  # a TOML basic string is a JSON string for our paths


def write_deck(path, deck):
    with open(path, "w") as f:
        for section, keys in deck.items():
            f.write(f"[{section}]\n")
            for k, v in keys.items():
                f.write(f"{k} = {toml_value(v)}\n")
            f.write("\n")


def make_dataset(trident, work, tokens):
    """`tokens` random bytes as a byte-tokenized dataset (cached in work/)."""
    path = os.path.join(work, f"random-bytes-{tokens}.h5")
    if os.path.exists(path):
        return path
    text = os.path.join(work, "random-bytes.txt")
    rng = random.Random(1234)
    with open(text, "wb") as f:
        f.write(rng.randbytes(tokens) if hasattr(rng, "randbytes")
                else bytes(rng.getrandbits(8) for _ in range(tokens)))
    p = subprocess.run([trident, "prepare-data", "--input", text, "--output", path + ".tmp",
                        "--tokenizer", "byte"], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"trident prepare-data exited {p.returncode}: "
                           f"{(p.stderr or p.stdout).strip()[-400:]}")
    os.replace(path + ".tmp", path)
    os.remove(text)
    return path


def step_times(metrics, stdout, seq_tokens_per_step):
    """Per-step seconds: metrics.h5's step_time_s (h5py), else the progress lines' tok/s."""
    try:
        import h5py  # noqa: F401  (optional)
        with h5py.File(metrics, "r") as f:
            return [float(x) for x in f["step_time_s"][...]], "metrics.h5 step_time_s"
    except ImportError:
        pass
    except (OSError, KeyError) as e:
        log(f"cannot read {metrics} ({e}); using the progress lines")
    rates = [float(m.group(1)) for m in re.finditer(r"\|\s*([0-9.]+) tok/s", stdout)]
    return [seq_tokens_per_step / r for r in rates if r > 0], "progress lines (tok/s)"


def run_cublas(cublas, name, m, n, k, timeout):
    """TFLOP/s cuBLAS reaches on row-major [m,k] x [n,k]^T in bf16 (None, reason on failure)."""
    if not cublas or not os.path.exists(cublas):
        return None, f"no trident_bench_cublas ({cublas or 'not given'})"
    try:
        p = subprocess.run([cublas, "20", "--mode", "bf16", "--shape", f"{name}={m}x{n}x{k},tb"],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"trident_bench_cublas timed out after {timeout} s"
    if p.returncode != 0:
        return None, f"trident_bench_cublas exited {p.returncode}: {p.stderr.strip()[-300:]}"
    for line in p.stdout.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("gemm") == name and row.get("mode") == "bf16":
            return float(row["tflops"]), None
    return None, "trident_bench_cublas printed no bf16 row"


def losses(metrics):
    """metrics.h5's loss column (None without h5py or the file)."""
    try:
        import h5py
        with h5py.File(metrics, "r") as f:
            return [float(x) for x in f["loss"][...]]
    except (ImportError, OSError, KeyError):
        return None


def run_model(args, name, spec, work, data, graphs=False):
    m = spec["model"]
    seq = spec.get("seq", SEQ)
    vocab = spec.get("vocab", VOCAB)
    micro, accum = spec["micro"], spec["accum"]
    global_batch = micro * accum
    device, precision = ("cpu", "fp32") if args.cpu_smoke else ("cuda", "bf16")
    out_dir = os.path.join(work, f"run-{name}" + ("-graphs" if graphs else ""))
    shutil.rmtree(out_dir, ignore_errors=True)
    deck = os.path.join(work, f"{name}{'-graphs' if graphs else ''}.toml")
    write_deck(deck, {
        "model": dict(vocab_size=vocab, seq_len=seq, **m),
        "parallel": {"micro_batch_size": micro},
        "train": {"steps": args.steps, "global_batch_size": global_batch,
                  "warmup_steps": 2, "eval_every": 0},
        "data": {"train": data},
        "io": {"out_dir": out_dir, "checkpoint_every": 0, "keep_checkpoints": 1,
               "resume": "none"},
        "runtime": {"device": device, "precision": precision, "threads": args.threads,
                    **({"cuda_graphs": True} if graphs else {})},
    })
    n_params = params(m["n_layer"], m["d_model"], vocab, seq)
    fpt = flops_per_token(m["n_layer"], m["d_model"], vocab, seq)
    tokens_per_step = global_batch * seq
    r = {"model": name, **m, "seq_len": seq, "vocab_size": vocab, "params": n_params,
         "micro_batch_size": micro, "microbatches": accum, "global_batch_size": global_batch,
         "tokens_per_step": tokens_per_step, "device": device, "precision": precision,
         "steps": args.steps, "warmup_steps_skipped": args.warmup,
         "flops_per_token": fpt, "deck": deck}
    log(f"{name}: trident train ({n_params / 1e6:.0f}M parameters, {args.steps} steps of "
        f"{global_batch} x {seq} tokens, micro-batch {micro}) ...")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(args.threads or 1))
    t0 = time.perf_counter()
    try:
        p = subprocess.run([args.trident, "train", deck], capture_output=True, text=True,
                           timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired as e:
        r["error"] = f"trident train timed out after {args.timeout} s"
        r["stdout_tail"] = (e.stdout or b"")[-1000:].decode(errors="replace") \
            if isinstance(e.stdout, bytes) else (e.stdout or "")[-1000:]
        return r
    r["wall_s"] = round(time.perf_counter() - t0, 2)
    if p.returncode != 0:
        r["error"] = (f"trident train exited {p.returncode}: "
                      f"{(p.stderr or p.stdout).strip()[-600:]}")
        return r
    # trident's own memory report: the start-up prediction (under bf16 the layers' stash at 2
    # bytes) and the arena's measured high-water mark at the end
    r["memory"] = [ln.strip() for ln in p.stdout.splitlines() if ln.startswith("memory: rank 0")]
    r["losses"] = losses(os.path.join(out_dir, "metrics.h5"))
    r["graphs_line"] = next((ln.strip() for ln in (p.stdout + p.stderr).splitlines()
                             if "CUDA graphs:" in ln), None)
    times, source = step_times(os.path.join(out_dir, "metrics.h5"), p.stdout, tokens_per_step)
    r["step_time_source"] = source
    steady = times[args.warmup:]
    if not steady:
        r["error"] = f"{len(times)} step times, none after {args.warmup} warm-up steps"
        return r
    med = statistics.median(steady)
    tps = tokens_per_step / med
    achieved = tps * fpt / 1e12
    r.update({"step_times_s": [round(t, 5) for t in times], "median_step_s": round(med, 5),
              "min_step_s": round(min(steady), 5), "tokens_per_s": round(tps, 1),
              "model_tflops": round(achieved, 2),
              "peak_tflops_assumed": args.peak_tflops,
              "mfu_vs_peak": round(achieved / args.peak_tflops, 4)})
    # the cuBLAS ceiling on this model's largest product (the LM head), in the same run
    if args.cpu_smoke or graphs:
        r["cublas_note"] = "not measured (--cpu-smoke)" if args.cpu_smoke else "not measured"
    else:
        shape = (micro * seq, vocab, m["d_model"])
        tfl, why = run_cublas(args.cublas, f"{name}_lm_head", *shape, timeout=120)
        r["cublas_gemm"] = {"name": f"{name}_lm_head", "m": shape[0], "n": shape[1],
                            "k": shape[2], "trans_b": True, "mode": "bf16"}
        if tfl is None:
            r["cublas_note"] = why
        else:
            r["cublas_tflops"] = tfl
            r["mfu_vs_cublas"] = round(achieved / tfl, 4)
    return r


def with_graphs(args, name, spec, work, data):
    """The model's step without and with runtime.cuda_graphs: the first run's result with
    "cuda_graphs": both medians, whether the losses are equal bit for bit, the graphs line."""
    r = run_model(args, name, spec, work, data)
    g = run_model(args, name, spec, work, data, graphs=True)
    same = (r.get("losses") is not None and g.get("losses") is not None and
            r["losses"] == g["losses"])
    r["cuda_graphs"] = {"median_step_s": g.get("median_step_s"),
                        "eager_median_step_s": r.get("median_step_s"),
                        "losses_bitwise_equal": same if r.get("losses") is not None else None,
                        "line": g.get("graphs_line"), "error": g.get("error")}
    return r


def graphs_table(results):
    lines = ["", "runtime.cuda_graphs (each microbatch's forward and backward one CUDA graph from "
             "the second step): median step, eager vs graphs"]
    for r in results:
        c = r.get("cuda_graphs")
        if not c:
            continue
        if c.get("error") or not c.get("median_step_s") or not c.get("eager_median_step_s"):
            lines.append(f"{r['model']:<8} ERROR: {(c.get('error') or r.get('error') or '?')[:200]}")
            continue
        e, g = c["eager_median_step_s"], c["median_step_s"]
        lines.append(f"{r['model']:<8} eager {1e3 * e:9.1f} ms  graphs {1e3 * g:9.1f} ms  "
                     f"({100 * (e - g) / e:+.1f}% of the step)  losses bit for bit: "
                     f"{c['losses_bitwise_equal']}")
        if c.get("line"):
            lines.append(f"{'':<8} {c['line']}")
    return "\n".join(lines) + "\n"


def table(results, args):
    lines = []
    peak = f"{args.peak_tflops:g} TFLOP/s ({args.peak_label})"
    lines.append(f"trident train, one GPU, runtime.precision = bf16 — MFU vs peak {peak} and vs "
                 "cuBLAS bf16 on the model's LM head GEMM (same run)"
                 if not args.cpu_smoke else
                 "trident train --cpu-smoke (tiny model, device cpu): a check of the script, "
                 "the MFU column is against the GPU peak and means nothing here")
    lines.append("FLOPs/token = 6 N + 12 L T C (N: all parameters); median step time after "
                 f"{args.warmup} warm-up steps")
    lines.append("")
    hdr = (f"{'model':<8} {'params':>7} {'micro x mb':>10} {'step (ms)':>10} {'tokens/s':>10} "
           f"{'TFLOP/s':>8} {'MFU peak':>9} {'cuBLAS':>8} {'MFU cuBLAS':>11}")
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for r in results:
        if "error" in r:
            lines.append(f"{r['model']:<8} ERROR: {r['error'][:200]}")
            continue
        cub = f"{r['cublas_tflops']:8.1f}" if "cublas_tflops" in r else f"{'-':>8}"
        mfu_c = f"{100 * r['mfu_vs_cublas']:10.1f}%" if "mfu_vs_cublas" in r else f"{'-':>11}"
        lines.append(f"{r['model']:<8} {r['params'] / 1e6:6.1f}M {r['micro_batch_size']:>5} x "
                     f"{r['microbatches']:<2} {1e3 * r['median_step_s']:10.1f} "
                     f"{r['tokens_per_s']:10.0f} {r['model_tflops']:8.1f} "
                     f"{100 * r['mfu_vs_peak']:8.2f}% {cub} {mfu_c}")
        if "cublas_note" in r:
            lines.append(f"{'':<8} (cuBLAS: {r['cublas_note']})")
        for ln in r.get("memory", []):
            lines.append(f"{'':<8} {ln}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    build = os.path.join(SRC, "build")
    ap.add_argument("--trident", default=os.environ.get("TRIDENT", os.path.join(build, "trident")))
    ap.add_argument("--cublas", default=os.environ.get(
        "TRIDENT_BENCH_CUBLAS", os.path.join(build, "bench", "trident_bench_cublas")))
    ap.add_argument("--out", default=os.path.join(build, "gpu-train-bench"))
    ap.add_argument("--models", default="small,medium")
    ap.add_argument("--steps", type=int, default=18)
    ap.add_argument("--warmup", type=int, default=5, help="leading steps left out of the median")
    ap.add_argument("--timeout", type=int, default=150, help="seconds per `trident train`")
    ap.add_argument("--threads", type=int, default=0, help="runtime.threads (host side)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the GPU's peak (default: its data sheet's dense bf16, by name)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny model on device cpu: checks the script without a GPU")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="each model twice, without and with runtime.cuda_graphs: both step "
                         "times and whether the losses are equal bit for bit")
    args = ap.parse_args()
    args.peak_tflops, args.peak_label = assumed_peak(args.peak_tflops)
    if args.cpu_smoke:
        args.steps = min(args.steps, 6)
        args.warmup = min(args.warmup, 2)
        args.threads = args.threads or 2
    if not os.path.exists(args.trident):
        log(f"no trident binary at {args.trident} (--trident or $TRIDENT)")
        return 2
    args.trident = os.path.abspath(args.trident)
    os.makedirs(args.out, exist_ok=True)
    work = os.path.join(args.out, "work")
    os.makedirs(work, exist_ok=True)

    names = ["smoke"] if args.cpu_smoke else [n for n in args.models.split(",") if n]
    for n in names:
        if n != "smoke" and n not in MODELS:
            log(f"unknown model {n!r} (known: {', '.join(MODELS)})")
            return 2
    specs = {n: (SMOKE if n == "smoke" else MODELS[n]) for n in names}
    # enough tokens that a step's sequences are drawn from a large pool: 4 Mi (16 MB as int32)
    need = max(s["micro"] * s["accum"] * s.get("seq", SEQ) for s in specs.values())
    try:
        data = make_dataset(args.trident, work, max(need * 4, 1 << 22 if not args.cpu_smoke
                                                    else 1 << 16))
    except (RuntimeError, OSError) as e:
        log(str(e))
        return 1
    if args.cuda_graphs and args.cpu_smoke:
        log("--cuda-graphs needs a GPU (runtime.device = \"cuda\"), not --cpu-smoke")
        return 2
    run = with_graphs if args.cuda_graphs else run_model
    results = [run(args, n, specs[n], work, data) for n in names]
    text = table(results, args) + (graphs_table(results) if args.cuda_graphs else "")
    summary = {"bench": "gpu_train_bench", "cpu_smoke": args.cpu_smoke,
               "peak_tflops": args.peak_tflops,
               "peak_assumption": args.peak_label + " (tensor-core peak, no sparsity, not measured)",
               "flops_per_token": "6*N + 12*n_layer*seq_len*d_model, N = all parameters",
               "trident": args.trident, "results": results}
    with open(os.path.join(args.out, "gpu_train_bench.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(args.out, "gpu_train_bench.txt"), "w") as f:
        f.write(text)
    print(text, end="")
    log(f"wrote {args.out}/gpu_train_bench.json and .txt")
    return 1 if any("error" in r or (r.get("cuda_graphs") or {}).get("error")
                    for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
