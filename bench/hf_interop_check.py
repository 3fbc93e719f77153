#!/usr/bin/env python3
"""trident's exported Hugging Face folders against Hugging Face `transformers` itself.

Not a test and not run by CTest: `transformers` is not installed here. It is meant for a
machine that has it (the GPU machine's image has transformers and safetensors in its Python);
everything runs on the CPU, in seconds, offline (local files only, HF_HUB_OFFLINE=1).

Two steps, so that the machine with transformers needs neither trident nor h5py:

  1. here (trident built, /usr/bin/python3 with torch, h5py, numpy):
       /usr/bin/python3 bench/hf_interop_check.py prepare --trident build/trident --out DIR
     For GPT-2, Llama GQA with an untied head and Llama MQA with a tied head: `trident init`,
     weights perturbed (norms and biases away from 1 and 0), `trident convert` to a float32
     and a bfloat16 folder, each converted back and run through `trident grad` on a random
     batch; DIR/<case>/reference.npz holds the batch, trident's loss and its gradients under
     Hugging Face's names (the "dump" the check compares with).
  2. there (python with torch, numpy, transformers):
       python3 bench/hf_interop_check.py check --dir DIR
     Loads each folder with AutoModelForCausalLM.from_pretrained(local_files_only=True,
     torch_dtype=float32, eager attention), computes the mean cross-entropy of the batch's
     targets (the same loss `trident grad` reports; no label shifting) and its gradients, and
     compares: loss relative difference <= 1e-5, every gradient max|d| / max|ref| <= 1e-4
     (grad_oracle's tolerances; float32 on both sides). The bf16 folders load as float32 (their
     values are exactly the bf16 numbers trident computed with). Prints one row per folder and
     exits 1 on any failure, 2 when transformers is missing.
     `check --stand-in` runs the same comparison with test/oracle/hf_convert_oracle.py's
     Hugging Face-convention model instead of transformers (checks this script's plumbing
     where transformers is absent).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CASES = {
    "gpt2": dict(vocab_size=67, seq_len=16, n_layer=2, n_head=2, d_model=16),
    "llama_gqa_untied": dict(vocab_size=67, seq_len=16, n_layer=2, n_head=4, d_model=32,
                             arch="llama", n_kv_head=2, ffn_hidden=48, rope_theta=500000.0,
                             norm_eps=1e-6, tie_embeddings=False),
    "llama_mqa_tied": dict(vocab_size=61, seq_len=12, n_layer=2, n_head=4, d_model=16,
                           arch="llama", n_kv_head=1, ffn_hidden=40, tie_embeddings=True),
}
DTYPES = ("f32", "bf16")
BATCH = 3
LOSS_TOL, GRAD_TOL = 1e-5, 1e-4


def hf_name(name, arch):
    if arch == "llama":
        return name
    return "transformer." + (name + ".weight" if name in ("wte", "wpe") else name)


def run(cmd, cwd):
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit(f"hf_interop_check: {' '.join(map(str, cmd))} failed ({p.returncode}):\n{p.stdout}")


def prepare(args):
    import h5py
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import trident_torch as tt
    exe = os.path.abspath(args.trident)
    for cname, keys in CASES.items():
        work = os.path.join(os.path.abspath(args.out), cname)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        deck = os.path.join(work, "deck.toml")
        tt.write_deck(deck, {"model": keys, "parallel": {"micro_batch_size": BATCH},
                             "train": {"global_batch_size": BATCH},
                             "io": {"out_dir": os.path.join(work, "run")},
                             "runtime": {"threads": 1}})
        weights = os.path.join(work, "weights.h5")
        run([exe, "init", deck, "--out", weights], work)
        rng = np.random.default_rng(7)
        with h5py.File(weights, "r+") as f:
            for n in f["model"]:
                ds = f["model"][n]
                norm = ds.ndim == 1 and ("ln" in n or "norm" in n) and n.endswith("weight")
                ds[...] = ((1.0 if norm else 0.0) + rng.normal(0, 0.2, ds.shape)).astype(np.float32)
                if "checksum" in ds.attrs:
                    del ds.attrs["checksum"]
        V, T = keys["vocab_size"], keys["seq_len"]
        inputs = rng.integers(0, V, size=(BATCH, T))
        targets = rng.integers(0, V, size=(BATCH, T))
        batch = os.path.join(work, "batch.h5")
        tt.write_batch(batch, inputs, targets)
        ref = {"inputs": inputs, "targets": targets}
        for dt in DTYPES:
            folder = os.path.join(work, f"hf-{dt}")
            run([exe, "convert", "--from", weights, "--to", folder, "--dtype", dt], work)
            back = folder + ".h5"  # the weights the folder holds, as trident reads them
            run([exe, "convert", "--from", folder, "--to", back], work)
            gpath = os.path.join(work, f"grad-{dt}.h5")
            run([exe, "grad", deck, "--weights", back, "--batch", batch, "--out", gpath], work)
            with h5py.File(gpath, "r") as f:
                ref[f"loss/{dt}"] = np.float64(f.attrs["loss"])
                for n in f["grad"]:
                    ref[f"grad/{dt}/{hf_name(n, keys.get('arch', 'gpt2'))}"] = f["grad"][n][...]
        np.savez(os.path.join(work, "reference.npz"), **ref)
        print(f"prepared {work}")


def transformers_loss_and_grads(folder, inputs, targets):
    import torch
    from transformers import AutoModelForCausalLM
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                     torch_dtype=torch.float32,
                                                     attn_implementation="eager")
    except TypeError:  # transformers < 4.36 has no attn_implementation (eager is its only one)
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                     torch_dtype=torch.float32)
    model.eval()  # no dropout (the exported configs say 0 anyway)
    logits = model(input_ids=torch.from_numpy(inputs).long(), use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                             torch.from_numpy(targets).long().reshape(-1))
    loss.backward()
    # Tied weights appear once (named_parameters skips the duplicate lm_head.weight).
    grads = {n: p.grad.detach().double().numpy() for n, p in model.named_parameters()
             if p.grad is not None}
    return float(loss), grads


def stand_in_loss_and_grads(folder, inputs, targets):
    sys.path.insert(0, os.path.join(ROOT, "test", "oracle"))
    import hf_convert_oracle as hco
    _, loss, grads = hco.hf_loss_and_grads(folder, inputs, targets)
    return loss, grads


def check(args):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import numpy as np
    if args.stand_in:
        impl, name = stand_in_loss_and_grads, "stand-in (hf_convert_oracle)"
    else:
        try:
            import torch  # noqa: F401
            import transformers
        except ImportError as e:
            print(f"hf_interop_check: {e}: needs torch and transformers (or --stand-in)")
            return 2
        impl, name = transformers_loss_and_grads, f"transformers {transformers.__version__}"
    print(f"reference: {name}")
    print(f"{'folder':<28} {'loss trident':>14} {'loss HF':>14} {'rel':>9} {'worst grad':>11}  result")
    failures = []
    cases = sorted(d for d in os.listdir(args.dir)
                   if os.path.exists(os.path.join(args.dir, d, "reference.npz")))
    if not cases:
        print(f"hf_interop_check: no <case>/reference.npz under {args.dir} (run prepare first)")
        return 1
    for cname in cases:
        ref = np.load(os.path.join(args.dir, cname, "reference.npz"))
        for dt in DTYPES:
            folder = os.path.join(args.dir, cname, f"hf-{dt}")
            with open(os.path.join(folder, "config.json")) as f:
                json.load(f)  # readable
            try:
                loss, grads = impl(folder, ref["inputs"], ref["targets"])
            except Exception as e:  # a load failure is a finding: report it, go on
                failures.append(f"{cname} {dt}: {type(e).__name__}: {e}")
                print(f"{cname + ' ' + dt:<28} {'':>14} {'':>14} {'':>9} {'':>11}  ERROR {e}")
                continue
            want_loss = float(ref[f"loss/{dt}"])
            rel = abs(loss - want_loss) / abs(want_loss)
            worst, problems = 0.0, []
            prefix = f"grad/{dt}/"
            names = {k[len(prefix):] for k in ref.files if k.startswith(prefix)}
            if set(grads) != names:
                problems.append(f"parameter names differ: {sorted(set(grads) ^ names)}")
            for n in sorted(names & set(grads)):
                r = ref[prefix + n].astype(np.float64)
                g = grads[n]
                if g.shape != r.shape:
                    problems.append(f"{n}: shape {g.shape} vs {r.shape}")
                    continue
                scale = float(np.max(np.abs(r))) or 1.0
                worst = max(worst, float(np.max(np.abs(g - r))) / scale)
            ok = rel <= LOSS_TOL and worst <= GRAD_TOL and not problems
            print(f"{cname + ' ' + dt:<28} {want_loss:14.9f} {loss:14.9f} {rel:9.2e} {worst:11.2e}"
                  f"  {'ok' if ok else 'FAIL'}")
            if not ok:
                failures.append(f"{cname} {dt}: loss rel {rel:.2e} (tol {LOSS_TOL}), worst gradient "
                                f"{worst:.2e} (tol {GRAD_TOL}) {'; '.join(problems)}")
    for f in failures:
        print("  " + f)
    print("hf_interop_check: " + ("FAIL" if failures else "PASS"))
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--trident", default=os.path.join(ROOT, "build", "trident"))
    p.add_argument("--out", required=True)
    c = sub.add_parser("check")
    c.add_argument("--dir", required=True)
    c.add_argument("--stand-in", action="store_true")
    args = ap.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "2")
    if args.mode == "prepare":
        prepare(args)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
