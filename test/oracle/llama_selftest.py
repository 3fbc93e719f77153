"""oracle.llama_selftest — checks the Llama oracle itself (tools/trident_torch.py, model.arch =
"llama"), without trident, as torch_selftest does for GPT-2:
  1. its file writer produces exactly FORMAT.md's Llama names, shapes, dtypes and attributes (the
     expected table is typed in here by hand, from Hugging Face's LlamaForCausalLM names);
  2. weights round-trip, the arch and the Llama attributes included;
  3. its loss equals an independent NumPy forward in float64, written from the definitions with
     explicit loops: RMSNorm, the rotary embedding as a rotation of the pairs (i, i + HD/2),
     grouped-query attention by indexing kv head h // (NH / NKV), SwiGLU, untied or tied head;
  4. its gradients equal central finite differences of that NumPy loss at sampled elements of
     every tensor;
  5. generating with its key-value cache (one token per call) gives the logits of the full
     sequence; Llama's MLP width rule.
Configs: n_kv_head in {1, 2, n_head}, an odd seq_len, an ffn_hidden that is not a multiple of 64.
"""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_common as oc  # noqa: E402

NAME = "oracle.llama_selftest"
torch, np, h5py, tt = oc.setup(NAME)
fails = oc.Failures(NAME)
work = oc.out_dir(NAME)


def expected_table(V, L, C, NH, NKV, F, tied):
    """FORMAT.md's Llama tensor table, typed in independently ([out, in] linears)."""
    HD = C // NH
    rows = [("model.embed_tokens.weight", (V, C))]
    for i in range(L):
        p = f"model.layers.{i}."
        rows += [(p + "input_layernorm.weight", (C,)),
                 (p + "self_attn.q_proj.weight", (NH * HD, C)),
                 (p + "self_attn.k_proj.weight", (NKV * HD, C)),
                 (p + "self_attn.v_proj.weight", (NKV * HD, C)),
                 (p + "self_attn.o_proj.weight", (C, NH * HD)),
                 (p + "post_attention_layernorm.weight", (C,)),
                 (p + "mlp.gate_proj.weight", (F, C)),
                 (p + "mlp.up_proj.weight", (F, C)),
                 (p + "mlp.down_proj.weight", (C, F))]
    rows.append(("model.norm.weight", (C,)))
    if not tied:
        rows.append(("lm_head.weight", (V, C)))
    return dict(rows)


