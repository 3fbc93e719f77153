"""PyTorch's peer of bench/cuda_attention_bench.cpp on the GPU: scaled_dot_product_attention
(is_causal, bf16, whichever fused kernel PyTorch picks) forward and backward at the same shape,
timed with CUDA events (median). One JSON line in the bench's format, "path": "torch_sdpa";
FLOPs counted as the bench counts them (forward 4 B NH T^2 HS / 2, backward 2.5 times that).
usage: gpu_attention_torch.py [--reps 10] [--b 8] [--t 1024] [--nh 12] [--hs 64]
"""

import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def timed(reps, fn):
    fn()  # warm-up
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        fn()
        t1.record()
        t1.synchronize()
        ms.append(t0.elapsed_time(t1))
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser()
    for name, default in (("reps", 10), ("b", 8), ("t", 1024), ("nh", 12), ("hs", 64)):
        ap.add_argument(f"--{name}", type=int, default=default)
    a = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(7)
    shape = (a.b, a.nh, a.t, a.hs)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
    fwd = timed(a.reps, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    bwd = timed(a.reps, lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    flops = 4.0 * a.b * a.nh * a.t * a.t * a.hs / 2
    print(json.dumps({"path": "torch_sdpa", "used": True,
                      "b": a.b, "t": a.t, "nh": a.nh, "hs": a.hs,
                      "fwd_ms": round(fwd, 4), "bwd_ms": round(bwd, 4),
                      "fwd_tflops": round(flops / fwd * 1e-9, 2),
                      "bwd_tflops": round(2.5 * flops / bwd * 1e-9, 2),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
