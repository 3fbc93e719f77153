"""`trident convert` against Hugging Face's conventions (FORMAT.md, "Hugging Face models").

For GPT-2, Llama with grouped-query attention and an untied head, and Llama with one kv head
and a tied head: perturb `trident init`'s weights (so that norms and biases are not 1 and 0),
export them to a Hugging Face folder (float32 and bfloat16, one file and shards), and check

1. the round trip trident -> folder -> trident: float32 bit for bit; bfloat16: the imported
   weights are bit for bit the float32 weights rounded to nearest even (numpy's rounding,
   written here), and exporting those again gives byte-identical safetensors files;
2. the files: 8-byte little-endian header length, header padded to 8 bytes, `__metadata__`
   {"format": "pt"}, the index's weight_map and total_size;
3. a PyTorch model built from the folder alone — its own safetensors reader (struct, json,
   numpy), Hugging Face's tensor names, layouts and config.json keys (GPT-2's Conv1D [in, out],
   Llama's [out, in] with rotate_half rotary and repeat_kv) — gives the loss and gradients of
   `trident grad` on a random batch within grad_oracle's tolerances (float64 reference);
4. a folder written here as other tools write them (F16 or BF16, GPT-2 names without
   "transformer.", buffers, a saved tied head, hand-made shards) imports to exactly its
   values and agrees with the oracle the same way;
5. a training run at tp 2 (vocabulary 67: padded to 68) from an imported folder via
   io.init_weights follows the tp 1 run from the original file, and exporting its checkpoint
   gives that checkpoint's weights.
"""

import json
import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_common as oc  # noqa: E402

NAME = "oracle.hf_convert"
torch, np, h5py, tt = oc.setup(NAME)

LOSS_TOL = 1e-5  # grad_oracle's
GRAD_TOL = 1e-4

CASES = {
    "gpt2": dict(vocab_size=67, seq_len=16, n_layer=2, n_head=2, d_model=16),
    "llama_gqa_untied": dict(vocab_size=67, seq_len=16, n_layer=2, n_head=4, d_model=32,
                             arch="llama", n_kv_head=2, ffn_hidden=48, rope_theta=500000.0,
                             norm_eps=1e-6, tie_embeddings=False),
    "llama_mqa_tied": dict(vocab_size=61, seq_len=12, n_layer=2, n_head=4, d_model=16,
                           arch="llama", n_kv_head=1, ffn_hidden=40, tie_embeddings=True),
}
BATCH = 3


# --- a safetensors reader of its own --------------------------------------------------------

def read_safetensors(path):
    """name -> float64 numpy array, and the metadata; checks the layout rules on the way."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    out, covered = {}, 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        assert b == covered, f"{path}: {name} starts at {b}, expected {covered}"
        covered = e
        raw = data[b:e]
        if t["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif t["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2")
        elif t["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: {name}: dtype {t['dtype']}")
        out[name] = a.reshape(t["shape"]).astype(np.float64)
    assert covered == len(data), f"{path}: data section {len(data)} bytes, tensors cover {covered}"
    return out, meta, n


def read_folder(folder):
    """The tensors of a Hugging Face folder (one file or shards with their index)."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            wmap = json.load(f)["weight_map"]
        files = sorted(set(wmap.values()))
    else:
        wmap, files = None, ["model.safetensors"]
    tensors = {}
    for fn in files:
        t, _, _ = read_safetensors(os.path.join(folder, fn))
        if wmap is not None:
            assert all(wmap[n] == fn for n in t), f"{fn}: index disagrees"
        tensors.update(t)
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    # Hugging Face's loader: buffers are not parameters; GPT2Model-era files lack the prefix.
    tensors = {n: a for n, a in tensors.items()
               if not n.endswith((".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq"))}
    if cfg["model_type"] == "gpt2":
        tensors = {(n if n.startswith("transformer.") or n == "lm_head.weight"
                    else "transformer." + n): a for n, a in tensors.items()}
        if "lm_head.weight" in tensors:  # tied: the same matrix
            assert np.array_equal(tensors.pop("lm_head.weight"), tensors["transformer.wte.weight"])
    elif cfg.get("tie_word_embeddings", False) and "lm_head.weight" in tensors:
        assert np.array_equal(tensors.pop("lm_head.weight"), tensors["model.embed_tokens.weight"])
    return cfg, tensors


