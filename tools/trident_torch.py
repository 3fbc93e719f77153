"""trident_torch — trident's models in PyTorch (GPT-2, and Llama with model.arch = "llama"), exactly
as FORMAT.md defines them, and the HDF5 files trident reads and writes (weights, batches, gradient
dumps), read and written with h5py.

It is the independent oracle of test/oracle and the peer of bench/, and handy on its own:
load a trident weights file or checkpoint into torch, look at it, train it, save it back.

    import trident_torch as tt
    cfg, model = tt.load_weights("w.h5", dtype=torch.float64)
    inputs, targets = tt.read_batch("batch.h5")
    loss = model(inputs, targets)

The model (FORMAT.md, "The model"): learned wte [V, C] and wpe [T, C]; n_layer pre-LN blocks
x += attn(ln_1(x)); x += mlp(ln_2(x)); causal multi-head attention with biases scaled by
1/sqrt(head_dim); MLP c_proj(gelu_tanh(c_fc(x))) with hidden 4C; ln_f; LM head tied to wte;
LayerNorm eps 1e-5; loss = mean cross-entropy over every target. No dropout.
Linear weights are stored [in, out] (GPT-2's Conv1D): y = x @ W + b. c_attn's 3C output columns
are q, then k, then v, each head-major (head 0's head_dim columns, then head 1's...).

The Llama model (FORMAT.md, model.arch = "llama"), written from the definitions (Touvron et al.
2023; Hugging Face's LlamaForCausalLM): token embedding only (no wpe); n_layer pre-norm blocks
x += attn(rmsnorm(x)); x += mlp(rmsnorm(x)); RMSNorm x / sqrt(mean(x^2) + norm_eps) * w; causal
attention with n_head query heads and n_kv_head key/value heads (query head h reads kv head
h // (n_head / n_kv_head), i.e. kv heads repeated as Hugging Face's repeat_kv does), rotary
position embedding on q and k in the rotate_half layout with base rope_theta; MLP
down(silu(gate(x)) * up(x)) with ffn_hidden; final RMSNorm; untied lm_head [V, C] unless
tie_embeddings. No biases anywhere. Linear weights are stored as Hugging Face stores them,
[out, in] (y = x @ W^T), under Hugging Face's names, so a trident Llama file is a
LlamaForCausalLM state dict.

Dimension legend: B batch, T seq_len, C d_model, NH n_head, HD head_dim = C / NH, V vocab_size,
NKV n_kv_head, F ffn_hidden.

defines: Config, GPT, Llama, llama_ffn_hidden, rope_cos_sin, param_shapes, decays, init_model,
         load_weights, save_weights, read_batch, write_batch, read_grads, write_grads, lr_at,
         make_adamw, train_step, toml_text, write_deck
"""

import math
from collections import OrderedDict
from dataclasses import dataclass

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

MODEL_ATTRS = ("vocab_size", "seq_len", "n_layer", "n_head", "d_model")
# Root attributes of a Llama file besides MODEL_ATTRS and arch = "llama" (a GPT-2 file has
# none of these and no arch: it reads as "gpt2").
LLAMA_INT_ATTRS = ("n_kv_head", "ffn_hidden", "tie_embeddings")
LLAMA_FLOAT_ATTRS = ("rope_theta", "norm_eps")
LN_EPS = 1e-5


