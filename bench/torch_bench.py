"""The PyTorch peer of trident's training step: the same GPT-2 or Llama (tools/trident_torch.py,
--arch), the same
shapes and batch size, float32, AdamW with trident's two parameter groups, clip_grad_norm_ as
trident clips, on `--threads` threads. Prints one JSON object: the median step time
(zero_grad + forward + backward + clip + AdamW step) over --steps steps after --warmup.

Thread variables must be set before torch loads, so run.sh sets them in the environment
(OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, OMP_WAIT_POLICY); this script only calls
torch.set_num_threads and reports what it ran with.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    ap.add_argument("--n-kv-head", type=int, default=0)   # llama: 0 = n_head
    ap.add_argument("--ffn-hidden", type=int, default=0)  # llama: 0 = Llama's rule
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()

    import numpy as np
    import torch
    import trident_torch as tt

    torch.set_num_threads(a.threads)
    cfg = tt.Config(a.vocab_size, a.seq_len, a.n_layer, a.n_head, a.d_model, arch=a.arch,
                    n_kv_head=a.n_kv_head, ffn_hidden=a.ffn_hidden)
    model = tt.init_model(cfg, seed=1234, dtype=torch.float32)
    opt = tt.make_adamw(model, lr=3e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    rng = np.random.default_rng(0)
    tokens = torch.from_numpy(rng.integers(0, a.vocab_size, size=(a.batch, a.seq_len + 1)))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    times, losses = [], []
    for _ in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        loss, _ = tt.train_step(model, opt, inputs, targets, lr=3e-4, grad_clip=1.0)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    steady = times[a.warmup:]
    print(json.dumps({
        "torch_version": torch.__version__,
        "arch": a.arch,
        "threads": torch.get_num_threads(),
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                 "OMP_WAIT_POLICY")},
        "median_step_s": statistics.median(steady),
        "min_step_s": min(steady),
        "steps": a.steps,
        "warmup": a.warmup,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }))


if __name__ == "__main__":
    main()
