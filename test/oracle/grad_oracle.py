"""oracle.grad — `trident grad` against PyTorch: the loss and every gradient.

For each config below: write a deck, `trident init` the weights (checking the file's format),
perturb every tensor a little so that no bias or LayerNorm is at its trivial value (written back
with trident_torch.save_weights), write a random batch (NumPy, fixed seed), run `trident grad`,
and recompute loss and gradients with trident_torch in float64 from the same float32 weights.
Pass: |loss - ref| <= 1e-5 |ref| and, per tensor, max|g - ref| <= 1e-4 max|ref|.
Run one config with `grad_oracle.py NAME`. TRIDENT_TEST_DEVICE (e.g. "cuda") runs trident on that
device (fp32 products) against the same float64 reference; "cuda" without a visible GPU skips
(exit 77).
"""

import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_common as oc  # noqa: E402

NAME = "oracle.grad"
torch, np, h5py, tt = oc.setup(NAME)

LOSS_TOL = 1e-5
GRAD_TOL = 1e-4
DEVICE = os.environ.get("TRIDENT_TEST_DEVICE", "cpu")

# name: (model, batch, micro_batch_size); tiny so that each config runs in about a second.
CONFIGS = {
    "one_head": (dict(vocab_size=64, seq_len=16, n_layer=2, n_head=1, d_model=32), 2, 2),
    "seq24": (dict(vocab_size=80, seq_len=24, n_layer=2, n_head=2, d_model=32), 2, 2),
    "odd_widths": (dict(vocab_size=101, seq_len=16, n_layer=2, n_head=3, d_model=48), 2, 2),
    "microbatches": (dict(vocab_size=96, seq_len=20, n_layer=2, n_head=4, d_model=32), 6, 2),
    # Flash attention's tile remainders (64-row CPU tiles, 16-row CUDA tiles): T = 37, 256,
    # 1000 at one and three heads per rank, serial and under TP 2 (with sequence parallelism where
    # T allows it).
    "t37_h3": (dict(vocab_size=64, seq_len=37, n_layer=1, n_head=3, d_model=24), 2, 2),
    "t256_h1": (dict(vocab_size=64, seq_len=256, n_layer=1, n_head=1, d_model=16), 1, 1),
    "t1000_h3": (dict(vocab_size=64, seq_len=1000, n_layer=1, n_head=3, d_model=24), 1, 1),
    "t37_tp2_h1": (dict(vocab_size=64, seq_len=37, n_layer=1, n_head=2, d_model=16), 2, 2,
                   {"tp": 2}),
    "t1000_tp2_sp_h3": (dict(vocab_size=64, seq_len=1000, n_layer=1, n_head=6, d_model=24), 1, 1,
                        {"tp": 2, "sequence_parallel": True}),
    # 2D TP (parallel.tp_mode = "2d", SUMMA on a 2 x 2 grid, docs/tp2d.md): odd vocabulary
    # (padding to q), two microbatches of 2 sequences (one per grid row), 2 heads (one per
    # grid column).
    "tp4_2d": (dict(vocab_size=61, seq_len=12, n_layer=2, n_head=2, d_model=16), 4, 2,
               {"tp": 4, "tp_mode": "2d"}),
    # ... and with pp = 2 (8 ranks): one layer per stage, the tied wte on both.
    "tp4_pp2_2d": (dict(vocab_size=61, seq_len=12, n_layer=2, n_head=2, d_model=16), 4, 2,
                   {"tp": 4, "pp": 2, "tp_mode": "2d"}),
    # Uneven pipeline splits (parallel.pipeline_layers): 5 layers at tp 2 x pp 3 as [1, 2, 2],
    # and at pp 2 x vpp 2 as [2, 1, 1, 1] (rank 0's chunks of 2 and 1 layers).
    "uneven_tp2_pp3": (dict(vocab_size=64, seq_len=8, n_layer=5, n_head=2, d_model=16), 3, 1,
                       {"tp": 2, "pp": 3, "pipeline_layers": [1, 2, 2]}),
    "uneven_pp2_vpp2": (dict(vocab_size=64, seq_len=8, n_layer=5, n_head=2, d_model=16), 4, 1,
                        {"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b",
                         "pipeline_layers": [2, 1, 1, 1]}),
    # ZB-V (two chunks per rank in a V, B and W split): GPT-2 at pp 2 (rank 0 holds the
    # embedding and the tied head), Llama at tp 2 x pp 2 with a tied head.
    "zbv_pp2": (dict(vocab_size=64, seq_len=8, n_layer=4, n_head=2, d_model=16), 4, 1,
                {"pp": 2, "vpp": 2, "schedule": "zb-v"}),
    "llama_zbv_tp2_pp2": (dict(vocab_size=50, seq_len=9, n_layer=4, n_head=2, d_model=16,
                               arch="llama", n_kv_head=2, ffn_hidden=24, tie_embeddings=True),
                          4, 1, {"tp": 2, "pp": 2, "vpp": 2, "schedule": "zb-v"}),
    # Llama: n_kv_head 2 of 4, 1 (multi-query, tied head, Llama 3's theta) and n_head; odd
    # seq_len; ffn_hidden 40 and 24 (not multiples of 64) and Llama's rule (256 here).
    "llama_gqa": (dict(vocab_size=64, seq_len=15, n_layer=2, n_head=4, d_model=32, arch="llama",
                       n_kv_head=2, ffn_hidden=40), 4, 2),
    "llama_mqa_tied": (dict(vocab_size=50, seq_len=9, n_layer=2, n_head=3, d_model=24,
                            arch="llama", n_kv_head=1, ffn_hidden=24, tie_embeddings=True,
                            rope_theta=500000.0), 2, 2),
    "llama_mha": (dict(vocab_size=40, seq_len=12, n_layer=1, n_head=2, d_model=16, arch="llama",
                       n_kv_head=2), 2, 1),
    # Llama under TP 2: kv heads split (2 of 4), and one kv head replicated with sequence
    # parallelism (its k/v gradients summed over TP).
    "llama_tp2_gqa": (dict(vocab_size=64, seq_len=15, n_layer=1, n_head=4, d_model=32,
                           arch="llama", n_kv_head=2, ffn_hidden=40), 2, 2, {"tp": 2}),
    "llama_tp2_sp_mqa": (dict(vocab_size=64, seq_len=16, n_layer=1, n_head=4, d_model=32,
                              arch="llama", n_kv_head=1, ffn_hidden=40), 2, 2,
                         {"tp": 2, "sequence_parallel": True}),
}