def llama_ffn_hidden(d_model, multiple_of=256):
    """Llama's MLP width: 2/3 of 4 * d_model, rounded up to a multiple of multiple_of."""
    hidden = int(2 * 4 * d_model / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass
class Config:
    vocab_size: int
    seq_len: int
    n_layer: int
    n_head: int
    d_model: int
    arch: str = "gpt2"
    # llama only (ignored for gpt2); n_kv_head 0 and ffn_hidden 0 mean n_head and
    # llama_ffn_hidden(d_model)
    n_kv_head: int = 0
    ffn_hidden: int = 0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False

    def __post_init__(self):
        if self.arch == "llama":
            self.n_kv_head = self.n_kv_head or self.n_head
            self.ffn_hidden = self.ffn_hidden or llama_ffn_hidden(self.d_model)

    @property
    def head_dim(self):
        return self.d_model // self.n_head


def param_shapes(cfg):
    """FORMAT.md's tensor table, in order: name -> logical shape."""
    if cfg.arch == "llama":
        return _llama_shapes(cfg)
    C, V, T = cfg.d_model, cfg.vocab_size, cfg.seq_len
    shapes = OrderedDict()
    shapes["wte"] = (V, C)
    shapes["wpe"] = (T, C)
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        shapes[p + "ln_1.weight"] = (C,)
        shapes[p + "ln_1.bias"] = (C,)
        shapes[p + "attn.c_attn.weight"] = (C, 3 * C)
        shapes[p + "attn.c_attn.bias"] = (3 * C,)
        shapes[p + "attn.c_proj.weight"] = (C, C)
        shapes[p + "attn.c_proj.bias"] = (C,)
        shapes[p + "ln_2.weight"] = (C,)
        shapes[p + "ln_2.bias"] = (C,)
        shapes[p + "mlp.c_fc.weight"] = (C, 4 * C)
        shapes[p + "mlp.c_fc.bias"] = (4 * C,)
        shapes[p + "mlp.c_proj.weight"] = (4 * C, C)
        shapes[p + "mlp.c_proj.bias"] = (C,)
    shapes["ln_f.weight"] = (C,)
    shapes["ln_f.bias"] = (C,)
    return shapes


def _llama_shapes(cfg):
    """Hugging Face LlamaForCausalLM's names; linear weights [out, in] as nn.Linear stores them."""
    C, V, HD, F = cfg.d_model, cfg.vocab_size, cfg.head_dim, cfg.ffn_hidden
    Q, KV = cfg.n_head * HD, cfg.n_kv_head * HD
    shapes = OrderedDict()
    shapes["model.embed_tokens.weight"] = (V, C)
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (C,)
        shapes[p + "self_attn.q_proj.weight"] = (Q, C)
        shapes[p + "self_attn.k_proj.weight"] = (KV, C)
        shapes[p + "self_attn.v_proj.weight"] = (KV, C)
        shapes[p + "self_attn.o_proj.weight"] = (C, Q)
        shapes[p + "post_attention_layernorm.weight"] = (C,)
        shapes[p + "mlp.gate_proj.weight"] = (F, C)
        shapes[p + "mlp.up_proj.weight"] = (F, C)
        shapes[p + "mlp.down_proj.weight"] = (C, F)
    shapes["model.norm.weight"] = (C,)
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (V, C)
    return shapes


def decays(name, shape):
    """AdamW weight decay applies to 2-D weights (wte, wpe, linears), not biases or LayerNorms."""
    return len(shape) == 2


class Conv1D(nn.Module):
    """GPT-2's linear layer: weight [in, out], y = x @ W + b."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(
            *x.shape[:-1], self.weight.shape[1])


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = Conv1D(cfg.d_model, 3 * cfg.d_model)
        self.c_proj = Conv1D(cfg.d_model, cfg.d_model)

    def forward(self, x):  # x (B, T, C)
        B, T, C = x.shape
        NH, HD = self.n_head, C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)           # each (B, T, C), head-major columns
        q = q.view(B, T, NH, HD).transpose(1, 2)            # (B, NH, T, HD)
        k = k.view(B, T, NH, HD).transpose(1, 2)
        v = v.view(B, T, NH, HD).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HD))  # (B, NH, T, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)      # heads side by side again
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = Conv1D(cfg.d_model, 4 * cfg.d_model)
        self.c_proj = Conv1D(4 * cfg.d_model, cfg.d_model)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=LN_EPS)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=LN_EPS)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """named_parameters() yields exactly FORMAT.md's names, in FORMAT.md's order."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Parameter(torch.zeros(cfg.vocab_size, cfg.d_model))
        self.wpe = nn.Parameter(torch.zeros(cfg.seq_len, cfg.d_model))
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=LN_EPS)

    def logits(self, inputs):  # inputs (B, T) integer -> (B, T, V)
        T = inputs.shape[1]
        x = self.wte[inputs.long()] + self.wpe[:T]
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.t()  # tied LM head

    def forward(self, inputs, targets=None):
        """Logits if targets is None, else the mean cross-entropy over every target."""
        logits = self.logits(inputs)
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.long().reshape(-1))


