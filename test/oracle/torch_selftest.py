"""oracle.torch_selftest — checks the oracle itself (tools/trident_torch.py), without trident:
  1. its file writers produce exactly FORMAT.md's names, shapes, dtypes and attributes (the
     expected table is written out here by hand, not taken from the module);
  2. files round-trip (weights, batch, gradient dump);
  3. its model's loss equals an independent NumPy forward (explicit per-head loops, GELU and
     LayerNorm from their formulas, log-sum-exp cross-entropy) in float64;
  4. its gradients equal central finite differences (float64) at sampled elements, the tied wte
     included;
  5. the AdamW groups and the lr schedule follow the contract.
A wrong oracle would make every trident comparison meaningless, so this runs with them.
"""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_common as oc  # noqa: E402

NAME = "oracle.torch_selftest"
torch, np, h5py, tt = oc.setup(NAME)
fails = oc.Failures(NAME)
work = oc.out_dir(NAME)


def expected_table(V, T, L, C):
    """FORMAT.md's tensor table, typed in independently."""
    rows = [("wte", (V, C)), ("wpe", (T, C))]
    for i in range(L):
        rows += [(f"h.{i}.ln_1.weight", (C,)), (f"h.{i}.ln_1.bias", (C,)),
                 (f"h.{i}.attn.c_attn.weight", (C, 3 * C)), (f"h.{i}.attn.c_attn.bias", (3 * C,)),
                 (f"h.{i}.attn.c_proj.weight", (C, C)), (f"h.{i}.attn.c_proj.bias", (C,)),
                 (f"h.{i}.ln_2.weight", (C,)), (f"h.{i}.ln_2.bias", (C,)),
                 (f"h.{i}.mlp.c_fc.weight", (C, 4 * C)), (f"h.{i}.mlp.c_fc.bias", (4 * C,)),
                 (f"h.{i}.mlp.c_proj.weight", (4 * C, C)), (f"h.{i}.mlp.c_proj.bias", (C,))]
    rows += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return dict(rows)