def write_safetensors(path, tensors, dtype):
    """name -> float32 array (or (array, "F32") for a buffer kept in float32), as
    save_pretrained would: sorted names, `dtype` F32 | F16 | BF16."""
    header, chunks, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        a, dt = tensors[name] if isinstance(tensors[name], tuple) else (tensors[name], dtype)
        a = np.asarray(a, dtype=np.float32)
        if dt == "F16":
            raw = a.astype("<f2").tobytes()
        elif dt == "BF16":
            raw = (bf16_round(a).view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            raw = a.astype("<f4").tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        chunks.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


# --- Hugging Face's models, from their config and state dict --------------------------------

def causal_attention(q, k, v):
    T, hd = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-1, -2)) / (hd ** 0.5)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(-1)
    return att @ v


def gpt2_logits(cfg, W, x):
    """GPT2LMHeadModel: Conv1D weights [in, out], y = x @ W + b; tied head."""
    C, H = cfg["n_embd"], cfg["n_head"]
    eps = cfg["layer_norm_epsilon"]
    B, T = x.shape
    ln = lambda h, p: torch.nn.functional.layer_norm(h, (C,), W[p + ".weight"], W[p + ".bias"], eps)
    h = W["transformer.wte.weight"][x] + W["transformer.wpe.weight"][:T]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        a = ln(h, p + "ln_1")
        qkv = a @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=2))
        o = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        h = h + o @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        m = ln(h, p + "ln_2") @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"]
        m = 0.5 * m * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (m + 0.044715 * m ** 3)))  # gelu_new
        h = h + m @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
    h = ln(h, "transformer.ln_f")
    head = W.get("lm_head.weight", W["transformer.wte.weight"])
    return h @ head.T


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def llama_logits(cfg, W, x):
    """LlamaForCausalLM: nn.Linear weights [out, in]; RoPE by rotate_half; repeat_kv."""
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads", H)
    hd, eps, theta = C // H, cfg["rms_norm_eps"], cfg["rope_theta"]
    B, T = x.shape
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rms(h, w):
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))

    h = W["model.embed_tokens.weight"][x]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms(h, W[p + "input_layernorm.weight"])
        q = (a @ W[p + "self_attn.q_proj.weight"].T).view(B, T, H, hd).transpose(1, 2)
        k = (a @ W[p + "self_attn.k_proj.weight"].T).view(B, T, KV, hd).transpose(1, 2)
        v = (a @ W[p + "self_attn.v_proj.weight"].T).view(B, T, KV, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        o = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        h = h + o @ W[p + "self_attn.o_proj.weight"].T
        m = rms(h, W[p + "post_attention_layernorm.weight"])
        g = torch.nn.functional.silu(m @ W[p + "mlp.gate_proj.weight"].T)
        h = h + (g * (m @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
    h = rms(h, W["model.norm.weight"])
    if cfg.get("tie_word_embeddings", False):
        assert "lm_head.weight" not in W
        head = W["model.embed_tokens.weight"]
    else:
        head = W["lm_head.weight"]
    return h @ head.T


def hf_loss_and_grads(folder, inputs, targets):
    cfg, tensors = read_folder(folder)
    W = {n: torch.tensor(a, requires_grad=True) for n, a in tensors.items()}
    fwd = gpt2_logits if cfg["model_type"] == "gpt2" else llama_logits
    logits = fwd(cfg, W, torch.from_numpy(inputs))
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             torch.from_numpy(targets).reshape(-1))
    loss.backward()
    return cfg, loss.item(), {n: w.grad.numpy() for n, w in W.items()}


def trident_name(hf, arch):
    if arch == "llama":
        return hf
    if hf in ("transformer.wte.weight", "transformer.wpe.weight"):
        return hf[len("transformer."):-len(".weight")]
    return hf[len("transformer."):]


# --- helpers --------------------------------------------------------------------------------

def bf16_round(a):
    """float32 -> float32 holding the nearest bfloat16 (ties to even), as trident rounds."""
    b = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def model_group(path):
    with h5py.File(path, "r") as f:
        return {n: f["model"][n][...] for n in f["model"]}, dict(f.attrs)


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def perturb(path, rng):
    """Every tensor random (norm weights near 1, biases small), checksums dropped."""
    with h5py.File(path, "r+") as f:
        for n in f["model"]:
            ds = f["model"][n]
            if ds.ndim == 2:
                val = rng.normal(0, 0.2, ds.shape)
            elif "ln" in n or "norm" in n:
                val = 1 + rng.normal(0, 0.2, ds.shape) if n.endswith("weight") else rng.normal(0, 0.2, ds.shape)
            else:
                val = rng.normal(0, 0.1, ds.shape)
            ds[...] = val.astype(np.float32)
            if "checksum" in ds.attrs:
                del ds.attrs["checksum"]


def check_files(folder, fails, tag, sharded):
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if sharded:
        fails.check(len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors",
                    f"{tag}: expected shards model-0000k-of-0000n, got {files}")
        with open(os.path.join(folder, "model.safetensors.index.json")) as f:
            idx = json.load(f)
        total = 0
        for fn in files:
            t, _, _ = read_safetensors(os.path.join(folder, fn))
            total += sum(a.size for a in t.values())
        item = 2 if "bf16" in tag else 4
        fails.check(idx["metadata"]["total_size"] == total * item,
                    f"{tag}: index total_size {idx['metadata']['total_size']} != {total * item}")
    else:
        fails.check(files == ["model.safetensors"], f"{tag}: expected model.safetensors, got {files}")
    for fn in files:
        _, meta, n = read_safetensors(os.path.join(folder, fn))
        fails.check(n % 8 == 0, f"{tag}: {fn}: header length {n} is not a multiple of 8")
        fails.check(meta == {"format": "pt"}, f"{tag}: {fn}: __metadata__ {meta}")


def run_case(cname, keys, fails, seed):
    work = os.path.join(oc.out_dir(NAME), cname)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    print(f"\n=== {cname}: {keys} ===")
    deck = os.path.join(work, "deck.toml")
    tt.write_deck(deck, {"model": keys, "parallel": {"micro_batch_size": BATCH},
                         "train": {"global_batch_size": BATCH},
                         "io": {"out_dir": os.path.join(work, "run")},
                         "runtime": {"threads": 1}})
    orig = os.path.join(work, "weights.h5")
    oc.run_trident(NAME, ["init", deck, "--out", orig], work)
    rng = np.random.default_rng(seed)
    perturb(orig, rng)
    want, want_attrs = model_group(orig)
    arch = keys.get("arch", "gpt2")

    V, T = keys["vocab_size"], keys["seq_len"]
    inputs = rng.integers(0, V, size=(BATCH, T))
    targets = rng.integers(0, V, size=(BATCH, T))
    batch = os.path.join(work, "batch.h5")
    tt.write_batch(batch, inputs, targets)

    def trident_loss(weights, tag):
        gpath = os.path.join(work, f"grad-{tag}.h5")
        oc.run_trident(NAME, ["grad", deck, "--weights", weights, "--batch", batch, "--out", gpath],
                       work)
        with h5py.File(gpath, "r") as f:
            return float(f.attrs["loss"]), {n: f["grad"][n][...] for n in f["grad"]}

    for dtype in ("f32", "bf16"):
        for sharded in (False, True):
            tag = f"{cname} {dtype}{' sharded' if sharded else ''}"
            folder = os.path.join(work, f"hf-{dtype}{'-sharded' if sharded else ''}")
            args = ["convert", "--from", orig, "--to", folder, "--dtype", dtype]
            if sharded:
                args += ["--max-shard-size", "3KB"]
            oc.run_trident(NAME, args, work)
            check_files(folder, fails, tag, sharded)
            back = folder + ".h5"
            oc.run_trident(NAME, ["convert", "--from", folder, "--to", back], work)
            got, got_attrs = model_group(back)
            fails.check(set(got) == set(want), f"{tag}: round trip names {sorted(got)}")
            for k in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model", "arch", "n_kv_head",
                      "ffn_hidden", "tie_embeddings", "rope_theta", "norm_eps"):
                if k in want_attrs:
                    fails.check(got_attrs.get(k) == want_attrs[k],
                                f"{tag}: attribute {k} {got_attrs.get(k)} != {want_attrs[k]}")
            expect = want if dtype == "f32" else {n: bf16_round(a) for n, a in want.items()}
            bad = [n for n in want if n in got and not same_bits(got[n], expect[n])]
            fails.check(not bad, f"{tag}: round trip not bitwise for {bad}")
            print(f"  {tag}: round trip bitwise over {len(want)} tensors: {not bad}")
            if dtype == "bf16" and not sharded:  # bf16 -> trident -> bf16: the same bytes
                again = folder + "-again"
                oc.run_trident(NAME, ["convert", "--from", back, "--to", again, "--dtype", "bf16"],
                               work)
                for fn in os.listdir(folder):
                    with open(os.path.join(folder, fn), "rb") as a, open(os.path.join(again, fn), "rb") as b:
                        fails.check(a.read() == b.read(), f"{tag}: re-export of {fn} differs")
            if sharded:
                continue
            # The oracle: the folder alone, in Hugging Face's conventions, vs trident grad.
            loss, grads = trident_loss(back, dtype)
            cfg, ref_loss, ref_grads = hf_loss_and_grads(folder, inputs, targets)
            rel = abs(loss - ref_loss) / abs(ref_loss)
            print(f"  {tag}: loss trident {loss:.10f}  HF-convention torch(float64) {ref_loss:.10f}"
                  f"  rel {rel:.2e}")
            fails.check(rel <= LOSS_TOL, f"{tag}: loss {loss:.10g} vs {ref_loss:.10g}: relative "
                        f"difference {rel:.2e} > {LOSS_TOL:g}")
            mapped = {trident_name(n, arch): g for n, g in ref_grads.items()}
            fails.check(set(mapped) == set(grads), f"{tag}: gradient names {sorted(set(mapped) ^ set(grads))}")
            worst = oc.compare_tensors(np, grads, {n: g for n, g in mapped.items() if n in grads},
                                       GRAD_TOL, fails, f"{tag}: gradient")
            print(f"  worst gradient max|d|/max|ref| = {worst:.2e} (tolerance {GRAD_TOL:g})")
    return work, orig, deck


def train_from_import(fails):
    """io.init_weights = an imported folder at tp 2 (vocabulary 67, padded to 68) vs the
    original weights at tp 1; then the checkpoint exported and re-imported."""
    work = os.path.join(oc.out_dir(NAME), "train_tp2")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    keys = CASES["gpt2"]
    V = keys["vocab_size"]
    tokens = os.path.join(work, "tokens.h5")
    with h5py.File(tokens, "w") as f:
        f.create_dataset("tokens", data=(np.random.default_rng(5).integers(0, V, 4000)).astype(np.uint16))
        f.attrs["vocab_size"] = np.int64(V)
        f.attrs["tokenizer"] = "byte"
    base = {"model": keys, "parallel": {"micro_batch_size": 2},
            "train": {"steps": 3, "global_batch_size": 4, "warmup_steps": 1, "lr": 1e-3},
            "data": {"train": tokens}, "runtime": {"threads": 1}}
    deck0 = os.path.join(work, "init.toml")
    tt.write_deck(deck0, {**base, "io": {"out_dir": os.path.join(work, "init")}})
    orig = os.path.join(work, "weights.h5")
    oc.run_trident(NAME, ["init", deck0, "--out", orig], work)
    perturb(orig, np.random.default_rng(9))
    folder = os.path.join(work, "hf")
    oc.run_trident(NAME, ["convert", "--from", orig, "--to", folder, "--max-shard-size", "4KB"], work)
    imported = os.path.join(work, "imported.h5")
    oc.run_trident(NAME, ["convert", "--from", folder, "--to", imported], work)

    losses = {}
    for tp, init in ((1, orig), (2, imported)):
        out = os.path.join(work, f"run-tp{tp}")
        deck = os.path.join(work, f"tp{tp}.toml")
        tt.write_deck(deck, {**base, "parallel": {"micro_batch_size": 2, "tp": tp},
                             "io": {"out_dir": out, "init_weights": init, "resume": "none"}})
        oc.run_trident(NAME, ["train", deck], work, mpi_ranks=tp)
        with h5py.File(os.path.join(out, "metrics.h5"), "r") as f:
            losses[tp] = f["loss"][...]
    rel = float(np.max(np.abs(losses[2] - losses[1]) / np.abs(losses[1])))
    print(f"\n  train from imported folder at tp 2 (vocab {V} padded to {V + 1}): losses {losses[2]}"
          f" vs tp 1 from the original {losses[1]}: max rel {rel:.2e}")
    fails.check(len(losses[2]) == 3 and rel <= LOSS_TOL,
                f"train tp 2 from the imported model: losses {losses[2]} vs {losses[1]} (rel {rel:.2e})")

    ckdir = os.path.join(work, "run-tp2", "checkpoints")
    ck = os.path.join(ckdir, sorted(os.listdir(ckdir))[-1])
    out = os.path.join(work, "hf-from-checkpoint")
    oc.run_trident(NAME, ["convert", "--from", ck, "--to", out], work)
    cfg, tensors = read_folder(out)
    want, _ = model_group(ck)
    bad = [n for n, a in tensors.items()
           if not same_bits(a.astype(np.float32), want[trident_name(n, "gpt2")])]
    fails.check(cfg["vocab_size"] == V and not bad and len(tensors) == len(want),
                f"export of checkpoint {ck}: vocab {cfg['vocab_size']}, differing {bad}")
    print(f"  export of the tp 2 checkpoint: {len(tensors)} tensors, bitwise: {not bad}")


def import_foreign(cname, keys, work, orig, deck, fails):
    """A folder written here as other tools write them, not by trident: GPT-2 in F16 without
    the "transformer." prefix (openai-community/gpt2's spelling), with the attn.bias and
    attn.masked_bias buffers and the tied lm_head.weight saved; Llama in BF16 (the tied one
    in F16, its lm_head.weight saved too) with rotary_emb.inv_freq buffers, in two shards and
    an index made by hand. Imported, it must hold exactly the rounded weights, and
    `trident grad` on it must agree with the Hugging Face-convention model of the folder."""
    arch = keys.get("arch", "gpt2")
    tied = arch == "gpt2" or keys.get("tie_embeddings", False)
    dtype = "F16" if tied else "BF16"
    want, _ = model_group(orig)
    rounded = {n: a.astype(np.float16).astype(np.float32) if dtype == "F16" else bf16_round(a)
               for n, a in want.items()}
    folder = os.path.join(work, "foreign")
    os.makedirs(folder)
    T, L = keys["seq_len"], keys["n_layer"]
    if arch == "gpt2":
        tensors = {(n + ".weight" if n in ("wte", "wpe") else n): a for n, a in want.items()}
        for i in range(L):
            tensors[f"h.{i}.attn.bias"] = (np.tril(np.ones((T, T), np.float32))[None, None], "F32")
            tensors[f"h.{i}.attn.masked_bias"] = (np.array(-1e4, np.float32), "F32")
        tensors["lm_head.weight"] = want["wte"]
        write_safetensors(os.path.join(folder, "model.safetensors"), tensors, dtype)
        config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                  "vocab_size": keys["vocab_size"], "n_positions": T, "n_ctx": T,
                  "n_embd": keys["d_model"], "n_layer": L, "n_head": keys["n_head"],
                  "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
                  "torch_dtype": "float16"}
    else:
        tensors = dict(want)
        hd = keys["d_model"] // keys["n_head"]
        theta = keys.get("rope_theta", 10000.0)
        for i in range(L):
            tensors[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = (
                1.0 / theta ** (np.arange(0, hd, 2) / hd), "F32")
        if tied:
            tensors["lm_head.weight"] = want["model.embed_tokens.weight"]
        first = {n for n in tensors if "layers.0." in n or "embed" in n}
        parts = {"model-00001-of-00002.safetensors": {n: tensors[n] for n in first},
                 "model-00002-of-00002.safetensors": {n: a for n, a in tensors.items()
                                                      if n not in first}}
        wmap = {}
        for fn, part in parts.items():
            write_safetensors(os.path.join(folder, fn), part, dtype)
            wmap.update({n: fn for n in part})
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": wmap}, f)
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                  "vocab_size": keys["vocab_size"], "hidden_size": keys["d_model"],
                  "intermediate_size": keys["ffn_hidden"], "num_hidden_layers": L,
                  "num_attention_heads": keys["n_head"],
                  "num_key_value_heads": keys.get("n_kv_head", keys["n_head"]),
                  "max_position_embeddings": 4096, "rms_norm_eps": keys.get("norm_eps", 1e-5),
                  "rope_theta": theta, "tie_word_embeddings": tied, "hidden_act": "silu"}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    tag = f"{cname} foreign {dtype}"
    back = os.path.join(work, "foreign.h5")
    oc.run_trident(NAME, ["convert", "--from", folder, "--to", back, "--seq-len", T], work)
    got, _ = model_group(back)
    bad = [n for n in want if n not in got or not same_bits(got[n], rounded[n])]
    fails.check(not bad and set(got) == set(want), f"{tag}: imported weights differ from the "
                f"{dtype} values: {bad}")
    print(f"  {tag}: imported bitwise equal to the {dtype} weights: {not bad}")
    gpath = os.path.join(work, "grad-foreign.h5")
    oc.run_trident(NAME, ["grad", deck, "--weights", back, "--batch",
                          os.path.join(work, "batch.h5"), "--out", gpath], work)
    with h5py.File(gpath, "r") as f:
        loss = float(f.attrs["loss"])
        grads = {n: f["grad"][n][...] for n in f["grad"]}
        with h5py.File(os.path.join(work, "batch.h5"), "r") as b:
            inputs, targets = b["inputs"][...].astype(np.int64), b["targets"][...].astype(np.int64)
    _, ref_loss, ref_grads = hf_loss_and_grads(folder, inputs, targets)
    rel = abs(loss - ref_loss) / abs(ref_loss)
    print(f"  {tag}: loss trident {loss:.10f}  HF-convention torch(float64) {ref_loss:.10f}"
          f"  rel {rel:.2e}")
    fails.check(rel <= LOSS_TOL, f"{tag}: loss {loss:.10g} vs {ref_loss:.10g}: rel {rel:.2e}")
    mapped = {trident_name(n, arch): g for n, g in ref_grads.items()}
    worst = oc.compare_tensors(np, grads, {n: g for n, g in mapped.items() if n in grads},
                               GRAD_TOL, fails, f"{tag}: gradient")
    print(f"  worst gradient max|d|/max|ref| = {worst:.2e} (tolerance {GRAD_TOL:g})")


def main():
    fails = oc.Failures(NAME)
    for i, (cname, keys) in enumerate(CASES.items()):
        work, orig, deck = run_case(cname, keys, fails, seed=31 + i)
        import_foreign(cname, keys, work, orig, deck, fails)
    train_from_import(fails)
    return fails.report()


if __name__ == "__main__":
    sys.exit(main())
