"""oracle.adamw — `trident step` (K optimizer steps on one batch) against torch.optim.AdamW with
torch.nn.utils.clip_grad_norm_, in float64 from the same float32 weights.

Settings chosen so that every part of the optimizer shows: grad_clip = 0.05 well below the
gradient norm (~1, checked), weight_decay 0.1 on the 2-D weights only, warmup_steps 2 of
steps 10 so that the 3 steps see both the warm-up and the cosine branch, two microbatches.
eps = 1e-5 rather than 1e-8: Adam's first steps are close to lr * sign(g), so at eps 1e-8 a
gradient element near zero whose float32 sign differs from float64 moves by 2 lr, which no
float32 implementation can hold to 1e-5 (torch float32 against float64, this setup: 2e-5 of
max|w| at eps 1e-8, 3e-7 at eps 1e-5). At eps 1e-5 the mistakes the test exists for stay far
outside the tolerance (measured with a float32 stand-in for trident): no clipping 4e-2, an lr
one step late 8e-4, weight decay on every parameter 2.5e-4.

Pass: losses and grad_norms (float64[K] root attributes) within 1e-5 relative of torch's; for
every tensor, max|w - w_ref| <= 1e-5 * max|w_ref| (relative to the tensor's largest weight).
The update w_K - w_0 is printed too, relative to the largest update, for information.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_common as oc  # noqa: E402

NAME = "oracle.adamw"
torch, np, h5py, tt = oc.setup(NAME)

TOL = 1e-5
K = 3
MODEL = dict(vocab_size=64, seq_len=16, n_layer=2, n_head=2, d_model=32)
# Llama: multi-query (1 kv head of 4), an odd seq_len, ffn_hidden not a multiple of 64.
LLAMA = dict(vocab_size=64, seq_len=15, n_layer=2, n_head=4, d_model=32, arch="llama",
             n_kv_head=1, ffn_hidden=40)
BATCH, MBS = 4, 2
TRAIN = dict(steps=10, global_batch_size=BATCH, lr=1e-3, min_lr=1e-4, warmup_steps=2,
             weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-5, grad_clip=0.05, seed=4321)


def main():
    fails = oc.Failures(NAME)
    for tag, model_keys in (("gpt2", MODEL), ("llama", LLAMA)):
        print(f"\n=== {tag}: {model_keys} ===")
        run(model_keys, os.path.join(oc.out_dir(NAME), tag), fails)
    return fails.report()


def run(MODEL, work, fails):
    os.makedirs(work, exist_ok=True)
    deck = os.path.join(work, "deck.toml")
    tt.write_deck(deck, {"model": MODEL, "parallel": {"micro_batch_size": MBS}, "train": TRAIN,
                         "io": {"out_dir": os.path.join(work, "run")},
                         "runtime": {"threads": 1}})
    init = os.path.join(work, "init.h5")
    oc.run_trident(NAME, ["init", deck, "--out", init], work)
    cfg, model = tt.load_weights(init, dtype=torch.float32)
    gen = torch.Generator().manual_seed(99)
    with torch.no_grad():  # no bias at zero, no LayerNorm at one: decay on them would show
        for name, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * (0.05 if p.dim() == 1 else 0.005))
    w0 = os.path.join(work, "weights.h5")
    tt.save_weights(model, w0)

    rng = np.random.default_rng(5)
    inputs = rng.integers(0, MODEL["vocab_size"], size=(BATCH, MODEL["seq_len"]))
    targets = rng.integers(0, MODEL["vocab_size"], size=(BATCH, MODEL["seq_len"]))
    bpath = os.path.join(work, "batch.h5")
    tt.write_batch(bpath, inputs, targets)

    out = os.path.join(work, "stepped.h5")
    oc.run_trident(NAME, ["step", deck, "--weights", w0, "--batch", bpath, "--steps", K,
                          "--out", out], work)
    with h5py.File(out, "r") as f:
        fmt = f.attrs.get("format")
        fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
        fails.check(fmt == "trident-weights",
                    f"output root attribute format = {fmt!r}, expected 'trident-weights'")
        for key in ("losses", "grad_norms"):
            if key not in f.attrs:
                fails.add(f"output {out} lacks the root attribute {key} (float64[{K}])")
        losses = np.asarray(f.attrs.get("losses", []), dtype=np.float64).reshape(-1)
        norms = np.asarray(f.attrs.get("grad_norms", []), dtype=np.float64).reshape(-1)
    _, got_model = tt.load_weights(out, dtype=torch.float64)

    # The reference.
    _, ref = tt.load_weights(w0, dtype=torch.float64)
    _, start = tt.load_weights(w0, dtype=torch.float64)
    opt = tt.make_adamw(ref, TRAIN["lr"], TRAIN["beta1"], TRAIN["beta2"], TRAIN["eps"],
                        TRAIN["weight_decay"])
    ti, tg = torch.from_numpy(inputs), torch.from_numpy(targets)
    ref_losses, ref_norms, lrs = [], [], []
    for s in range(1, K + 1):
        lr = tt.lr_at(s, TRAIN["lr"], TRAIN["min_lr"], TRAIN["warmup_steps"], TRAIN["steps"])
        loss, norm = tt.train_step(ref, opt, ti, tg, lr, TRAIN["grad_clip"])
        ref_losses.append(loss)
        ref_norms.append(norm)
        lrs.append(lr)

    print(f"{'step':>4} {'lr':>10} {'loss':>14} {'torch loss':>14} {'rel':>9} "
          f"{'grad_norm':>12} {'torch norm':>12} {'rel':>9}")
    for s in range(K):
        gl = losses[s] if s < len(losses) else float("nan")
        gn = norms[s] if s < len(norms) else float("nan")
        rl = abs(gl - ref_losses[s]) / abs(ref_losses[s])
        rn = abs(gn - ref_norms[s]) / abs(ref_norms[s])
        print(f"{s + 1:>4} {lrs[s]:10.3e} {gl:14.9f} {ref_losses[s]:14.9f} {rl:9.2e} "
              f"{gn:12.6e} {ref_norms[s]:12.6e} {rn:9.2e}")
        fails.check(rl <= TOL, f"step {s + 1}: loss {gl:.10g} vs torch {ref_losses[s]:.10g} "
                    f"(relative {rl:.2e} > {TOL:g})")
        fails.check(rn <= TOL, f"step {s + 1}: grad_norm {gn:.10g} vs torch {ref_norms[s]:.10g} "
                    f"(relative {rn:.2e} > {TOL:g})")
    for key, arr in (("losses", losses), ("grad_norms", norms)):
        fails.check(len(arr) == K, f"attribute {key} has {len(arr)} entries, expected {K}")
    # The test is only meaningful if clipping bit at every step.
    fails.check(min(ref_norms) > 2 * TRAIN["grad_clip"],
                f"test setup: gradient norms {ref_norms} do not exceed grad_clip "
                f"{TRAIN['grad_clip']} enough for clipping to matter")

    got = {n: p.detach().numpy() for n, p in got_model.named_parameters()}
    want = {n: p.detach().numpy() for n, p in ref.named_parameters()}
    print(f"\nweights after {K} steps (tolerance: max|d| <= {TOL:g} * max|w_ref| per tensor):")
    worst = oc.compare_tensors(np, got, want, TOL, fails, "weights")
    print(f"  worst max|d|/max|w_ref| = {worst:.2e}")
    w_start = {n: p.detach().numpy() for n, p in start.named_parameters()}
    upd = max(float(np.max(np.abs(got[n] - want[n]))) /
              max(float(np.max(np.abs(want[n] - w_start[n]))), 1e-30) for n in want)
    print(f"  (information) worst max|d| / max|w_ref - w_0| = {upd:.2e}")
    moved = min(float(np.max(np.abs(got[n] - w_start[n]))) for n in want)
    fails.check(moved > 0, "some tensor did not move at all in trident's steps")


if __name__ == "__main__":
    sys.exit(main())