def numpy_loss(W, cfg, inputs, targets):
    """FORMAT.md's model, written from the text with NumPy, float64."""
    V, T, L, NH, C = cfg.vocab_size, cfg.seq_len, cfg.n_layer, cfg.n_head, cfg.d_model
    HD = C // NH

    def layernorm(x, w, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)  # biased variance
        return (x - mu) / np.sqrt(var + 1e-5) * w + b

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    total, count = 0.0, 0
    for b in range(inputs.shape[0]):
        x = W["wte"][inputs[b]] + W["wpe"][: inputs.shape[1]]          # (T, C)
        Tb = x.shape[0]
        for i in range(L):
            p = f"h.{i}."
            h = layernorm(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"])
            qkv = h @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]  # (T, 3C)
            heads = []
            for hd in range(NH):
                q = qkv[:, hd * HD:(hd + 1) * HD]
                k = qkv[:, C + hd * HD:C + (hd + 1) * HD]
                v = qkv[:, 2 * C + hd * HD:2 * C + (hd + 1) * HD]
                out = np.zeros((Tb, HD))
                for t in range(Tb):  # causal: position t sees 0..t
                    s = q[t] @ k[: t + 1].T / math.sqrt(HD)
                    a = np.exp(s - s.max())
                    a /= a.sum()
                    out[t] = a @ v[: t + 1]
                heads.append(out)
            y = np.concatenate(heads, axis=1)
            x = x + y @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
            h = layernorm(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"])
            h = gelu(h @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"])
            x = x + h @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
        x = layernorm(x, W["ln_f.weight"], W["ln_f.bias"])
        logits = x @ W["wte"].T                                          # tied head
        m = logits.max(-1, keepdims=True)
        lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
        total += float(np.sum(lse - logits[np.arange(Tb), targets[b]]))
        count += Tb
    return total / count


# A deliberately odd model: vocab 37, seq_len 7, 3 heads of width 4.
cfg = tt.Config(vocab_size=37, seq_len=7, n_layer=2, n_head=3, d_model=12)
model = tt.init_model(cfg, seed=3)
gen = torch.Generator().manual_seed(11)
with torch.no_grad():  # perturb biases and LayerNorms so that none is trivial
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)

# 1. the weights file, as FORMAT.md writes it
wpath = os.path.join(work, "weights.h5")
tt.save_weights(model, wpath)
table = expected_table(37, 7, 2, 12)
with h5py.File(wpath, "r") as f:
    fails.check(f.attrs.get("format") in ("trident-weights", b"trident-weights"),
                f"weights: root attribute format = {f.attrs.get('format')!r}, expected 'trident-weights'")
    fails.check(int(f.attrs.get("format_version", -1)) == 1, "weights: format_version != 1")
    for k, v in dict(vocab_size=37, seq_len=7, n_layer=2, n_head=3, d_model=12).items():
        got = f.attrs.get(k)
        fails.check(got is not None and np.issubdtype(np.asarray(got).dtype, np.integer)
                    and int(got) == v, f"weights: root attribute {k} = {got!r}, expected integer {v}")
    oc.check_model_group(f, table, fails, "weights")
    fails.check(list(table) == list(tt.param_shapes(cfg)), "param_shapes order != FORMAT.md's table")

# 2. round trips
model2 = oc.check_round_trip(tt, torch, model, wpath, cfg, fails, "weights")

rng = np.random.default_rng(7)
inputs = rng.integers(0, 37, size=(3, 7))
targets = rng.integers(0, 37, size=(3, 7))
bpath = os.path.join(work, "batch.h5")
tt.write_batch(bpath, inputs, targets)
with h5py.File(bpath, "r") as f:
    for n in ("inputs", "targets"):
        fails.check(f[n].dtype == np.int32 and f[n].shape == (3, 7),
                    f"batch: /{n} is {f[n].dtype} {f[n].shape}, expected int32 (3, 7)")
bi, bt = tt.read_batch(bpath)
fails.check(np.array_equal(bi.numpy(), inputs) and np.array_equal(bt.numpy(), targets),
            "batch round trip differs")

# 3. loss against the independent NumPy forward (float64 all through)
W = {n: p.detach().numpy() for n, p in model2.named_parameters()}
loss_np = numpy_loss(W, cfg, inputs, targets)
model2.zero_grad()
loss_t = model2(bi, bt)
loss_t.backward()
rel = abs(loss_t.item() - loss_np) / abs(loss_np)
print(f"loss: trident_torch {loss_t.item():.15f}  numpy {loss_np:.15f}  rel {rel:.2e}")
fails.check(rel < 1e-12, f"loss: trident_torch {loss_t.item():.15g} != numpy {loss_np:.15g} "
            f"(rel {rel:.2e} > 1e-12)")
# and a shorter sequence (wpe[:T]) through the same path
loss_np5 = numpy_loss(W, cfg, inputs[:, :5], targets[:, :5])
with torch.no_grad():
    loss_t5 = model2(bi[:, :5], bt[:, :5]).item()
fails.check(abs(loss_t5 - loss_np5) < 1e-12 * abs(loss_np5),
            f"loss at T=5: {loss_t5:.15g} != numpy {loss_np5:.15g}")

# 4. gradients against central finite differences of the NumPy loss
h = 1e-5
worst = 0.0
for n, p in model2.named_parameters():
    flat = W[n].reshape(-1)
    idx = rng.choice(flat.size, size=min(6, flat.size), replace=False)
    if n == "wte":  # rows of used and unused tokens: the head's part of the tied gradient
        unused = sorted(set(range(37)) - set(inputs.reshape(-1).tolist()))
        idx = np.concatenate([idx, [unused[0] * 12 + 1]]) if unused else idx
    g = p.grad.numpy().reshape(-1)
    for j in idx:
        old = flat[j]
        flat[j] = old + h
        up = numpy_loss(W, cfg, inputs, targets)
        flat[j] = old - h
        dn = numpy_loss(W, cfg, inputs, targets)
        flat[j] = old
        fd = (up - dn) / (2 * h)
        err = abs(fd - g[j]) / max(1e-3, float(np.abs(g).max()))
        worst = max(worst, err)
        fails.check(err < 1e-6, f"grad {n}[{j}]: autograd {g[j]:.9g} vs finite difference {fd:.9g}")
print(f"finite differences: worst |fd - autograd| / max|g| = {worst:.2e}")

# gradient dump round trip
gpath = os.path.join(work, "grad.h5")
tt.write_grads(gpath, model2, loss_t.item())
with h5py.File(gpath, "r") as f:
    fails.check(f.attrs["loss"].dtype == np.float64, "grad dump: loss attribute is not float64")
    for n, shape in table.items():
        fails.check(f"grad/{n}" in f and f[f"grad/{n}"].shape == shape,
                    f"grad dump: /grad/{n} missing or not {shape}")
gl, gg = tt.read_grads(gpath, cfg)
fails.check(gl == loss_t.item(), "grad dump: loss round trip differs")

# 5. AdamW groups and lr schedule
opt = tt.make_adamw(model2, 1e-3, 0.9, 0.95, 1e-8, 0.1)
ids = {id(p): n for n, p in model2.named_parameters()}
decayed = {ids[id(p)] for p in opt.param_groups[0]["params"]}
want_decay = {n for n in table if n in ("wte", "wpe") or n.endswith(
    ("c_attn.weight", "attn.c_proj.weight", "c_fc.weight", "mlp.c_proj.weight"))}
fails.check(decayed == want_decay and opt.param_groups[0]["weight_decay"] == 0.1
            and opt.param_groups[1]["weight_decay"] == 0.0,
            f"AdamW groups: decayed {sorted(decayed)}, expected {sorted(want_decay)}")
fails.check(sum(len(g["params"]) for g in opt.param_groups) == len(table),
            "AdamW groups do not hold every parameter once")
sched = [tt.lr_at(s, 1.0, 0.1, 2, 10) for s in (1, 2, 3, 6, 10)]
want = [0.5, 1.0, 0.1 + 0.45 * (1 + math.cos(math.pi / 8)), 0.55, 0.1]
fails.check(all(abs(a - b) < 1e-12 for a, b in zip(sched, want)),
            f"lr schedule {sched} != {want}")

sys.exit(fails.report())
