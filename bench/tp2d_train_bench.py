#!/usr/bin/env python3
"""2D tensor parallelism from real training steps (issue 20): `trident train` at tp = 4 on 4
ranks (one thread each), parallel.tp_mode "1d" against "2d" (2 x 2 grid), GPT-2 with 2 layers,
4 x 128 tokens per step (one microbatch), d_model 512 and 1024. Per layout: the median step
time after warm-up (metrics.h5's step_time_s) and rank 0's TP bytes per step (comm/tp/bytes:
in 2D the grid's row and column communicators); 1D's beside the closed form of
parallel_bench.tp_bytes_per_step. One JSON line per layout.
usage: tp2d_train_bench.py --build BUILD [--json OUT] [--steps N]"""
import argparse
import json
import os
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
import parallel_bench as pb  # noqa: E402
import trident_torch as tt  # noqa: E402

V, T, L, BATCH = 1024, 128, 2, 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--json", default=None)
    ap.add_argument("--steps", type=int, default=pb.WARMUP + 4)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    work = os.path.join(build, "bench-work", "tp2d-train")
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "tokens.h5")
    rng = np.random.default_rng(20)
    with h5py.File(data, "w") as f:  # random ids: the step time does not depend on them
        f["tokens"] = rng.integers(0, V, 200000).astype(np.int32)
        f.attrs["vocab_size"] = V
        f.attrs["tokenizer"] = "sentencepiece"
        f["tokenizer/model"] = np.zeros(1, np.uint8)  # never decoded by training
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    rows = []
    for C in (512, 1024):
        model = {"vocab_size": V, "seq_len": T, "n_layer": L, "n_head": C // 64, "d_model": C}
        for mode in ("1d", "2d"):
            r = pb.run_layout(os.path.join(build, "trident"), tt.write_deck, work, env, model,
                              data, f"tp4-{mode}-d{C}", (4, 1, 1), BATCH, BATCH, a.steps,
                              {"tp_mode": mode})
            if mode == "2d":
                r.pop("tp_bytes_formula", None)  # 1D's closed form
            r["d_model"], r["tp_mode"] = C, mode
            rows.append(r)
            print(json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
