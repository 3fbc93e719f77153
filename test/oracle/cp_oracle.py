"""oracle.cp — `trident grad` under context parallelism (parallel.cp) against PyTorch.

grad_oracle's check (loss within 1e-5, every gradient within 1e-4 of the largest, float64
reference from the same float32 weights) on layouts that split every sequence over a CP ring:
cp 2 and cp 4 alone, cp 2 x tp 2 with sequence parallelism, cp 2 x pp 2 x dp 2 with ZeRO-1 on
8 ranks, zb-v's split backward at pp 2, Llama with grouped-query heads, and odd shapes (seq_len divisible by 2 * cp but not by
64, 3 heads); and the same kinds of layouts with parallel.cp_mode = "ulysses" (all-to-all over
heads). The reference never splits anything: the whole sequences through one model.
Run one config with `cp_oracle.py NAME`. TRIDENT_TEST_DEVICE (e.g. "cuda") runs trident on that
device, as in grad_oracle.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grad_oracle as go  # noqa: E402

go.NAME = "oracle.cp"

# name: (model, batch, micro_batch_size, parallel)
CONFIGS = {
    # Two microbatches of one sequence; learned positions at both chunks of each rank.
    "cp2": (dict(vocab_size=64, seq_len=16, n_layer=2, n_head=2, d_model=32), 2, 1, {"cp": 2}),
    # Odd shapes: T = 24 (3 rows a chunk), 3 heads, full recomputation (the ring again).
    "cp4_h3_recompute": (dict(vocab_size=67, seq_len=24, n_layer=2, n_head=3, d_model=24), 2, 2,
                         {"cp": 4, "recompute": "full"}),
    # With TP 2 and sequence parallelism: 20 rows of each 2 x 20-token microbatch per rank.
    "cp2_tp2_sp": (dict(vocab_size=64, seq_len=20, n_layer=2, n_head=4, d_model=32), 2, 2,
                   {"cp": 2, "tp": 2, "sequence_parallel": True}),
    # 8 ranks: the pipeline carries the local rows; ZeRO-1 shards over DP x CP = 4 ranks.
    "cp2_pp2_dp2_zero1": (dict(vocab_size=64, seq_len=12, n_layer=2, n_head=2, d_model=16), 4, 1,
                          {"cp": 2, "pp": 2, "dp": 2, "zero_stage": 1, "schedule": "1f1b"}),
    # The split backward (B then W) in a V: zb-v at pp 2 x vpp 2, Llama with a tied head.
    "llama_cp2_zbv_pp2": (dict(vocab_size=50, seq_len=12, n_layer=4, n_head=2, d_model=16,
                               arch="llama", n_kv_head=1, ffn_hidden=24, tie_embeddings=True),
                          4, 1, {"cp": 2, "pp": 2, "vpp": 2, "schedule": "zb-v"}),
    # Llama, grouped-query heads (2 kv of 4): RoPE at each chunk's own positions; selective
    # recomputation.
    "llama_gqa_cp2": (dict(vocab_size=64, seq_len=20, n_layer=2, n_head=4, d_model=32,
                           arch="llama", n_kv_head=2, ffn_hidden=40), 2, 2,
                      {"cp": 2, "recompute": "selective"}),
    # Ulysses (parallel.cp_mode = "ulysses": all-to-all over heads). Two sequences a
    # microbatch: the whole-sequence rows of each put back in order.
    "ulysses_cp2": (dict(vocab_size=64, seq_len=16, n_layer=2, n_head=2, d_model=32), 4, 2,
                    {"cp": 2, "cp_mode": "ulysses"}),
    # Under TP 2 with SP: each rank's 2 heads (of 4) split over cp 2.
    "ulysses_cp2_tp2_sp": (dict(vocab_size=64, seq_len=20, n_layer=2, n_head=4, d_model=32), 2,
                           2, {"cp": 2, "tp": 2, "sequence_parallel": True,
                               "cp_mode": "ulysses"}),
    # Llama GQA (2 kv heads of 4): one kv head per CP rank for its two query heads.
    "ulysses_llama_gqa_cp2": (dict(vocab_size=64, seq_len=20, n_layer=2, n_head=4, d_model=32,
                                   arch="llama", n_kv_head=2, ffn_hidden=40), 2, 2,
                              {"cp": 2, "recompute": "selective", "cp_mode": "ulysses"}),
    # cp 4: one head per rank, T = 24 (3 rows a chunk), full recomputation.
    "ulysses_cp4_recompute": (dict(vocab_size=67, seq_len=24, n_layer=2, n_head=4, d_model=32),
                              2, 2, {"cp": 4, "recompute": "full", "cp_mode": "ulysses"}),
    # 8 ranks: the pipeline and ZeRO-1 over DP x CP, with Ulysses.
    "ulysses_cp2_pp2_dp2_zero1": (dict(vocab_size=64, seq_len=12, n_layer=2, n_head=2,
                                       d_model=16), 4, 1,
                                  {"cp": 2, "pp": 2, "dp": 2, "zero_stage": 1,
                                   "schedule": "1f1b", "cp_mode": "ulysses"}),
}


def main():
    if go.DEVICE == "cuda" and not go.gpu_visible():
        print(f"{go.NAME}: no GPU visible: skipped")
        return 77
    names = sys.argv[1:] or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        print(f"{go.NAME}: unknown config(s) {unknown}; choose from {list(CONFIGS)}")
        return 2
    fails = go.oc.Failures(go.NAME)
    for cname in names:
        model_keys, batch, mbs, parallel = CONFIGS[cname]
        go.run_config(cname, model_keys, batch, mbs, fails, seed=71 + list(CONFIGS).index(cname),
                      parallel=parallel)
    return fails.report()


if __name__ == "__main__":
    sys.exit(main())
