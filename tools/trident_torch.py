"""trident_torch — trident's GPT-2 in PyTorch, exactly as FORMAT.md defines it, and the HDF5 files
trident reads and writes (weights, batches, gradient dumps), read and written with h5py.

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

Dimension legend: B batch, T seq_len, C d_model, NH n_head, HD head_dim = C / NH, V vocab_size.

defines: Config, GPT, param_shapes, decays, init_model, load_weights, save_weights,
         read_batch, write_batch, read_grads, write_grads, lr_at, make_adamw, train_step,
         toml_text, write_deck
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
LN_EPS = 1e-5


@dataclass
class Config:
    vocab_size: int
    seq_len: int
    n_layer: int
    n_head: int
    d_model: int

    @property
    def head_dim(self):
        return self.d_model // self.n_head


def param_shapes(cfg):
    """FORMAT.md's tensor table, in order: name -> logical shape."""
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


def init_model(cfg, seed=1234, dtype=torch.float32):
    """GPT-2's initialization (the same distributions as trident's, not the same numbers):
    normal(0, 0.02) for wte, wpe and c_attn/c_fc weights, 0.02/sqrt(2*n_layer) for the two
    residual projections, zero biases, LayerNorm weight 1 and bias 0."""
    model = GPT(cfg).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    std_proj = 0.02 / math.sqrt(2 * cfg.n_layer)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
                p.fill_(1.0)
            elif p.dim() == 1:
                p.zero_()
            else:
                std = std_proj if name.endswith("c_proj.weight") else 0.02
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * std)
    return model


def _config_from_attrs(attrs, path):
    missing = [k for k in MODEL_ATTRS if k not in attrs]
    if missing:
        raise ValueError(f"{path}: missing root attribute(s) {', '.join(missing)}")
    return Config(**{k: int(attrs[k]) for k in MODEL_ATTRS})


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
    model = GPT(cfg).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(tensors[name]))
    return cfg, model


def _write_model_attrs(f, cfg):
    for k in MODEL_ATTRS:
        f.attrs[k] = np.int64(getattr(cfg, k))


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