def rope_cos_sin(positions, head_dim, theta, dtype=torch.float64):
    """cos and sin [len(positions), head_dim] of the rotary embedding, as Hugging Face's
    LlamaRotaryEmbedding (inv_freq = theta^(-2i/HD), emb = cat(freqs, freqs)), formed in float64."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.outer(torch.as_tensor(positions, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _linear(n_in, n_out):
    return nn.Linear(n_in, n_out, bias=False)  # weight [out, in]


class LlamaAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        HD = cfg.head_dim
        self.q_proj = _linear(cfg.d_model, cfg.n_head * HD)
        self.k_proj = _linear(cfg.d_model, cfg.n_kv_head * HD)
        self.v_proj = _linear(cfg.d_model, cfg.n_kv_head * HD)
        self.o_proj = _linear(cfg.n_head * HD, cfg.d_model)

    def forward(self, x, cos, sin, cache=None):
        """x (B, T, C); cos, sin (T, HD) for x's positions. cache: None, or a dict that keeps
        the rotated k and v of earlier calls (key-value cache: x is then the new tokens only)."""
        B, T, _ = x.shape
        NH, NKV, HD = self.cfg.n_head, self.cfg.n_kv_head, self.cfg.head_dim
        q = self.q_proj(x).view(B, T, NH, HD).transpose(1, 2)    # (B, NH, T, HD)
        k = self.k_proj(x).view(B, T, NKV, HD).transpose(1, 2)   # (B, NKV, T, HD)
        v = self.v_proj(x).view(B, T, NKV, HD).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        S = k.shape[2]                                            # keys: earlier + these
        k = k.repeat_interleave(NH // NKV, dim=1)                 # query head h -> kv h // rep
        v = v.repeat_interleave(NH // NKV, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HD))   # (B, NH, T, S)
        causal = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * HD)
        return self.o_proj(y)


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = _linear(cfg.d_model, cfg.ffn_hidden)
        self.up_proj = _linear(cfg.d_model, cfg.ffn_hidden)
        self.down_proj = _linear(cfg.ffn_hidden, cfg.d_model)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x, cos, sin, cache=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(LlamaLayer(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)


class Llama(nn.Module):
    """named_parameters() yields exactly FORMAT.md's Llama names, in FORMAT.md's order."""

    def __init__(self, cfg):
        super().__init__()
        assert cfg.arch == "llama" and cfg.n_head % cfg.n_kv_head == 0 and cfg.head_dim % 2 == 0
        self.cfg = cfg
        self.model = LlamaBody(cfg)
        if not cfg.tie_embeddings:
            self.lm_head = _linear(cfg.d_model, cfg.vocab_size)  # weight [V, C]

    def head_weight(self):
        return self.model.embed_tokens.weight if self.cfg.tie_embeddings else self.lm_head.weight

    def logits(self, inputs, pos0=0, caches=None):
        """inputs (B, T) at positions pos0..pos0+T-1 -> (B, T, V); caches: one dict per layer
        (see LlamaAttention) to generate token by token."""
        T = inputs.shape[1]
        x = self.model.embed_tokens(inputs.long())
        cos, sin = rope_cos_sin(range(pos0, pos0 + T), self.cfg.head_dim, self.cfg.rope_theta,
                                x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, None if caches is None else caches[i])
        return self.model.norm(x) @ self.head_weight().t()

    def forward(self, inputs, targets=None):
        """Logits if targets is None, else the mean cross-entropy over every target."""
        logits = self.logits(inputs)
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.long().reshape(-1))


def make_model(cfg):
    return Llama(cfg) if cfg.arch == "llama" else GPT(cfg)


def init_model(cfg, seed=1234, dtype=torch.float32):
    """GPT-2's initialization (the same distributions as trident's, not the same numbers):
    normal(0, 0.02) for wte, wpe and c_attn/c_fc weights, 0.02/sqrt(2*n_layer) for the two
    residual projections, zero biases, LayerNorm weight 1 and bias 0."""
    model = make_model(cfg).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    std_proj = 0.02 / math.sqrt(2 * cfg.n_layer)
    residual = ("c_proj.weight", "o_proj.weight", "down_proj.weight")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "layernorm.weight", "norm.weight")) \
                    or name == "ln_f.weight":
                p.fill_(1.0)
            elif p.dim() == 1:
                p.zero_()
            else:
                std = std_proj if name.endswith(residual) else 0.02
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * std)
    return model


def _config_from_attrs(attrs, path):
    missing = [k for k in MODEL_ATTRS if k not in attrs]
    arch = attrs.get("arch", "gpt2")
    arch = arch.decode() if isinstance(arch, bytes) else str(arch)
    if arch == "llama":
        missing += [k for k in LLAMA_INT_ATTRS + LLAMA_FLOAT_ATTRS if k not in attrs]
    elif arch != "gpt2":
        raise ValueError(f"{path}: root attribute arch = {arch!r}, expected 'gpt2' or 'llama'")
    if missing:
        raise ValueError(f"{path}: missing root attribute(s) {', '.join(missing)}")
    keys = {k: int(attrs[k]) for k in MODEL_ATTRS}
    if arch == "llama":
        keys.update({k: int(attrs[k]) for k in LLAMA_INT_ATTRS})
        keys.update({k: float(attrs[k]) for k in LLAMA_FLOAT_ATTRS})
        keys["tie_embeddings"] = bool(keys["tie_embeddings"])
    return Config(arch=arch, **keys)


def _read_tensors(group, cfg, path, where):
    out = OrderedDict()
    for name, shape in param_shapes(cfg).items():
        if name not in group:
            raise ValueError(f"{path}: missing dataset {where}/{name}")
        ds = group[name]
        if tuple(ds.shape) != shape:
            raise ValueError(f"{path}: {where}/{name} has shape {tuple(ds.shape)}, expected {shape}")
        out[name] = np.asarray(ds[...])
    return out


def load_weights(path, dtype=torch.float32):
    """A weights file or a checkpoint (anything with /model and the model attributes) ->
    (Config, GPT in `dtype`)."""
    with h5py.File(path, "r") as f:
        cfg = _config_from_attrs(f.attrs, path)
        tensors = _read_tensors(f["model"], cfg, path, "/model")
    model = make_model(cfg).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(tensors[name]))
    return cfg, model


def _write_model_attrs(f, cfg):
    for k in MODEL_ATTRS:
        f.attrs[k] = np.int64(getattr(cfg, k))
    if cfg.arch == "llama":  # a GPT-2 file stays as it always was
        f.attrs["arch"] = "llama"
        for k in LLAMA_INT_ATTRS:
            f.attrs[k] = np.int64(getattr(cfg, k))
        for k in LLAMA_FLOAT_ATTRS:
            f.attrs[k] = np.float64(getattr(cfg, k))


def save_weights(model, path):
    """FORMAT.md's weights file: float32 datasets under /model, format attributes at the root."""
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "trident-weights"
        f.attrs["format_version"] = np.int64(1)
        _write_model_attrs(f, model.cfg)
        g = f.create_group("model")
        for name, p in model.named_parameters():
            g.create_dataset(name, data=p.detach().cpu().numpy().astype(np.float32))


