"""PyTorch's peer of bench/attention_bench.cpp: torch.nn.functional.scaled_dot_product_attention
(is_causal) forward + backward, float32, on q, k, v of shape [B, NH, T, hs] cut from one fused
qkv[B, T, 3C] as trident's model does. One JSON object per line: {"t", "path": "torch", "ms",
"fwd_ms"} (medians). Thread variables (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, OMP_WAIT_POLICY)
must be in the environment before torch loads: bench/attention_bench.py sets them.
"""

import argparse
import json
import statistics
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--b", type=int, default=1)
    ap.add_argument("--c", type=int, default=768)
    ap.add_argument("--nh", type=int, default=12)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("t", type=int, nargs="*", default=[512, 1024, 2048, 4096])
    a = ap.parse_args()

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    hs = a.c // a.nh
    for t in a.t:
        qkv = torch.randn(a.b, t, 3 * a.c, requires_grad=True)
        dout = torch.randn(a.b, a.nh, t, hs)
        total, fwd = [], []
        for r in range(a.reps + 1):
            q, k, v = qkv.split(a.c, dim=2)
            q, k, v = (x.view(a.b, t, a.nh, hs).transpose(1, 2) for x in (q, k, v))
            t0 = time.perf_counter()
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            t1 = time.perf_counter()
            y.backward(dout)
            t2 = time.perf_counter()
            qkv.grad = None
            if r > 0:
                total.append((t2 - t0) * 1e3)
                fwd.append((t1 - t0) * 1e3)
        print(json.dumps({"t": t, "path": "torch", "ms": round(statistics.median(total), 3),
                          "fwd_ms": round(statistics.median(fwd), 3)}), flush=True)


if __name__ == "__main__":
    main()
