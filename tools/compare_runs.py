#!/usr/bin/python3
"""Bitwise loss curves of two trident builds: the same short decks (a tiny GPT-2 and Llama,
a few steps) in several layouts under each binary, then metrics.h5's `loss` and `grad_norm`
compared bit for bit per layout. For refactorings that must not change a single float.

  tools/compare_runs.py --base /path/to/old/trident --new build/trident [--out DIR]
                        [--only NAME ...] [--list]

Prints one line per layout (`same` or the first step that differs) and exits 1 on any
difference or failed run. Needs mpirun (runs with --oversubscribe) and h5py/numpy.
"""
import argparse
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

V, T = 64, 16

GPT2 = f"""[model]
vocab_size = {V}
seq_len = {T}
n_layer = 4
n_head = 4
d_model = 32
"""
LLAMA = GPT2 + """arch = "llama"
n_kv_head = 1
ffn_hidden = 64
"""
REST = """[parallel]
micro_batch_size = 2
[train]
steps = 4
global_batch_size = 8
warmup_steps = 1
lr = 3e-3
grad_clip = 0.5
[data]
train = "tokens.h5"
[io]
out_dir = "run"
resume = "none"
[runtime]
threads = 1
watchdog_s = 120
"""

# name: (deck, ranks, --set overrides)
LAYOUTS = {
    "gpt2-serial": (GPT2, 1, []),
    "gpt2-serial-recompute-full": (GPT2, 1, ["parallel.recompute=full"]),
    "gpt2-tp2-sp": (GPT2, 2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    "gpt2-tp2-selective": (GPT2, 2, ["parallel.tp=2", "parallel.recompute=selective"]),
    "gpt2-pp2-1f1b": (GPT2, 2, ["parallel.pp=2", "parallel.schedule=1f1b"]),
    "gpt2-pp2-zb-h1": (GPT2, 2, ["parallel.pp=2", "parallel.schedule=zb-h1"]),
    "gpt2-pp2-vpp2-interleaved": (GPT2, 2, ["parallel.pp=2", "parallel.vpp=2",
                                            "parallel.schedule=interleaved-1f1b"]),
    "gpt2-dp2": (GPT2, 2, ["parallel.dp=2"]),
    "gpt2-dp2-zero1": (GPT2, 2, ["parallel.dp=2", "parallel.zero_stage=1"]),
    "gpt2-pp2-pipedream-2bw": (GPT2, 2, ["parallel.pp=2", "parallel.schedule=pipedream-2bw"]),
    "gpt2-2d-tp4": (GPT2, 4, ["parallel.tp=4", "parallel.tp_mode=2d"]),
    "gpt2-tp2-pp2": (GPT2, 4, ["parallel.tp=2", "parallel.pp=2"]),
    "gpt2-pp2-dp2-zb-h1": (GPT2, 4, ["parallel.pp=2", "parallel.dp=2", "parallel.schedule=zb-h1"]),
    "llama-serial": (LLAMA, 1, []),
    "llama-tp2": (LLAMA, 2, ["parallel.tp=2"]),
    "llama-tp2-sp": (LLAMA, 2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    "llama-pp2-zb-h1": (LLAMA, 2, ["parallel.pp=2", "parallel.schedule=zb-h1"]),
    "llama-tp2-dp2-zero1": (LLAMA, 4, ["parallel.tp=2", "parallel.dp=2", "parallel.zero_stage=1"]),
    "llama-tp2-pp2": (LLAMA, 4, ["parallel.tp=2", "parallel.pp=2"]),
    "llama-pp2-1f1b": (LLAMA, 2, ["parallel.pp=2", "parallel.schedule=1f1b"]),
    "gpt2-pp2-zb-v": (GPT2, 2, ["parallel.pp=2", "parallel.vpp=2", "parallel.schedule=zb-v"]),
    "gpt2-pp2-zb-v-selective": (GPT2, 2, ["parallel.pp=2", "parallel.vpp=2",
                                          "parallel.schedule=zb-v",
                                          "parallel.recompute=selective"]),
    "gpt2-pp2-zb-h1-full": (GPT2, 2, ["parallel.pp=2", "parallel.schedule=zb-h1",
                                      "parallel.recompute=full"]),
    "gpt2-tp2-pp2-sp-zb-v": (GPT2, 4, ["parallel.tp=2", "parallel.sequence_parallel=true",
                                       "parallel.pp=2", "parallel.vpp=2",
                                       "parallel.schedule=zb-v"]),
    "llama-pp2-zb-v": (LLAMA, 2, ["parallel.pp=2", "parallel.vpp=2", "parallel.schedule=zb-v"]),
    "gpt2-cp2-ring": (GPT2, 2, ["parallel.cp=2"]),
    "gpt2-cp2-ulysses": (GPT2, 2, ["parallel.cp=2", "parallel.cp_mode=ulysses"]),
    "llama-cp2-ring": (LLAMA, 2, ["parallel.cp=2"]),
    # Context parallelism through the coarse block ops (the ring / Ulysses as their attention
    # hook; Llama's RoPE at each run of positions) with TP, recompute and the split backward.
    "gpt2-cp2-tp2": (GPT2, 4, ["parallel.cp=2", "parallel.tp=2"]),
    "gpt2-cp2-selective": (GPT2, 2, ["parallel.cp=2", "parallel.recompute=selective"]),
    "gpt2-cp2-pp2-zb-v": (GPT2, 4, ["parallel.cp=2", "parallel.pp=2", "parallel.vpp=2",
                                    "parallel.schedule=zb-v"]),
    "gpt2-cp2-ulysses-full": (GPT2, 2, ["parallel.cp=2", "parallel.cp_mode=ulysses",
                                        "parallel.recompute=full"]),
    "llama-cp2-ulysses-kv2": (LLAMA, 2, ["parallel.cp=2", "parallel.cp_mode=ulysses",
                                         "model.n_kv_head=2"]),
    "llama-cp2-tp2-selective": (LLAMA, 4, ["parallel.cp=2", "parallel.tp=2",
                                           "parallel.recompute=selective"]),
    "llama-cp2-pp2-zb-h1": (LLAMA, 4, ["parallel.cp=2", "parallel.pp=2",
                                       "parallel.schedule=zb-h1"]),
    # Schedules whose head chunk's output gradient waits for a later B (a row of its own)
    # and uneven splits (chunks of different sizes in one activation pool).
    "gpt2-pp2-gpipe": (GPT2, 2, ["parallel.pp=2", "parallel.schedule=gpipe"]),
    "gpt2-pp2-gpipe-selective": (GPT2, 2, ["parallel.pp=2", "parallel.schedule=gpipe",
                                           "parallel.recompute=selective"]),
    "llama-pp2-pipedream": (LLAMA, 2, ["parallel.pp=2", "parallel.schedule=pipedream",
                                       "model.tie_embeddings=false", "train.grad_clip=0"]),
    "gpt2-pp2-vpp2-interleaved-full": (GPT2, 2, ["parallel.pp=2", "parallel.vpp=2",
                                                 "parallel.schedule=interleaved-1f1b",
                                                 "parallel.recompute=full"]),
    "gpt2-pp2-vpp2-looped-bfs": (GPT2, 2, ["parallel.pp=2", "parallel.vpp=2",
                                           "parallel.schedule=looped-bfs"]),
    "llama-pp2-vpp2-interleaved": (LLAMA, 2, ["parallel.pp=2", "parallel.vpp=2",
                                              "parallel.schedule=interleaved-1f1b"]),
    "gpt2-pp3-uneven-1f1b": (GPT2, 3, ["parallel.pp=3", "parallel.schedule=1f1b"]),
    "gpt2-pp3-uneven-zb-h1": (GPT2, 3, ["parallel.pp=3", "parallel.schedule=zb-h1",
                                        "parallel.pipeline_layers=[1, 1, 2]"]),
    "gpt2-pp4-zb-v": (GPT2, 4, ["model.n_layer=8", "parallel.pp=4", "parallel.vpp=2",
                                "parallel.schedule=zb-v"]),
    "gpt2-pp2-zb-v-uneven-full": (GPT2, 2, ["model.n_layer=5", "parallel.pp=2", "parallel.vpp=2",
                                            "parallel.schedule=zb-v", "parallel.recompute=full"]),
    # The split backward's B and W through the coarse block ops (Llama, full recompute).
    "llama-pp2-zb-h1-full": (LLAMA, 2, ["parallel.pp=2", "parallel.schedule=zb-h1",
                                        "parallel.recompute=full"]),
    "llama-pp2-zb-v-full": (LLAMA, 2, ["parallel.pp=2", "parallel.vpp=2", "parallel.schedule=zb-v",
                                       "parallel.recompute=full"]),
    # GPT-2's coarse block ops under TP (and SP): the default composition's collectives.
    "gpt2-tp2": (GPT2, 2, ["parallel.tp=2"]),
    "gpt2-tp2-recompute-full": (GPT2, 2, ["parallel.tp=2", "parallel.recompute=full"]),
    "gpt2-tp2-sp-recompute-full": (GPT2, 2, ["parallel.tp=2", "parallel.sequence_parallel=true",
                                             "parallel.recompute=full"]),
    "gpt2-tp2-dp2-zero1": (GPT2, 4, ["parallel.tp=2", "parallel.dp=2", "parallel.zero_stage=1"]),
    "gpt2-tp2-pp2-zb-h1": (GPT2, 4, ["parallel.tp=2", "parallel.pp=2", "parallel.schedule=zb-h1"]),
    # Llama's the same way: kv heads split over TP (n_kv_head 2) and replicated (the deck's 1).
    "llama-tp2-kv2": (LLAMA, 2, ["parallel.tp=2", "model.n_kv_head=2"]),
    "llama-tp2-sp-kv2": (LLAMA, 2, ["parallel.tp=2", "parallel.sequence_parallel=true",
                                    "model.n_kv_head=2"]),
    "llama-tp2-pp2-zb-v-full": (LLAMA, 4, ["parallel.tp=2", "parallel.pp=2", "parallel.vpp=2",
                                           "parallel.schedule=zb-v", "parallel.recompute=full"]),
    "llama-tp2-recompute-full": (LLAMA, 2, ["parallel.tp=2", "parallel.recompute=full"]),
    # The LM head's vocabulary split unevenly (Ops::lm_head at TP 3: 22 + 22 + 20 columns).
    "gpt2-tp3-vocab-uneven": (GPT2, 3, ["parallel.tp=3", "model.d_model=48", "model.n_head=6"]),
    "llama-tp3-vocab-uneven": (LLAMA, 3, ["parallel.tp=3", "model.d_model=48", "model.n_head=6",
                                          "model.n_kv_head=3", "model.ffn_hidden=96"]),
    # Llama's selective recompute through the coarse ops (Ops::llama_block_recompute).
    "llama-serial-selective": (LLAMA, 1, ["parallel.recompute=selective"]),
    "llama-tp2-selective": (LLAMA, 2, ["parallel.tp=2", "parallel.recompute=selective"]),
    "llama-tp2-sp-kv2-selective": (LLAMA, 2, ["parallel.tp=2", "parallel.sequence_parallel=true",
                                              "model.n_kv_head=2",
                                              "parallel.recompute=selective"]),
    "llama-pp2-zb-v-selective": (LLAMA, 2, ["parallel.pp=2", "parallel.vpp=2",
                                            "parallel.schedule=zb-v",
                                            "parallel.recompute=selective"]),
}


def write_tokens(path):
    rng = np.random.default_rng(7)
    tokens = (np.arange(20000) * 7 + rng.integers(0, 3, 20000)) % V
    with h5py.File(path, "w") as f:
        f["tokens"] = tokens.astype(np.int32)
        f.attrs["vocab_size"] = V
        f.attrs["tokenizer"] = "byte"


def run(binary, work, deck, ranks, sets):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with open(os.path.join(work, "deck.toml"), "w") as f:
        f.write(deck + REST)
    write_tokens(os.path.join(work, "tokens.h5"))
    cmd = [binary, "train", "deck.toml"]
    for kv in sets:
        cmd += ["--set", kv]
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", *cmd]
    p = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return None, (p.stdout + p.stderr)[-1500:]
    with h5py.File(os.path.join(work, "run", "metrics.h5"), "r") as f:
        return {c: f[c][:] for c in ("loss", "grad_norm")}, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--out", default="/tmp/compare_runs")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        print("\n".join(LAYOUTS))
        return 0
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    bad = 0
    for name, (deck, ranks, sets) in LAYOUTS.items():
        if a.only and name not in a.only:
            continue
        got = {}
        for which, binary in (("base", a.base), ("new", a.new)):
            got[which], err = run(os.path.abspath(binary), os.path.join(a.out, name, which), deck,
                                  ranks, sets)
            if err is not None:
                print(f"FAIL {name}: the {which} binary failed:\n{err}")
                bad += 1
                break
        else:
            diffs = []
            for c in ("loss", "grad_norm"):
                x, y = got["base"][c], got["new"][c]
                same = x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
                if not same:
                    step = next((i for i in range(min(len(x), len(y))) if x[i].tobytes() != y[i].tobytes()),
                                min(len(x), len(y)))
                    rel = float(np.max(np.abs(x.astype(np.float64) - y) / np.abs(x)))
                    diffs.append(f"{c} differs from step {step} (max relative {rel:.1e})")
            n = len(got["base"]["loss"])
            print(f"{'same' if not diffs else 'DIFF'} {name} ({ranks} ranks, {n} steps, "
                  f"loss {got['base']['loss'][-1]:.6f}){': ' + '; '.join(diffs) if diffs else ''}")
            bad += bool(diffs)
    print("all bitwise identical" if not bad else f"{bad} layout(s) differ or failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