def check_weights_file(path, model_keys, fails, what):
    with h5py.File(path, "r") as f:
        fmt = f.attrs.get("format")
        fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
        fails.check(fmt == "trident-weights",
                    f"{what}: root attribute format = {fmt!r}, expected 'trident-weights'")
        fails.check(int(f.attrs.get("format_version", -1)) == 1,
                    f"{what}: root attribute format_version = {f.attrs.get('format_version')!r}, "
                    "expected 1")
        for k, v in model_keys.items():
            got = f.attrs.get(k)
            got = got.decode() if isinstance(got, bytes) else got
            if isinstance(v, str):
                ok = got == v
            elif isinstance(v, float):
                ok = got is not None and float(got) == v
            else:  # integers, and tie_embeddings stored as 0 / 1
                ok = got is not None and int(got) == int(v)
            fails.check(ok, f"{what}: root attribute {k} = {got!r}, expected {v!r}")


def run_config(cname, model_keys, batch, mbs, fails, seed, parallel=None):
    work = os.path.join(oc.out_dir(NAME), cname)
    os.makedirs(work, exist_ok=True)
    print(f"\n=== {cname}: {model_keys}, batch {batch}, micro_batch_size {mbs} ===")
    deck = os.path.join(work, "deck.toml")
    tt.write_deck(deck, {
        "model": model_keys,
        "parallel": {"micro_batch_size": mbs, **(parallel or {})},
        "train": {"global_batch_size": batch, "seed": 1000 + seed},
        "io": {"out_dir": os.path.join(work, "run")},
        "runtime": {"threads": 1, "device": DEVICE},
    })
    init = os.path.join(work, "init.h5")
    ranks = 1
    for axis in ("tp", "cp", "dp", "pp"):
        ranks *= (parallel or {}).get(axis, 1)
    oc.run_trident(NAME, ["init", deck, "--out", init], work, mpi_ranks=ranks)
    check_weights_file(init, model_keys, fails, f"{cname}: trident init {init}")
    try:
        cfg, model = tt.load_weights(init, dtype=torch.float32)
    except (ValueError, KeyError) as e:
        fails.add(f"{cname}: cannot read trident init's weights: {e}")
        return
    # wte: an init of all zeros or ones would make the comparison toothless.
    emb = next(p for p in model.parameters() if p.dim() == 2)  # wte / model.embed_tokens
    std = float(emb.detach().std())
    fails.check(0.005 < std < 0.1, f"{cname}: trident init embedding std = {std:.4g}, "
                "expected ~0.02")

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * (0.05 if p.dim() == 1 else 0.005))
    weights = os.path.join(work, "weights.h5")
    tt.save_weights(model, weights)

    rng = np.random.default_rng(seed)
    V, T = model_keys["vocab_size"], model_keys["seq_len"]
    inputs = rng.integers(0, V, size=(batch, T))
    targets = rng.integers(0, V, size=(batch, T))
    bpath = os.path.join(work, "batch.h5")
    tt.write_batch(bpath, inputs, targets)

    gpath = os.path.join(work, "grad.h5")
    oc.run_trident(NAME, ["grad", deck, "--weights", weights, "--batch", bpath, "--out", gpath],
                   work, mpi_ranks=ranks)
    try:
        loss, grads = tt.read_grads(gpath, cfg)
    except (ValueError, KeyError) as e:
        fails.add(f"{cname}: cannot read trident grad's output: {e}")
        return

    # The reference: float64 from the very float32 weights trident read.
    _, ref = tt.load_weights(weights, dtype=torch.float64)
    ref_loss = ref(torch.from_numpy(inputs), torch.from_numpy(targets))
    ref_loss.backward()
    want = {n: p.grad.numpy() for n, p in ref.named_parameters()}
    rel = abs(loss - ref_loss.item()) / abs(ref_loss.item())
    print(f"  loss: trident {loss:.10f}  torch(float64) {ref_loss.item():.10f}  rel {rel:.2e}")
    fails.check(rel <= LOSS_TOL, f"{cname}: loss {loss:.10g} vs torch {ref_loss.item():.10g}: "
                f"relative difference {rel:.2e} > {LOSS_TOL:g}")
    worst = oc.compare_tensors(np, grads, want, GRAD_TOL, fails, f"{cname}: gradient")
    print(f"  worst gradient max|d|/max|ref| = {worst:.2e} (tolerance {GRAD_TOL:g})")


def gpu_visible():
    if not shutil.which("nvidia-smi"):
        return False
    p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return p.returncode == 0 and "GPU" in p.stdout


def main():
    if DEVICE == "cuda" and not gpu_visible():
        print(f"{NAME}: no GPU visible: skipped")
        return 77
    names = sys.argv[1:] or list(CONFIGS)
    if DEVICE != "cpu" and not sys.argv[1:]:  # 2D TP runs on the CPU backend only (refused)
        two_d = [n for n in names if (CONFIGS[n][3:] or [{}])[0].get("tp_mode") == "2d"]
        print(f"{NAME}: {', '.join(two_d)} left out: 2D tensor parallelism runs on \"cpu\" only")
        names = [n for n in names if n not in two_d]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        print(f"{NAME}: unknown config(s) {unknown}; choose from {list(CONFIGS)}")
        return 2
    fails = oc.Failures(NAME)
    for cname in names:
        model_keys, batch, mbs, *parallel = CONFIGS[cname]
        run_config(cname, model_keys, batch, mbs, fails, seed=17 + list(CONFIGS).index(cname),
                   parallel=parallel[0] if parallel else None)
    return fails.report()


if __name__ == "__main__":
    sys.exit(main())
