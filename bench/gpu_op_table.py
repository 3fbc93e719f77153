#!/usr/bin/env python3
"""Where a training step's GPU time goes, op by op: `trident train` on runtime.device = "cuda"
with TRIDENT_OP_TIMING (src/ops/cuda/op_timer.hpp: CUDA events around every op of the
backend), run for --short and --long steps; the difference of the two tables over the
difference of the steps is one steady step (start-up, the first step's scratch growth and
cuBLAS's first calls cancel). With --baseline, the same with TRIDENT_CUDA_BASELINE=1 (the
backend's paths before issue 27) beside it: the before/after table.
Groups (the coarse ops' rows, block_forward/block_backward/lm_head, by their inner step):
attention (attention_*), products (linear_*, gemm: the head's logits are the gemm rows
with the vocabulary in their shape), classifier (xent_*), norms (layernorm_*, rmsnorm_*),
pointwise (gelu, add, scale, fill, copy, bf16 packing), embedding (embedding_*, position_*),
optimizer (adamw, sum_squares: the clip's norm).
Writes op_table.json and op_table.txt to --out; prints the text.
usage: gpu_op_table.py --trident PATH [--models small] [--short 2] [--long 6] [--baseline]
                       [--out DIR] [--smoke]   (--smoke: a tiny model, for the CPU stand-in)
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_train_bench import MODELS, SEQ, SMOKE, VOCAB, make_dataset, write_deck  # noqa: E402

GROUPS = [("attention", ("attention_",)), ("products", ("linear_", "gemm")),
          ("classifier", ("xent_",)), ("norms", ("layernorm_", "rmsnorm_")),
          ("embedding", ("embedding_", "position_")), ("optimizer", ("adamw", "sum_squares")),
          ("pointwise", ("gelu_", "add", "scale", "fill", "copy", "to_bf16", "from_bf16",
                         "colsum_", "swiglu_", "rope_"))]


# The coarse ops' rows name their inner step second ("block_forward linear_bf16 n=...",
# "lm_head classifier n=..."): grouped by that step.
COARSE = ("block_forward", "block_backward", "lm_head")
LM_HEAD_STEPS = {"logits": "gemm", "dlnf": "gemm", "dwte": "gemm", "classifier": "xent_"}


def group_of(op):
    words = op.split()
    if len(words) > 1 and words[0] in COARSE:
        op = LM_HEAD_STEPS.get(words[1], words[1]) if words[0] == "lm_head" else words[1]
    for g, prefixes in GROUPS:
        if op.startswith(prefixes):
            return g
    return "other"


def run(args, name, spec, steps, baseline, work, data):
    m = spec["model"]
    tag = f"{name}-{'baseline' if baseline else 'now'}-{steps}"
    deck = os.path.join(work, f"{tag}.toml")
    out_dir = os.path.join(work, f"run-{tag}")
    micro, accum = spec["micro"], spec["accum"]
    write_deck(deck, {
        "model": dict(vocab_size=spec.get("vocab", VOCAB), seq_len=spec.get("seq", SEQ), **m),
        "parallel": {"micro_batch_size": micro},
        "train": {"steps": steps, "global_batch_size": micro * accum, "warmup_steps": 1,
                  "eval_every": 0},
        "data": {"train": data},
        "io": {"out_dir": out_dir, "checkpoint_every": 0, "keep_checkpoints": 1,
               "resume": "none"},
        "runtime": {"device": "cuda", "precision": args.precision, "threads": 1},
    })
    table = os.path.join(work, f"{tag}.json")
    env = dict(os.environ, TRIDENT_OP_TIMING=table)
    env.pop("TRIDENT_CUDA_BASELINE", None)
    if baseline:
        env["TRIDENT_CUDA_BASELINE"] = "1"
    p = subprocess.run([args.trident, "train", deck], capture_output=True, text=True, env=env,
                       timeout=args.timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{tag}: trident train exited {p.returncode}: "
                           f"{(p.stderr or p.stdout).strip()[-500:]}")
    for line in p.stderr.splitlines():  # TRIDENT_CUDA_LT_TUNE's summary (shapes tuned, ms)
        if line.startswith("cuBLASLt tuning"):
            print(f"{tag}: {line}", file=sys.stderr)
    with open(table) as f:
        return {r["op"]: (r["calls"], r["total_ms"]) for r in json.load(f)["ops"]}


def per_step(short, long_, steps):
    """op -> (calls, ms) of one steady step."""
    out = {}
    for op in set(short) | set(long_):
        c0, t0 = short.get(op, (0, 0.0))
        c1, t1 = long_.get(op, (0, 0.0))
        out[op] = ((c1 - c0) / steps, max(t1 - t0, 0.0) / steps)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trident", required=True)
    ap.add_argument("--models", default="small")
    ap.add_argument("--short", type=int, default=2)
    ap.add_argument("--long", type=int, default=6)
    ap.add_argument("--baseline", action="store_true")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--timeout", type=int, default=150)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--out", default="op-table")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = os.path.join(a.out, "work")
    os.makedirs(work, exist_ok=True)
    specs = {"smoke": SMOKE} if a.smoke else {n: MODELS[n] for n in a.models.split(",")}
    need = max(s["micro"] * s["accum"] * s.get("seq", SEQ) for s in specs.values())
    data = make_dataset(os.path.abspath(a.trident), work, max(4 * need, 1 << 16))
    modes = [False, True] if a.baseline else [False]
    results, lines, failed = {}, [], False
    for name, spec in specs.items():
        for baseline in modes:
            mode = "baseline" if baseline else "now"
            try:
                t = per_step(run(a, name, spec, a.short, baseline, work, data),
                             run(a, name, spec, a.long, baseline, work, data), a.long - a.short)
            except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
                lines.append(f"{name} {mode}: FAILED: {e}")
                failed = True
                continue
            total = sum(ms for _, ms in t.values())
            groups = {}
            for op, (_, ms) in t.items():
                groups[group_of(op)] = groups.get(group_of(op), 0.0) + ms
            results[f"{name}/{mode}"] = {
                "step_ms": total,
                "groups": {g: {"ms": ms, "share": ms / total if total else 0.0}
                           for g, ms in sorted(groups.items(), key=lambda kv: -kv[1])},
                "ops": [{"op": op, "calls": c, "ms": ms, "share": ms / total if total else 0.0}
                        for op, (c, ms) in sorted(t.items(), key=lambda kv: -kv[1][1])]}
    for key, r in results.items():
        lines.append(f"{key}: {r['step_ms']:.1f} ms of ops per step ({a.precision}; events "
                     f"summed over the ops, gaps between them not counted)")
        lines.append("  " + ", ".join(f"{g} {v['ms']:.1f} ms ({100 * v['share']:.1f}%)"
                                      for g, v in r["groups"].items()))
        for o in r["ops"][:a.top]:
            lines.append(f"    {o['op']:<44} {o['calls']:6.1f}/step {o['ms']:9.2f} ms "
                         f"{100 * o['share']:5.1f}%")
    for name in specs:
        now, base = results.get(f"{name}/now"), results.get(f"{name}/baseline")
        if now and base:
            lines.append(f"{name}: before (TRIDENT_CUDA_BASELINE=1) -> now, ms per step by group:")
            for g in sorted(set(now["groups"]) | set(base["groups"])):
                b = base["groups"].get(g, {"ms": 0.0})["ms"]
                n = now["groups"].get(g, {"ms": 0.0})["ms"]
                lines.append(f"    {g:<12} {b:9.2f} -> {n:9.2f}")
            lines.append(f"    {'total':<12} {base['step_ms']:9.2f} -> {now['step_ms']:9.2f}")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "op_table.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(a.out, "op_table.txt"), "w") as f:
        f.write(text)
    print(text, end="")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
