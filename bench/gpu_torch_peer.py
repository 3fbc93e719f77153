#!/usr/bin/env python3
"""The same-machine peer of bench/gpu_train_bench.py: PyTorch training the same GPT-2 (small:
12 layers, d_model 768, 12 heads; medium: 24, 1024, 16; vocabulary 50304, T 1024, the LM head
tied to wte, learned positions, LayerNorm, tanh GELU) with the same step: 4 microbatches of 8
sequences (8 x 4 x 1024 tokens), bf16 autocast over fp32 master weights,
F.scaled_dot_product_attention (is_causal: PyTorch picks its flash / cuDNN kernel), fused
AdamW (lr 3e-4, betas 0.9/0.95, weight decay 0.1 on matrices), clip_grad_norm_ 1.0. Random
tokens (the ids do not change the work). Times each optimizer step with CUDA events (after a
synchronize), leaves out the first WARMUP, keeps the median; tokens/s and MFU with
gpu_train_bench.py's FLOP count (6 N + 12 L T C per token) over the assumed peak (the GPU's
data-sheet dense bf16 peak by its name, gpu_train_bench.assumed_peak, unless --peak-tflops). --compile adds a torch.compile'd run of each model.
--cpu-smoke: a tiny model on the CPU for a few steps (proves the script; its MFU means nothing).
Prints a table; writes --out (JSON).
usage: gpu_torch_peer.py [--models small,medium] [--steps 12] [--warmup 3] [--compile]
                         [--out FILE] [--cpu-smoke]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_train_bench import MODELS, SEQ, SMOKE, VOCAB, assumed_peak, flops_per_token  # noqa: E402


def build(torch, n_layer, d_model, n_head, vocab, seq, device):
    nn, F = torch.nn, torch.nn.functional

    def sdpa_reference(q, k, v, is_causal):  # PyTorch < 2.0 (the CPU smoke here) only
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        t = q.size(-2)
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        return att.masked_fill(~mask, float("-inf")).softmax(-1) @ v

    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is None:
        if device != "cpu":
            raise RuntimeError("this PyTorch has no F.scaled_dot_product_attention")
        sdpa = sdpa_reference

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.c_attn = nn.Linear(d_model, 3 * d_model)
            self.c_proj = nn.Linear(d_model, d_model)
            self.c_fc = nn.Linear(d_model, 4 * d_model)
            self.mlp_proj = nn.Linear(4 * d_model, d_model)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in (q, k, v))
            y = sdpa(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, d_model)
            self.wpe = nn.Embedding(seq, d_model)
            self.h = nn.ModuleList(Block() for _ in range(n_layer))
            self.ln_f = nn.LayerNorm(d_model)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.h:
                x = blk(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))

    return GPT().to(device)


def run_model(torch, name, spec, a):
    m = spec["model"]
    seq, vocab = spec.get("seq", SEQ), spec.get("vocab", VOCAB)
    micro, accum = spec["micro"], spec["accum"]
    device = "cpu" if a.cpu_smoke else "cuda"
    torch.manual_seed(1234)
    model = build(torch, m["n_layer"], m["d_model"], m["n_head"], vocab, seq, device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    fused = device == "cuda"
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=3e-4, betas=(0.9, 0.95),
                            eps=1e-8, **({"fused": True} if fused else {}))
    step_fn = model
    if a.compile:
        step_fn = torch.compile(model)
    g = torch.Generator(device="cpu").manual_seed(0)
    batches = [torch.randint(0, vocab, (micro, seq + 1), generator=g).to(device)
               for _ in range(accum)]
    dtype = torch.bfloat16

    def step():
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for tok in batches:
            with torch.autocast(device_type=device, dtype=dtype):
                loss = step_fn(tok[:, :-1], tok[:, 1:]) / accum
            loss.backward()
            total = total + loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return total

    times, losses = [], []
    for _ in range(a.warmup + a.steps):
        if device == "cuda":
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            loss = step()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) / 1e3)
        else:
            t0 = time.perf_counter()
            loss = step()
            times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    steady = times[a.warmup:]
    med = statistics.median(steady)
    tokens = micro * accum * seq
    fpt = flops_per_token(m["n_layer"], m["d_model"], vocab, seq)
    tflops = tokens / med * fpt / 1e12
    r = {"model": name + (" compiled" if a.compile else ""), **m, "seq_len": seq,
         "vocab_size": vocab, "tokens_per_step": tokens, "micro": micro, "accum": accum,
         "device": device, "median_step_s": round(med, 5), "min_step_s": round(min(steady), 5),
         "tokens_per_s": round(tokens / med, 1), "model_tflops": round(tflops, 2),
         "peak_tflops_assumed": a.peak_tflops, "mfu_vs_peak": round(tflops / a.peak_tflops, 4),
         "first_loss": losses[0], "last_loss": losses[-1], "fused_adamw": fused,
         "step_times_s": [round(t, 5) for t in times]}
    if device == "cuda":
        r["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        torch.cuda.reset_peak_memory_stats()
    ok = all(math.isfinite(x) for x in losses)
    if not ok:
        r["error"] = "non-finite loss"
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="small,medium")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the GPU's peak (default: its data sheet's dense bf16, by name)")
    ap.add_argument("--out", default="")
    ap.add_argument("--cpu-smoke", action="store_true")
    a = ap.parse_args()
    a.peak_tflops, peak_label = assumed_peak(a.peak_tflops)
    import torch
    if not a.cpu_smoke and not torch.cuda.is_available():
        print("gpu_torch_peer: no GPU visible to PyTorch", file=sys.stderr)
        return 1
    if not a.cpu_smoke:
        torch.backends.cuda.matmul.allow_tf32 = True
    specs = {"smoke": SMOKE} if a.cpu_smoke else {k: MODELS[k] for k in a.models.split(",")}
    results = []
    for name, spec in specs.items():
        try:
            results.append(run_model(torch, name, spec, a))
        except Exception as e:  # noqa: BLE001  (one model's failure leaves the other's numbers)
            results.append({"model": name, "error": f"{type(e).__name__}: {str(e)[:400]}"})
        if not a.cpu_smoke:
            torch.cuda.empty_cache()
    peak = f"{a.peak_tflops:g} TFLOP/s ({peak_label})"
    print(f"PyTorch {torch.__version__} peer, bf16 autocast, SDPA, fused AdamW; MFU vs {peak}"
          + ("  [CPU SMOKE: the MFU means nothing]" if a.cpu_smoke else ""))
    print(f"  {'model':<16} {'ms/step':>9} {'tok/s':>10} {'TFLOP/s':>8} {'MFU':>7}")
    for r in results:
        if "error" in r:
            print(f"  {r['model']:<16} FAILED: {r['error']}")
        else:
            print(f"  {r['model']:<16} {1e3 * r['median_step_s']:9.1f} {r['tokens_per_s']:10.0f} "
                  f"{r['model_tflops']:8.1f} {100 * r['mfu_vs_peak']:6.2f}%")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"torch": torch.__version__, "results": results}, f, indent=1)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