def numpy_loss(W, cfg, inputs, targets):
    """The Llama model from its definition, NumPy float64, explicit loops."""
    L, NH, NKV, C = cfg.n_layer, cfg.n_head, cfg.n_kv_head, cfg.d_model
    HD, half, rep = C // NH, C // NH // 2, NH // NKV

    def rmsnorm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * w

    def rotate(vec, pos):  # one head's vector at position pos: rotate each pair (i, i + half)
        out = vec.copy()
        for i in range(half):
            a = pos * cfg.rope_theta ** (-2.0 * i / HD)
            x1, x2 = vec[i], vec[i + half]
            out[i] = x1 * math.cos(a) - x2 * math.sin(a)
            out[i + half] = x2 * math.cos(a) + x1 * math.sin(a)
        return out

    def silu(x):
        return x / (1 + np.exp(-x))

    head = W["model.embed_tokens.weight"] if cfg.tie_embeddings else W["lm_head.weight"]
    total, count = 0.0, 0
    for b in range(inputs.shape[0]):
        x = W["model.embed_tokens.weight"][inputs[b]]                 # (T, C)
        Tb = x.shape[0]
        for i in range(L):
            p = f"model.layers.{i}."
            h = rmsnorm(x, W[p + "input_layernorm.weight"])
            q = h @ W[p + "self_attn.q_proj.weight"].T                 # (T, NH*HD)
            k = h @ W[p + "self_attn.k_proj.weight"].T                 # (T, NKV*HD)
            v = h @ W[p + "self_attn.v_proj.weight"].T
            y = np.zeros((Tb, NH * HD))
            for hd in range(NH):
                kv = hd // rep
                qh = np.stack([rotate(q[t, hd * HD:(hd + 1) * HD], t) for t in range(Tb)])
                kh = np.stack([rotate(k[t, kv * HD:(kv + 1) * HD], t) for t in range(Tb)])
                vh = v[:, kv * HD:(kv + 1) * HD]
                for t in range(Tb):
                    s = qh[t] @ kh[: t + 1].T / math.sqrt(HD)
                    a = np.exp(s - s.max())
                    a /= a.sum()
                    y[t, hd * HD:(hd + 1) * HD] = a @ vh[: t + 1]
            x = x + y @ W[p + "self_attn.o_proj.weight"].T
            h = rmsnorm(x, W[p + "post_attention_layernorm.weight"])
            g = h @ W[p + "mlp.gate_proj.weight"].T
            u = h @ W[p + "mlp.up_proj.weight"].T
            x = x + (silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
        logits = rmsnorm(x, W["model.norm.weight"]) @ head.T
        m = logits.max(-1, keepdims=True)
        lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
        total += float(np.sum(lse - logits[np.arange(Tb), targets[b]]))
        count += Tb
    return total / count


def check_config(tag, cfg, seed):
    print(f"\n=== {tag}: {cfg} ===")
    model = tt.init_model(cfg, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # RMSNorm weights away from 1; larger q/k so that RoPE matters
        for name, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * (0.1 if p.dim() == 1 else 0.05))

    # 1. the weights file
    wpath = os.path.join(work, f"{tag}.h5")
    tt.save_weights(model, wpath)
    table = expected_table(cfg.vocab_size, cfg.n_layer, cfg.d_model, cfg.n_head, cfg.n_kv_head,
                           cfg.ffn_hidden, cfg.tie_embeddings)
    with h5py.File(wpath, "r") as f:
        arch = f.attrs.get("arch")
        arch = arch.decode() if isinstance(arch, bytes) else arch
        fails.check(arch == "llama", f"{tag}: root attribute arch = {arch!r}, expected 'llama'")
        ints = dict(vocab_size=cfg.vocab_size, seq_len=cfg.seq_len, n_layer=cfg.n_layer,
                    n_head=cfg.n_head, d_model=cfg.d_model, n_kv_head=cfg.n_kv_head,
                    ffn_hidden=cfg.ffn_hidden, tie_embeddings=int(cfg.tie_embeddings))
        for k, v in ints.items():
            got = f.attrs.get(k)
            fails.check(got is not None and np.issubdtype(np.asarray(got).dtype, np.integer)
                        and int(got) == v, f"{tag}: root attribute {k} = {got!r}, expected integer {v}")
        for k in ("rope_theta", "norm_eps"):
            got = f.attrs.get(k)
            fails.check(got is not None and np.asarray(got).dtype == np.float64
                        and float(got) == getattr(cfg, k),
                        f"{tag}: root attribute {k} = {got!r}, expected float64 {getattr(cfg, k)}")
        oc.check_model_group(f, table, fails, tag)
    fails.check(list(table) == list(tt.param_shapes(cfg)), f"{tag}: param_shapes order != table")

    # 2. round trip
    model2 = oc.check_round_trip(tt, torch, model, wpath, cfg, fails, tag)

    # 3. loss against the NumPy forward
    rng = np.random.default_rng(seed)
    inputs = rng.integers(0, cfg.vocab_size, size=(2, cfg.seq_len))
    targets = rng.integers(0, cfg.vocab_size, size=(2, cfg.seq_len))
    W = {n: p.detach().numpy() for n, p in model2.named_parameters()}
    loss_np = numpy_loss(W, cfg, inputs, targets)
    model2.zero_grad()
    loss_t = model2(torch.from_numpy(inputs), torch.from_numpy(targets))
    loss_t.backward()
    rel = abs(loss_t.item() - loss_np) / abs(loss_np)
    print(f"loss: trident_torch {loss_t.item():.15f}  numpy {loss_np:.15f}  rel {rel:.2e}")
    fails.check(rel < 1e-12, f"{tag}: loss {loss_t.item():.15g} != numpy {loss_np:.15g} "
                f"(rel {rel:.2e} > 1e-12)")

    # 4. gradients against central finite differences of the NumPy loss
    h = 1e-5
    worst = 0.0
    for n, p in model2.named_parameters():
        flat = W[n].reshape(-1)
        g = p.grad.numpy().reshape(-1)
        for j in rng.choice(flat.size, size=min(5, flat.size), replace=False):
            old = flat[j]
            flat[j] = old + h
            up = numpy_loss(W, cfg, inputs, targets)
            flat[j] = old - h
            dn = numpy_loss(W, cfg, inputs, targets)
            flat[j] = old
            fd = (up - dn) / (2 * h)
            err = abs(fd - g[j]) / max(1e-3, float(np.abs(g).max()))
            worst = max(worst, err)
            fails.check(err < 1e-6, f"{tag}: grad {n}[{j}]: autograd {g[j]:.9g} vs finite "
                        f"difference {fd:.9g}")
    print(f"finite differences: worst |fd - autograd| / max|g| = {worst:.2e}")

    # 5. the key-value cache: one token per call gives the full sequence's logits
    with torch.no_grad():
        full = model2.logits(torch.from_numpy(inputs))
        caches = [dict() for _ in range(cfg.n_layer)]
        steps = [model2.logits(torch.from_numpy(inputs[:, t:t + 1]), pos0=t, caches=caches)
                 for t in range(cfg.seq_len)]
        d = float((torch.cat(steps, dim=1) - full).abs().max())
    fails.check(d < 1e-12, f"{tag}: logits with the key-value cache differ by {d:.3g}")


# n_kv_head in {1, 2, n_head}; odd seq_len; ffn_hidden 23 and 11 (not multiples of 64); the
# default ffn rule (256 here); tied and untied heads; Llama 3's rope_theta.
check_config("gqa2_untied", tt.Config(vocab_size=37, seq_len=7, n_layer=2, n_head=4, d_model=16,
                                      arch="llama", n_kv_head=2, ffn_hidden=23), seed=3)
check_config("mqa_tied", tt.Config(vocab_size=29, seq_len=5, n_layer=1, n_head=3, d_model=12,
                                   arch="llama", n_kv_head=1, ffn_hidden=11, tie_embeddings=True,
                                   rope_theta=500000.0, norm_eps=1e-6), seed=5)
check_config("mha_default_ffn", tt.Config(vocab_size=19, seq_len=5, n_layer=1, n_head=2,
                                          d_model=8, arch="llama"), seed=7)

fails.check(tt.llama_ffn_hidden(4096) == 11008 and tt.llama_ffn_hidden(8) == 256
            and tt.llama_ffn_hidden(768, 64) == 2048,
            "llama_ffn_hidden: Llama's rule (4096 -> 11008, multiple_of 256; 768 -> 2048 at 64)")
sys.exit(fails.report())