def read_batch(path):
    """A batch file -> (inputs, targets), int64 tensors [batch, seq_len]."""
    with h5py.File(path, "r") as f:
        inputs, targets = np.asarray(f["inputs"][...]), np.asarray(f["targets"][...])
    if inputs.shape != targets.shape or inputs.ndim != 2:
        raise ValueError(f"{path}: /inputs {inputs.shape} and /targets {targets.shape} must be "
                         "the same [batch, seq_len]")
    return torch.from_numpy(inputs.astype(np.int64)), torch.from_numpy(targets.astype(np.int64))


def write_batch(path, inputs, targets):
    """FORMAT.md's batch file: /inputs, /targets int32 [batch, seq_len]."""
    inputs, targets = np.asarray(inputs), np.asarray(targets)
    assert inputs.shape == targets.shape and inputs.ndim == 2
    with h5py.File(path, "w") as f:
        f.create_dataset("inputs", data=inputs.astype(np.int32))
        f.create_dataset("targets", data=targets.astype(np.int32))


def read_grads(path, cfg):
    """A gradient dump (`trident grad`) -> (loss float, OrderedDict name -> np.ndarray)."""
    with h5py.File(path, "r") as f:
        if "loss" not in f.attrs:
            raise ValueError(f"{path}: missing root attribute loss")
        loss = float(f.attrs["loss"])
        if "grad" not in f:
            raise ValueError(f"{path}: missing group /grad")
        grads = _read_tensors(f["grad"], cfg, path, "/grad")
    return loss, grads


def write_grads(path, model, loss):
    """A gradient dump as `trident grad` writes it, from model's .grad (float32 under /grad)."""
    with h5py.File(path, "w") as f:
        f.attrs["loss"] = np.float64(loss)
        _write_model_attrs(f, model.cfg)
        g = f.create_group("grad")
        for name, p in model.named_parameters():
            g.create_dataset(name, data=p.grad.detach().cpu().numpy().astype(np.float32))


def lr_at(step, lr, min_lr, warmup_steps, steps):
    """Learning rate of optimizer step `step` (1-based): linear warm-up to lr over warmup_steps,
    then cosine decay to min_lr at `steps`."""
    if step <= warmup_steps:
        return lr * step / warmup_steps
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    progress = min(progress, 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def make_adamw(model, lr, beta1, beta2, eps, weight_decay):
    """torch.optim.AdamW with trident's two groups: decay on 2-D weights only."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if decays(name, p.shape) else no_decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(beta1, beta2), eps=eps)


def train_step(model, opt, inputs, targets, lr, grad_clip):
    """One optimizer step on one global batch: returns (loss, grad norm before clipping)."""
    opt.zero_grad(set_to_none=True)
    loss = model(inputs, targets)
    loss.backward()
    params = [p for p in model.parameters()]
    if grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    else:
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    return float(loss), float(norm)


def toml_text(deck):
    """{section: {key: value}} -> TOML text (the small subset decks use)."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, np.integer)):
            return str(int(v))
        if isinstance(v, float):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(f"unsupported TOML value {v!r}")
    lines = []
    for section, keys in deck.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {value(v)}" for k, v in keys.items()]
        lines.append("")
    return "\n".join(lines)


def write_deck(path, deck):
    with open(path, "w") as f:
        f.write(toml_text(deck))
