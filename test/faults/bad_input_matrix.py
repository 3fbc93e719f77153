#!/usr/bin/python3
"""faults.bad_input: a matrix of bad input over every entry point of trident: the deck
(syntax, unknown keys, types, ranges, every divisibility rule of every parallel
dimension), the command line, every HDF5 file the program reads (data.train, data.valid,
io.init_weights, io.resume, the batch file of `grad`, `sample --checkpoint`), the Hugging
Face folders and options of `convert` (damaged safetensors headers, config.json), the world
size against the deck, and the environment (unwritable out_dir, a full disk).

Each case runs trident once, directly (one rank) or under `mpirun -np N`, in its own fresh
folder `$TRIDENT_TEST_OUT/faults.bad_input/<case>/`, whose `run/` (the decks' io.out_dir)
already holds a sentinel from an earlier run (metrics.h5, config.toml and a checkpoint).
A case passes when:
  - the exit status is non-zero (and not a signal),
  - exactly one line of stdout + stderr starts with `trident: error:`, and it names every
    needle of the case (the key or file, and what was expected; case-insensitive),
  - a one-rank run writes nothing else to stderr but trident's warnings and notes; under
    mpirun no other line starts with `trident:` (warnings and notes aside; mpirun's own
    banners are allowed),
  - every process of the case (mpirun and all ranks, found by an environment marker) is gone
    within CASE_TIMEOUT_S seconds of the start (else they are killed and the case fails),
  - every file that existed in `run/` before is byte-for-byte the same after (the cases
    that legitimately append to metrics.h5 check that its earlier rows survive instead).
Prints a table (case, ranks, ok/FAIL, seconds, error line) and exits 1 if any case failed.

Usage: TRIDENT=build/trident TRIDENT_TEST_OUT=/tmp/out test/faults/bad_input_matrix.py [CASE...]
       (a CASE ending in '*' selects by prefix; --list prints the case names)
defines: CASES, Ctx, run_case, main
"""

import functools
import hashlib
import multiprocessing
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

TEST = "faults.bad_input"
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CASE_TIMEOUT_S = 10
WORKERS = 4  # cases at once: each mostly waits on mpirun's start-up (0.3 s CPU in 2.5 s)
PREFIX = "trident: error:"
# Lines that may come besides the error: trident's own warnings and notes (e.g. about the
# machine); they depend on the CPU and its environment, which no case may.
ALLOWED = ("trident: warning:", "trident: note:")

# A model small enough that anything that gets as far as computing finishes at once; 2
# layers and 2 heads leave room for pp = 2 and tp = 2; 4 sequences for dp up to 4.
TINY = dict(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=8)
BASE_DECK = {
    "model": dict(TINY),
    "parallel": {"micro_batch_size": 1},
    "train": {"steps": 1, "warmup_steps": 0, "global_batch_size": 4},
    "data": {"train": "tokens.h5"},
    # overwrite: the sentinel is another run's out_dir; a case must fail before deleting it
    "io": {"out_dir": "run", "resume": "none", "overwrite": True},
}
SENTINEL_STEP = 2
SENTINEL_CKPT = f"checkpoints/step-{SENTINEL_STEP:08d}.h5"


class Raw(str):
    """A TOML value written as is (nan, arrays, inline tables...)."""


def toml_value(v):
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise TypeError(v)


def render_deck(overrides=None):
    """BASE_DECK with overrides {"section.key": value} (None removes the key) as TOML."""
    deck = {s: dict(k) for s, k in BASE_DECK.items()}
    for full, v in (overrides or {}).items():
        section, key = full.split(".", 1)
        deck.setdefault(section, {})
        if v is None:
            deck[section].pop(key, None)
        else:
            deck[section][key] = v
    out = []
    for section, keys in deck.items():
        out.append(f"[{section}]")
        out += [f"{k} = {toml_value(v)}" for k, v in keys.items()]
        out.append("")
    return "\n".join(out)


# --- files ----------------------------------------------------------------------------------

def write_tokens(path, ids=None, vocab_size=16, dtype=np.uint16, tokenizer="byte", attrs=None):
    """A token dataset (FORMAT.md); `attrs` replaces or (None) removes root attributes."""
    if ids is None:
        ids = np.arange(512) % vocab_size
    with h5py.File(path, "w") as f:
        f.create_dataset("tokens", data=np.asarray(ids).astype(dtype))
        f.attrs["vocab_size"] = np.int64(vocab_size)
        f.attrs["tokenizer"] = tokenizer
        for k, v in (attrs or {}).items():
            if v is None:
                del f.attrs[k]
            else:
                f.attrs[k] = v
    return os.path.basename(path)


def truncate_file(path, keep=0.5):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def snapshot(root):
    """{relative path: sha256} of every regular file under root."""
    out = {}
    if not os.path.isdir(root):
        return out
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            if os.path.isfile(p) and not os.path.islink(p):
                out[os.path.relpath(p, root)] = sha256(p)
    return out


class Ctx:
    """What a case's setup gets: its folder, the fixtures, and helpers that write files."""

    def __init__(self, d, fixtures):
        self.d = d
        self.fixtures = fixtures
        self.env = {}            # extra environment for the run
        self.preexec = None      # run in the child before exec (limits, user)
        self.cleanups = []       # called after the run, whatever happened (unmount...)
        self.out_dir = os.path.join(d, "run")
        self.mutable = set()     # sentinel files the case may legitimately change
        self.after = None        # extra check after the run: returns a problem or None
        self.wrapper = []        # runs each rank as wrapper + [trident, ...]
        self.mpi_lines = ()      # prefixes of MPI's own stderr lines a one-rank case may show

    def path(self, name):
        return os.path.join(self.d, name)

    def deck(self, overrides=None, name="deck.toml"):
        with open(self.path(name), "w") as f:
            f.write(render_deck(overrides))
        return name

    def text(self, name, content):
        with open(self.path(name), "wb" if isinstance(content, bytes) else "w") as f:
            f.write(content)
        return name

    def copy(self, fixture, name=None):
        name = name or fixture
        shutil.copyfile(os.path.join(self.fixtures, fixture), self.path(name))
        return name

    def h5_edit(self, fixture, name, fn):
        """Copies a fixture and lets fn(h5py.File) change it in place."""
        self.copy(fixture, name)
        with h5py.File(self.path(name), "r+") as f:
            fn(f)
        return name

    def train(self, overrides=None, name="deck.toml"):
        """argv of `train` on the tiny deck with overrides (the usual case)."""
        return ["train", self.deck(overrides, name)]


# --- the cases ------------------------------------------------------------------------------
# Each: name, ranks (1: run directly; N: mpirun -np N), setup(ctx) -> argv after $TRIDENT,
# needles the error line must contain.

CASES = []


def case(name, needles, np=1):
    def register(fn):
        CASES.append((name, np, fn, needles))
        return fn
    return register


def deck_case(name, overrides, needles, np=1):
    CASES.append((name, np, lambda c: c.train(overrides), needles))


def raw_deck_case(name, text, needles, np=1):
    def setup(c):
        c.text("deck.toml", text)
        return ["train", "deck.toml"]
    CASES.append((name, np, setup, needles))


# -- the command line (bad_input.py has: no deck, missing deck, --set syntax, --set unknown
#    key, unknown subcommand) --

@case("cli_missing_required_option", ["--out"])
def _(c):
    return ["grad", c.deck(), "--weights", c.copy("weights.h5"), "--batch", c.copy("batch.h5")]


@case("cli_unknown_option", ["--frobnicate"])
def _(c):
    return ["train", c.deck(), "--frobnicate", "3"]


@case("cli_option_not_a_number", ["--pp", "zero"])
def _(c):
    return ["schedule", "--schedule", "1f1b", "--pp", "zero", "--microbatches", "4"]


@case("cli_option_not_positive", ["--tp", "0"])
def _(c):
    return ["grid", "--tp", "0", "--pp", "1", "--dp", "1"]


@case("cli_step_steps_zero", ["--steps", "0"])
def _(c):
    return ["step", c.deck(), "--weights", c.copy("weights.h5"), "--batch", c.copy("batch.h5"),
            "--steps", "0", "--out", "w2.h5"]


@case("cli_unknown_schedule", ["2f2b"])
def _(c):
    return ["schedule", "--schedule", "2f2b", "--pp", "2", "--microbatches", "4"]


@case("cli_bad_tokenizer", ["--tokenizer", "bpe"])
def _(c):
    return ["prepare-data", "--input", c.text("corpus.txt", "hello\n" * 50), "--output",
            "out.h5", "--tokenizer", "bpe"]


@case("cli_set_wrong_type", ["--set", "model.n_layer", "integer", "two"])
def _(c):
    return ["train", c.deck(), "--set", "model.n_layer=two"]


@case("cli_set_out_of_range", ["--set", "parallel.micro_batch_size", ">= 1"])
def _(c):
    return ["train", c.deck(), "--set", "parallel.micro_batch_size=0"]


@case("cli_deck_is_directory", ["somedir", "directory"])
def _(c):
    os.makedirs(c.path("somedir"))
    return ["train", "somedir"]


@case("prepare_data_input_missing", ["--input", "no_corpus.txt"])
def _(c):
    return ["prepare-data", "--input", "no_corpus.txt", "--output", "out.h5"]


@case("prepare_data_input_empty", ["--input", "empty.txt", "empty"])
def _(c):
    return ["prepare-data", "--input", c.text("empty.txt", ""), "--output", "out.h5"]


@case("prepare_data_byte_vocab_size", ["--vocab-size", "1000", "256"])
def _(c):
    return ["prepare-data", "--input", c.text("corpus.txt", "hello\n" * 50), "--output",
            "out.h5", "--vocab-size", "1000"]


@case("prepare_data_sentencepiece_no_vocab", ["--tokenizer sentencepiece", "--vocab-size"])
def _(c):
    return ["prepare-data", "--input", c.text("corpus.txt", "hello\n" * 50), "--output",
            "out.h5", "--tokenizer", "sentencepiece"]


@case("prepare_data_output_under_a_file", ["afile", "cannot create"])
def _(c):
    c.text("afile", "not a directory\n")
    return ["prepare-data", "--input", c.text("corpus.txt", "hello\n" * 50), "--output",
            "afile/out.h5"]


@case("prepare_data_tokenizer_model_missing", ["--tokenizer-model", "no.model"])
def _(c):
    return ["prepare-data", "--input", c.text("corpus.txt", "hello\n" * 50), "--output", "out.h5",
            "--tokenizer-model", "no.model"]


@case("prepare_data_tokenizer_model_not_a_model", ["--tokenizer-model", "bad.model"])
def _(c):
    return ["prepare-data", "--input", c.text("corpus.txt", "hello\n" * 50), "--output", "out.h5",
            "--tokenizer-model", c.text("bad.model", "not a protobuf")]


@case("prepare_data_jsonl_without_text", ["c.jsonl:2", "text"], np=2)
def _(c):
    c.after = lambda: "out.h5 was written" if os.path.exists(c.path("out.h5")) else None
    return ["prepare-data", "--input", c.text("c.jsonl", '{"text": "a"}\n{"body": "b"}\n'),
            "--output", "out.h5"]


@case("prepare_data_glob_matches_nothing", ["--input", "nothing-*.txt"])
def _(c):
    return ["prepare-data", "--input", "nothing-*.txt", "--output", "out.h5"]


# --- issue 32 (out_dir guard): an output that is an input is refused, the input intact --------
# (the inputs live in out_dir, whose files the runner checks are unchanged)

def _in_out_dir(c, name, content=None, fixture=None):
    os.makedirs(c.out_dir, exist_ok=True)
    p = os.path.join(c.out_dir, name)
    if fixture:
        shutil.copyfile(os.path.join(c.fixtures, fixture), p)
    else:
        with open(p, "w") as f:
            f.write(content)
    return p


@case("prepare_data_output_is_input", ["--output", "same file", "--input", "corpus.txt"])
def _(c):
    p = _in_out_dir(c, "corpus.txt", "hello\n" * 50)
    return ["prepare-data", "--input", p, "--output", p]


@case("prepare_data_output_links_to_input", ["--output", "same file", "--input"])
def _(c):
    p = _in_out_dir(c, "corpus.txt", "hello\n" * 50)
    os.symlink(p, c.path("link.h5"))
    return ["prepare-data", "--input", p, "--output", c.path("link.h5")]


@case("prepare_data_valid_output_is_input", ["--valid-output", "same file", "--input"])
def _(c):
    p = _in_out_dir(c, "corpus.txt", "hello\n" * 50)
    return ["prepare-data", "--input", p, "--output", c.path("out.h5"), "--valid-output", p]


@case("export_out_is_checkpoint", ["--out", "same file", "--checkpoint"])
def _(c):
    p = _in_out_dir(c, "ckpt.h5", fixture="ckpt.h5")
    return ["export", "--checkpoint", p, "--out", os.path.join(c.out_dir, "..", "run", "ckpt.h5")]

# --- end of issue 32 (out_dir guard) ----------------------------------------------------------


@case("sample_checkpoint_not_trident", ["tokens.h5", "format"])
def _(c):
    return ["sample", "--checkpoint", c.copy("tokens.h5"), "--tokens", "4"]


@case("sample_checkpoint_missing", ["no_ckpt.h5"])
def _(c):
    return ["sample", "--checkpoint", "no_ckpt.h5", "--tokens", "4"]


# -- deck syntax and keys (bad_input.py has: `= =`, runtime.threds) --

raw_deck_case("toml_duplicate_key", "[model]\nn_layer = 2\nn_layer = 3\n", ["deck.toml:3:", "n_layer"])
raw_deck_case("toml_unterminated_string", '[parallel]\nschedule = "1f1b\n', ["deck.toml:2:"])
raw_deck_case("toml_unclosed_table_header", "[model\nn_layer = 2\n", ["deck.toml:1:"])
raw_deck_case("toml_not_utf8", b'[model]\nn_layer = 2\n[io]\nout_dir = "r\xff\xfe"\n', ["deck.toml:4:"])
raw_deck_case("unknown_section", "[modle]\nn_layer = 2\n", ["deck.toml:1:", "[modle]", "[model]"])
raw_deck_case("key_outside_section", "n_layer = 2\n[model]\nd_model = 8\n",
              ["deck.toml:1:", "n_layer", "outside any section", "model.n_layer"])
raw_deck_case("key_in_wrong_section", "[train]\ntp = 2\n", ["deck.toml:2:", "train.tp", "parallel.tp"])
raw_deck_case("section_is_a_value", "model = 3\n", ["deck.toml:1:", "model", "table"])
raw_deck_case("key_is_a_table", "[model.n_layer]\nx = 1\n", ["deck.toml", "model.n_layer", "integer"])
raw_deck_case("deck_empty", "", ["deck.toml", "model.vocab_size", "data.train"])

# -- types (bad_input.py has: a string for model.n_layer) --

deck_case("type_bool_for_int", {"parallel.tp": True}, ["deck.toml:", "parallel.tp", "integer", "boolean"])
deck_case("type_float_for_int", {"model.n_layer": 2.5}, ["deck.toml:", "model.n_layer", "integer", "float"])
deck_case("type_string_for_float", {"train.lr": "fast"}, ["deck.toml:", "train.lr", "number", "string"])
deck_case("type_int_for_string", {"parallel.schedule": 3}, ["deck.toml:", "parallel.schedule", "string", "integer"])
deck_case("type_int_for_bool", {"parallel.sequence_parallel": 1},
          ["deck.toml:", "parallel.sequence_parallel", "boolean", "integer"])
deck_case("type_array_for_int", {"model.d_model": Raw("[8]")}, ["deck.toml:", "model.d_model", "array"])
deck_case("int_overflow", {"model.n_layer": 99999999999}, ["deck.toml:", "model.n_layer", "out of range"])

# -- ranges and enums, one key each (bad_input.py has: train.lr < 0, bf16 on cpu,
#    parallel.schedule) --

for _key, _value, _rule in [
    ("model.vocab_size", -1, ">= 0"),
    ("model.seq_len", 0, ">= 1"),
    ("model.n_layer", 0, ">= 1"),
    ("model.n_head", 0, ">= 1"),
    ("model.d_model", -8, ">= 1"),
    ("parallel.tp", 0, ">= 1"),
    ("parallel.pp", 0, ">= 1"),
    ("parallel.dp", -1, ">= 0"),
    ("parallel.vpp", 0, ">= 1"),
    ("parallel.micro_batch_size", 0, ">= 1"),
    ("parallel.zero_stage", 2, "0 or 1"),
    ("parallel.grad_bucket_mb", 0, "> 0"),
    ("train.on_nonfinite", "ignore", "abort or skip"),
    ("parallel.recompute", "some", "none, selective or full"),
    ("train.steps", 0, ">= 1"),
    ("train.global_batch_size", 0, ">= 1"),
    ("train.lr", Raw("nan"), "finite"),
    ("train.lr", Raw("inf"), "finite"),
    ("train.min_lr", -1e-5, ">= 0"),
    ("train.warmup_steps", -1, ">= 0"),
    ("train.weight_decay", -0.1, ">= 0"),
    ("train.beta1", 1.0, "[0, 1)"),
    ("train.beta2", -0.5, "[0, 1)"),
    ("train.eps", 0.0, "> 0"),
    ("train.grad_clip", -1.0, ">= 0"),
    ("train.seed", -1, ">= 0"),
    ("train.eval_every", -1, ">= 0"),
    ("train.eval_batches", 0, ">= 1"),
    ("io.out_dir", "", "a directory"),
    ("io.checkpoint_every", -1, ">= 0"),
    ("io.keep_checkpoints", -1, ">= 0"),
    ("io.resume", "", "auto"),
    ("runtime.device", "tpu", "cpu, cuda or cpu-guarded"),
    ("runtime.precision", "fp8", "fp32, tf32 or bf16"),
    ("runtime.threads", -2, ">= 0"),
]:
    _label = str(_value).replace("-", "neg").replace(".", "p").replace('"', "") or "empty"
    deck_case(f"range_{_key.replace('.', '_')}_{_label}", {_key: _value},
              ["deck.toml:", _key, _rule])

deck_case("rule_min_lr_above_lr", {"train.lr": 1e-4, "train.min_lr": 1e-3},
          ["deck.toml:", "train.min_lr", "train.lr"])
deck_case("rule_warmup_above_steps", {"train.warmup_steps": 5, "train.steps": 2},
          ["deck.toml:", "train.warmup_steps", "train.steps"])
deck_case("rule_tf32_on_cpu", {"runtime.precision": "tf32"},
          ["deck.toml:", "runtime.precision", "runtime.device", "cuda"])
deck_case("rule_vpp_needs_interleaved_schedule", {"parallel.vpp": 2},
          ["deck.toml:", "parallel.vpp", "parallel.schedule", "interleaved-1f1b"])

# Shapes no node holds (issue 32): refused from the start-up prediction before anything is
# allocated (they ended in std::bad_alloc or the OOM killer after 9-31 s), naming the keys.
deck_case("memory_d_model_1e6", {"model.d_model": 1000000, "model.n_head": 1},
          ["memory:", "model.d_model = 1000000", "available"], np=2)
deck_case("memory_n_layer_1e6", {"model.n_layer": 1000000, "model.d_model": 1024},
          ["memory:", "model.n_layer = 1000000", "available"])

# parallel.layout = "auto" (issue 32, elastic restarts): the planner chooses the layout keys,
# so one written too is refused (it would be ignored); a machine file needs "auto".
deck_case("range_parallel_layout_manual", {"parallel.layout": "manual"},
          ["deck.toml:", "parallel.layout", "deck or auto"])
deck_case("rule_layout_auto_with_micro_batch_size", {"parallel.layout": "auto"},
          ["deck.toml:", "parallel.micro_batch_size", 'parallel.layout = "auto"'])
deck_case("rule_machine_without_layout_auto", {"parallel.machine": "m.toml"},
          ["deck.toml:", "parallel.machine", '"auto"'])
deck_case("layout_auto_machine_missing", {"parallel.layout": "auto", "parallel.micro_batch_size": None,
                                          "parallel.machine": "nowhere.toml"},
          ["parallel.machine", "nowhere.toml", "not a file"], np=2)


@case("layout_auto_nothing_fits", ["no layout fits", "machine.memory_gib", "small.toml"], np=2)
def _(c):
    with open(os.path.join(SRC, "input", "machines", "h100-sxm-dgx.toml")) as f:
        text = re.sub(r"(?m)^memory_gib = .*$", "memory_gib = 0.000001", f.read())
    c.text("small.toml", text)
    return c.train({"parallel.layout": "auto", "parallel.micro_batch_size": None,
                    "parallel.machine": "small.toml"})

# -- divisibility of every parallel dimension, and the world size against the deck
#    (bad_input.py has: global_batch_size % micro_batch_size, d_model % n_head) --

deck_case("div_n_head_by_tp", {"parallel.tp": 4}, ["deck.toml:", "model.n_head = 2", "parallel.tp = 4"], np=4)
# n_layer need not divide pp * vpp (parallel.pipeline_layers, issue 29), but every virtual
# stage needs a layer.
deck_case("div_n_layer_fewer_than_pp", {"model.n_layer": 1, "parallel.pp": 2},
          ["deck.toml:", "model.n_layer = 1", "parallel.pp", "fewer than"], np=2)
# parallel.pipeline_layers: one count >= 1 per virtual stage, summing to n_layer.
deck_case("pipeline_layers_wrong_count", {"parallel.pp": 2, "parallel.pipeline_layers": Raw("[2]")},
          ["deck.toml:", "parallel.pipeline_layers = [2]", "expected 2 entries"])
deck_case("pipeline_layers_wrong_sum", {"parallel.pp": 2, "parallel.pipeline_layers": Raw("[1, 2]")},
          ["deck.toml:", "parallel.pipeline_layers", "sum to 3", "model.n_layer = 2"])
deck_case("pipeline_layers_zero", {"parallel.pp": 2, "parallel.pipeline_layers": Raw("[0, 2]")},
          ["deck.toml:", "parallel.pipeline_layers", "entry 0 is 0", ">= 1 layer"])
deck_case("pipeline_layers_not_integers",
          {"parallel.pp": 2, "parallel.pipeline_layers": Raw("[1.5, 0.5]")},
          ["deck.toml:", "parallel.pipeline_layers", "list of layer counts", "float"])
deck_case("pipeline_layers_unknown_word", {"parallel.pipeline_layers": "balanced"},
          ["deck.toml:", "parallel.pipeline_layers", '"auto"', '"balanced"'])
deck_case("div_n_layer_by_pp_vpp", {"parallel.pp": 2, "parallel.vpp": 2,
                                    "parallel.schedule": "interleaved-1f1b"},
          ["deck.toml:", "model.n_layer = 2", "parallel.pp * parallel.vpp"], np=2)
deck_case("div_seq_len_by_tp_sequence_parallel", {"model.seq_len": 9, "parallel.tp": 2,
                                                  "parallel.sequence_parallel": True},
          ["deck.toml:", "model.seq_len = 9", "parallel.tp = 2"], np=2)
# parallel.tp_mode = "2d" (issue 20): what the 2D model does not implement (here activation
# recompute) is refused by every rank with one line.
deck_case("tp_mode_2d_recompute", {"parallel.tp": 4, "parallel.tp_mode": "2d",
                                   "model.n_head": 4, "model.d_model": 16,
                                   "parallel.micro_batch_size": 2,
                                   "train.global_batch_size": 2,
                                   "parallel.recompute": "full"},
          ["deck.toml:", 'parallel.tp_mode = "2d" does not recompute activations',
           'expected parallel.recompute = "none"'], np=4)
deck_case("div_gbs_by_mbs_dp_auto", {"parallel.micro_batch_size": 2},
          ["deck.toml", "train.global_batch_size = 4", "parallel.micro_batch_size * parallel.dp",
           "2 * 4"], np=4)
deck_case("div_gbs_by_mbs_dp_explicit", {"parallel.dp": 2, "train.global_batch_size": 3},
          ["deck.toml", "train.global_batch_size = 3", "parallel.dp", "1 * 2"], np=2)
deck_case("world_not_divisible_by_tp_pp", {"parallel.tp": 2},
          ["deck.toml", "parallel.tp * parallel.pp", "world size 3"], np=3)
deck_case("world_smaller_than_tp", {"parallel.tp": 2},
          ["deck.toml", "parallel.tp * parallel.pp", "world size 1"], np=1)
deck_case("world_vs_tp_pp_dp", {"parallel.tp": 2, "parallel.dp": 2},
          ["deck.toml", "parallel.tp * parallel.pp * parallel.dp", "4 ranks", "world has 2"], np=2)
deck_case("world_vs_dp", {"parallel.dp": 4}, ["deck.toml", "4 ranks", "world has 2"], np=2)
deck_case("div_n_layer_by_pp_larger", {"parallel.pp": 4},
          ["deck.toml:", "model.n_layer = 2", "parallel.pp * parallel.vpp = 4 * 1"], np=4)
deck_case("world_not_divisible_by_pp", {"parallel.pp": 2},
          ["deck.toml", "parallel.tp * parallel.pp = 1 * 2", "world size 3"], np=3)
deck_case("world_vs_pp_dp", {"parallel.pp": 2, "parallel.dp": 2},
          ["deck.toml", "1 * 2 * 2 = 4 ranks", "world has 2"], np=2)
# Context parallelism (issue 30): the key's range, the world with cp in the product, the
# sequence's 2 * cp chunks, sequence parallelism's rows per rank, and 2D TP (not with cp).
deck_case("cp_zero", {"parallel.cp": 0}, ["deck.toml:", "parallel.cp", ">= 1", "got 0"])
deck_case("world_not_divisible_by_tp_cp_pp", {"parallel.cp": 2},
          ["deck.toml", "parallel.tp * parallel.cp * parallel.pp = 1 * 2 * 1", "world size 3"],
          np=3)
deck_case("world_vs_cp_dp", {"parallel.cp": 2, "parallel.dp": 2},
          ["deck.toml", "1 * 2 * 1 * 2 = 4 ranks", "world has 2"], np=2)
deck_case("div_seq_len_by_2cp", {"parallel.cp": 3},
          ["deck.toml:", "parallel.cp = 3", "model.seq_len = 8", "2 * parallel.cp = 6"], np=3)
deck_case("cp_with_tp_2d", {"parallel.cp": 2, "parallel.tp": 4, "parallel.tp_mode": "2d"},
          ["deck.toml", "parallel.tp_mode = \"2d\"", "context parallelism",
           "expected parallel.cp = 1"], np=2)
# Ulysses (parallel.cp_mode): the word, and each rank's heads split over cp.
deck_case("cp_mode_unknown", {"parallel.cp_mode": "tree"},
          ["deck.toml:", "parallel.cp_mode", "ring or ulysses", "\"tree\""])
deck_case("ulysses_heads_not_divisible_by_cp",
          {"parallel.cp": 2, "parallel.cp_mode": "ulysses", "model.n_head": 1},
          ["deck.toml", "parallel.cp_mode = \"ulysses\"", "parallel.cp = 2", "1 query heads",
           "divisible by 2"], np=2)
deck_case("ulysses_tp_heads_not_divisible_by_cp",
          {"parallel.cp": 2, "parallel.tp": 2, "parallel.cp_mode": "ulysses"},
          ["deck.toml", "parallel.cp_mode = \"ulysses\"", "1 query heads", "parallel.tp"], np=4)
deck_case("ulysses_kv_heads_not_divisible_by_cp",
          {"parallel.cp": 2, "parallel.cp_mode": "ulysses", "model.arch": "llama",
           "model.n_head": 4, "model.n_kv_head": 1},
          ["deck.toml", "parallel.cp_mode = \"ulysses\"", "4 query heads", "1 key/value heads"],
          np=2)
deck_case("ulysses_with_layout_auto", {"parallel.layout": "auto", "parallel.micro_batch_size": None,
                                       "parallel.cp_mode": "ulysses"},
          ["deck.toml:", "parallel.cp_mode", "parallel.layout = \"auto\"", "ring"])


@case("cli_grid_world_vs_cp", ["--tp * --cp * --dp * --pp", "1 * 2 * 2 * 1 = 4", "world has 2"],
      np=2)
def _(c):
    return ["grid", "--cp", "2", "--dp", "2"]


# Virtual stages: interleaving needs the microbatches per rank divisible by pp.
deck_case("div_microbatches_by_pp_interleaved",
          {"model.n_layer": 4, "parallel.pp": 2, "parallel.vpp": 2,
           "parallel.schedule": "interleaved-1f1b", "train.global_batch_size": 6,
           "parallel.micro_batch_size": 2}, ["deck.toml", "parallel.pp"], np=2)
deck_case("vocab_smaller_than_dataset", {"model.vocab_size": 8},
          ["tokens.h5", "vocab_size = 16", "model.vocab_size = 8", "data.train"], np=2)
deck_case("vocab_from_empty_data_train", {"model.vocab_size": 0, "data.train": ""},
          ["deck.toml", "model.vocab_size = 0", "data.train"])
deck_case("data_train_empty", {"data.train": ""}, ["deck.toml", "data.train", "empty"])


# -- token datasets: data.train and data.valid (bad_input.py has: train missing, train not
#    HDF5, an id >= vocab_size in train) --

def tokens_case(name, needles, np=1, key="data.train", **kw):
    def setup(c):
        c.copy("tokens.h5")
        write_tokens(c.path("bad_tokens.h5"), **kw)
        return c.train({key: "bad_tokens.h5"})
    CASES.append((name, np, setup, needles))


tokens_case("tokens_id_negative", ["bad_tokens.h5", "/tokens[3] = -2", "[0, vocab_size = 16)"],
            ids=[1, 2, 3, -2] + [0] * 60, dtype=np.int32)
tokens_case("tokens_id_beyond_int32", ["bad_tokens.h5", "/tokens[1]", "vocab_size = 16"],
            ids=[1, 2 ** 40] + [0] * 60, dtype=np.int64)
tokens_case("tokens_float", ["bad_tokens.h5", "/tokens", "float", "integer"], dtype=np.float32)
tokens_case("tokens_2d", ["bad_tokens.h5", "/tokens", "[32, 16]", "1-D"],
            ids=(np.arange(512) % 16).reshape(32, 16))
tokens_case("tokens_empty", ["bad_tokens.h5", "/tokens", "empty"], ids=np.zeros(0), np=2)
tokens_case("tokens_fewer_than_seq_len", ["bad_tokens.h5", "5 tokens", "model.seq_len = 8", "9"],
            ids=[1, 2, 3, 4, 5])
tokens_case("tokens_vocab_attr_missing", ["bad_tokens.h5", "vocab_size", "missing"],
            attrs={"vocab_size": None})
tokens_case("tokens_vocab_attr_string", ["bad_tokens.h5", "vocab_size", "string", "integer"],
            attrs={"vocab_size": "sixteen"})
tokens_case("tokens_vocab_attr_zero", ["bad_tokens.h5", "vocab_size = 0", "positive"],
            attrs={"vocab_size": np.int64(0)})
tokens_case("tokens_tokenizer_unknown", ["bad_tokens.h5", "tokenizer", "bpe", "byte"],
            tokenizer="bpe")
tokens_case("tokens_sentencepiece_without_model", ["bad_tokens.h5", "/tokenizer/model"],
            tokenizer="sentencepiece")
tokens_case("valid_id_out_of_range", ["bad_tokens.h5", "/tokens[0] = 20", "vocab_size = 16"],
            key="data.valid", ids=[20] + [0] * 63, dtype=np.int32, np=2)
tokens_case("valid_vocab_larger_than_deck", ["bad_tokens.h5", "vocab_size = 32",
                                             "model.vocab_size = 16", "data.valid"],
            key="data.valid", vocab_size=32)


# -- blends and shards (data.train as a list; a directory or glob is one dataset) --

def blend(*entries):
    return Raw("[" + ", ".join('{path = "%s", weight = %s}' % e for e in entries) + "]")


@case("blend_missing_file", ["gone.h5", "no such file"], np=2)
def _(c):
    return c.train({"data.train": blend((c.copy("tokens.h5"), 0.7), ("gone.h5", 0.3))})


deck_case("blend_negative_weight", {"data.train": blend(("tokens.h5", 0.7), ("tokens.h5", -0.5))},
          ["deck.toml", "data.train", "weight", ">= 0", "-0.5"])
deck_case("blend_all_weights_zero", {"data.train": blend(("tokens.h5", 0), ("tokens.h5", 0.0))},
          ["deck.toml", "data.train", "every weight is 0"])


@case("blend_different_vocabularies", ["v12.h5", "vocab_size 12", "tokens.h5", "one tokenizer"],
      np=2)
def _(c):
    write_tokens(c.path("v12.h5"), vocab_size=12)
    return c.train({"data.train": blend((c.copy("tokens.h5"), 0.5), ("v12.h5", 0.5))})


@case("shards_different_tokenizers", ["s1.h5", "sentencepiece", "one tokenizer"])
def _(c):
    os.makedirs(c.path("shards"))
    write_tokens(c.path("shards/s0.h5"))
    write_tokens(c.path("shards/s1.h5"), tokenizer="sentencepiece",
                 attrs={"tokenizer": "sentencepiece"})
    with h5py.File(c.path("shards/s1.h5"), "r+") as f:
        f.create_dataset("tokenizer/model", data=np.frombuffer(b"model", dtype=np.uint8))
    return c.train({"data.train": "shards"})


@case("shards_glob_matches_nothing", ["shard-*.h5", "no file matches"])
def _(c):
    return c.train({"data.train": "shard-*.h5"})


@case("blend_corpus_smaller_than_a_sequence", ["tiny.h5", "5 tokens", "model.seq_len = 8"])
def _(c):
    write_tokens(c.path("tiny.h5"), ids=[1, 2, 3, 4, 5])
    return c.train({"data.train": blend((c.copy("tokens.h5"), 0.5), ("tiny.h5", 0.5))})


@case("index_tampered", ["run/data_index/train.h5", "damaged", "delete it"], np=2)
def _(c):
    # The sentinel's index (up to date for this deck) with one entry changed by hand.
    with h5py.File(os.path.join(c.out_dir, "data_index", "train.h5"), "r+") as f:
        s = f["dataset_0/samples"]
        s[0] = (s[0] + 1) % f["dataset_0"].attrs["sequences_per_epoch"]
    return c.train({"data.train": c.copy("tokens.h5")})


@case("index_not_hdf5", ["run/data_index/train.h5", "damaged", "not an HDF5 file"])
def _(c):
    with open(os.path.join(c.out_dir, "data_index", "train.h5"), "w") as f:
        f.write("not an index\n")
    return c.train({"data.train": c.copy("tokens.h5")})


@case("tokens_missing_dataset", ["no_tokens.h5", "/tokens", "missing"])
def _(c):
    c.h5_edit("tokens.h5", "no_tokens.h5", lambda f: f.__delitem__("tokens"))
    return c.train({"data.train": "no_tokens.h5"})


def _refilter(name, **storage):
    """Rewrites dataset `name` (its attributes kept) with h5py's storage options: a file
    another tool wrote, e.g. with h5py's own lzf filter, which libhdf5 itself cannot decode."""
    def edit(f):
        data, attrs = f[name][...], dict(f[name].attrs)
        del f[name]
        d = f.create_dataset(name, data=data, **storage)
        for k, v in attrs.items():
            d.attrs[k] = v
    return edit


@case("tokens_unknown_filter", ["lzf.h5", "/tokens", "'lzf'", "cannot decode", "h5repack"],
      np=2)
def _(c):
    c.h5_edit("tokens.h5", "lzf.h5", _refilter("tokens", compression="lzf", chunks=(64,)))
    return c.train({"data.train": "lzf.h5"})


@case("tokens_truncated", ["short.h5", "truncated"], np=2)
def _(c):
    c.copy("tokens.h5", "short.h5")
    truncate_file(c.path("short.h5"))
    return c.train({"data.train": "short.h5"})


@case("tokens_is_directory", ["tokdir.h5", "directory"])
def _(c):
    os.makedirs(c.path("tokdir.h5"))
    return c.train({"data.train": "tokdir.h5"})


@case("valid_missing", ["no_valid.h5", "no such file"], np=2)
def _(c):
    return c.train({"data.train": c.copy("tokens.h5"), "data.valid": "no_valid.h5"})


@case("valid_not_hdf5", ["valid.txt", "not an HDF5 file"])
def _(c):
    return c.train({"data.train": c.copy("tokens.h5"),
                    "data.valid": c.text("valid.txt", "In the beginning\n" * 30)})


# -- io.init_weights: a weights file (or a checkpoint) --

def weights_case(name, needles, edit=None, np=2, fixture="weights.h5", raw=None, overrides=None):
    def setup(c):
        c.copy("tokens.h5")
        if raw is not None:
            raw(c)
        elif edit is None:
            pass
        else:
            c.h5_edit(fixture, "w.h5", edit)
        return c.train({"io.init_weights": "w.h5", **(overrides or {})})
    CASES.append((name, np, setup, needles))


def _del_attr(name):
    return lambda f: f.attrs.__delitem__(name)


def _set_attr(name, value):
    return lambda f: f.attrs.__setitem__(name, value)


def _replace(name, data):
    def edit(f):
        del f[name]
        f.create_dataset(name, data=data)
    return edit


def _poke(name):
    def edit(f):
        a = f[name][...]
        a.flat[3] += 0.5
        f[name][...] = a
    return edit


weights_case("weights_missing", ["w.h5", "no such file"], np=1)
weights_case("weights_not_hdf5", ["w.h5", "not an HDF5 file"],
             raw=lambda c: c.text("w.h5", "\x89HDF? no\n" * 100))
weights_case("weights_no_format", ["w.h5", "format", "trident-weights"], _del_attr("format"), np=1)
weights_case("weights_wrong_format", ["w.h5", 'format = "trident-grad"', "trident-weights"],
             _set_attr("format", "trident-grad"))
weights_case("weights_format_not_string", ["w.h5", "format", "integer", "string"],
             _set_attr("format", np.int64(7)), np=1)
weights_case("weights_wrong_version", ["w.h5", "format_version = 2", "expected 1"],
             _set_attr("format_version", np.int64(2)))
weights_case("weights_model_attr_mismatch", ["w.h5", "d_model = 16", "model.d_model = 8"],
             _set_attr("d_model", np.int64(16)))
weights_case("weights_model_attr_missing", ["w.h5", "n_head", "missing"], _del_attr("n_head"), np=1)
weights_case("weights_wrong_shape", ["w.h5", "/model/wpe", "[9, 8]", "[8, 8]"],
             _replace("model/wpe", np.zeros((9, 8), np.float32)))
weights_case("weights_wrong_dtype", ["w.h5", "/model/ln_f.weight", "integer", "float32"],
             _replace("model/ln_f.weight", np.ones(8, np.int32)))
weights_case("weights_missing_tensor", ["w.h5", "/model/h.1.mlp.c_proj.bias", "missing"],
             lambda f: f.__delitem__("model/h.1.mlp.c_proj.bias"))
weights_case("weights_no_model_group", ["w.h5", "/model", "missing"],
             lambda f: f.__delitem__("model"), np=1)
weights_case("weights_checksum_mismatch", ["w.h5", "/model/wte", "checksum"], _poke("model/wte"),
             overrides={"parallel.pp": 2})
weights_case("weights_unknown_filter", ["w.h5", "/model/wte", "'lzf'", "cannot decode"],
             _refilter("model/wte", compression="lzf"))
weights_case("weights_truncated", ["w.h5", "truncated"],
             raw=lambda c: (c.copy("weights.h5", "w.h5"), truncate_file(c.path("w.h5"))))


# -- io.resume: a checkpoint (bad_input.py has: a missing path) --

def resume_case(name, needles, edit=None, np=2, overrides=None, raw=None, fixture="ckpt.h5"):
    def setup(c):
        c.copy("tokens.h5")
        if raw is not None:
            raw(c)
        elif edit is not None:
            c.h5_edit(fixture, "ck.h5", edit)
        o = {"io.resume": "ck.h5"}
        o.update(overrides or {})
        return c.train(o)
    CASES.append((name, np, setup, needles))


resume_case("resume_not_hdf5", ["ck.h5", "not an HDF5 file"], raw=lambda c: c.text("ck.h5", "x" * 4096))
resume_case("resume_is_weights_file", ["ck.h5", 'format = "trident-weights"', "trident-checkpoint"],
            raw=lambda c: c.copy("weights.h5", "ck.h5"))
resume_case("resume_wrong_version", ["ck.h5", "format_version = 3", "expected 1"],
            _set_attr("format_version", np.int64(3)), np=1)
resume_case("resume_step_negative", ["ck.h5", "step = -1", "non-negative"],
            _set_attr("step", np.int64(-1)), np=1)
resume_case("resume_config_missing", ["ck.h5", "config", "missing"], _del_attr("config"), np=1)
resume_case("resume_seed_attr_float", ["ck.h5", "seed", "float", "integer"],
            _set_attr("seed", 1234.0), np=1)
resume_case("resume_optimizer_missing", ["ck.h5", "/optimizer/exp_avg_sq", "missing"],
            lambda f: f.__delitem__("optimizer/exp_avg_sq"))
resume_case("resume_optimizer_wrong_shape", ["ck.h5", "/optimizer/exp_avg/wte", "[16, 4]", "[16, 8]"],
            _replace("optimizer/exp_avg/wte", np.zeros((16, 4), np.float32)),
            overrides={"parallel.pp": 2})
resume_case("resume_checksum_mismatch", ["ck.h5", "/optimizer/exp_avg_sq/h.0.attn.c_attn.weight",
                                         "checksum"],
            _poke("optimizer/exp_avg_sq/h.0.attn.c_attn.weight"), np=4,
            overrides={"parallel.tp": 2})
resume_case("resume_truncated", ["ck.h5", "truncated"],
            raw=lambda c: (c.copy("ckpt.h5", "ck.h5"), truncate_file(c.path("ck.h5"), 0.7)))
resume_case("resume_is_directory", ["ckdir", "directory"],
            raw=lambda c: os.makedirs(c.path("ckdir")), overrides={"io.resume": "ckdir"}, np=1)
# io.resume = "auto" finds the sentinel checkpoint in run/checkpoints: a deck that does not
# match it is refused, never silently started afresh over it.
deck_case("resume_auto_seed_mismatch", {"io.resume": "auto", "train.seed": 99, "train.steps": 3},
          [SENTINEL_CKPT, "seed 1234", "train.seed = 99"], np=2)
deck_case("resume_auto_model_mismatch", {"io.resume": "auto", "model.n_head": 4,
                                          "train.steps": 3},
          [SENTINEL_CKPT, "n_head = 2", "model.n_head = 4"], np=2)
deck_case("resume_auto_shape_mismatch", {"io.resume": "auto", "model.d_model": 16,
                                          "model.n_head": 2, "train.steps": 3},
          [SENTINEL_CKPT, "d_model = 8", "model.d_model = 16"])


# -- the batch file of `trident grad` (bad_input.py has: no /targets; a weights shape) --

def grad_case(name, needles, batch_fn, np=1):
    def setup(c):
        with h5py.File(c.path("b.h5"), "w") as f:
            batch_fn(f)
        return ["grad", c.deck(), "--weights", c.copy("weights.h5"), "--batch", "b.h5",
                "--out", "g.h5"]
    CASES.append((name, np, setup, needles))


_ids = (np.arange(4 * 9) % 16).reshape(4, 9).astype(np.int32)
grad_case("batch_id_out_of_range", ["b.h5", "/targets[1, 2] = 99", "model.vocab_size = 16"],
          lambda f: (f.create_dataset("inputs", data=_ids[:, :-1]),
                     f.create_dataset("targets", data=np.where(np.arange(32).reshape(4, 8) == 10,
                                                               99, _ids[:, 1:]))))
grad_case("batch_seq_len_mismatch", ["b.h5", "7 tokens", "model.seq_len = 8"],
          lambda f: (f.create_dataset("inputs", data=_ids[:, :7]),
                     f.create_dataset("targets", data=_ids[:, 1:8])))
grad_case("batch_shapes_differ", ["b.h5", "/inputs", "[4, 8]", "/targets", "[3, 8]"],
          lambda f: (f.create_dataset("inputs", data=_ids[:, :-1]),
                     f.create_dataset("targets", data=_ids[:3, 1:])))
grad_case("batch_float_ids", ["b.h5", "/inputs", "float", "int32"],
          lambda f: (f.create_dataset("inputs", data=_ids[:, :-1].astype(np.float32)),
                     f.create_dataset("targets", data=_ids[:, 1:])))
grad_case("batch_not_divisible_over_dp", ["b.h5", "3 sequences", "micro_batch_size = 1",
                                          "dp = 2"],
          lambda f: (f.create_dataset("inputs", data=_ids[:3, :-1]),
                     f.create_dataset("targets", data=_ids[:3, 1:])), np=2)


# -- `trident convert`: Hugging Face folders (safetensors + config.json) in, trident files
#    out, and back. Each import writes over run/w.h5, which must survive the failure. --

def _hf_gpt2(c, folder="hf", header_edit=None, data_edit=None, config_edit=None, length_edit=None):
    """A GPT-2 Hugging Face folder of the fixture's weights, written here by hand
    (safetensors: 8-byte little-endian header length, JSON header, data; wte is the last
    tensor); the edits damage the header dict, the data bytes, the header length or
    config.json's dict before writing."""
    import json
    import struct
    os.makedirs(c.path(folder), exist_ok=True)
    header, chunks, at = {"__metadata__": {"format": "pt"}}, [], 0
    with h5py.File(os.path.join(c.fixtures, "weights.h5"), "r") as f:
        for n in f["model"]:
            a = f["model"][n][...].astype("<f4")
            hf = "transformer." + (n + ".weight" if n in ("wte", "wpe") else n)
            header[hf] = {"dtype": "F32", "shape": list(a.shape),
                          "data_offsets": [at, at + a.nbytes]}
            chunks.append(a.tobytes())
            at += a.nbytes
    data = b"".join(chunks)
    if header_edit:
        header_edit(header)
    if data_edit:
        data = data_edit(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    n = length_edit(len(text)) if length_edit else len(text)
    c.text(os.path.join(folder, "model.safetensors"), struct.pack("<Q", n) + text + data)
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 8,
              "n_layer": 2, "n_head": 2, "n_positions": 8, "vocab_size": 16,
              "layer_norm_epsilon": 1e-5}
    if config_edit:
        config_edit(config)
    c.text(os.path.join(folder, "config.json"), json.dumps(config))
    return folder


def convert_case(name, needles, np_=1, **kw):
    def setup(c):
        os.makedirs(c.out_dir, exist_ok=True)
        shutil.copyfile(os.path.join(c.fixtures, "weights.h5"), os.path.join(c.out_dir, "w.h5"))
        return ["convert", "--from", _hf_gpt2(c, **kw), "--to", "run/w.h5"]
    CASES.append((name, np_, setup, needles))


def _entry(name, key, value):
    return lambda h: h[name].__setitem__(key, value)


convert_case("hf_header_length_past_end", ["model.safetensors", "header length", "past the end"],
             length_edit=lambda n: n + 10 ** 6)
convert_case("hf_header_not_json", ["model.safetensors", "not valid JSON"],
             header_edit=lambda h: h.__setitem__("x", float("nan")))
convert_case("hf_unknown_dtype", ["model.safetensors", "transformer.ln_f.bias", "unknown dtype", "F33"],
             header_edit=_entry("transformer.ln_f.bias", "dtype", "F33"))
convert_case("hf_dtype_not_float", ["transformer.ln_f.bias", "dtype I32", "F32, BF16 or F16"],
             header_edit=_entry("transformer.ln_f.bias", "dtype", "I32"))
convert_case("hf_offsets_out_of_range", ["transformer.wte.weight", "data_offsets", "out of range"],
             data_edit=lambda d: d[:-4])
convert_case("hf_offsets_overlap", ["model.safetensors", "overlaps"],
             header_edit=lambda h: h["transformer.wpe.weight"].__setitem__(
                 "data_offsets", [o - 4 for o in h["transformer.wpe.weight"]["data_offsets"]]))
convert_case("hf_offsets_hole", ["model.safetensors", "belong to no tensor"],
             header_edit=lambda h: h.__delitem__("transformer.wpe.weight"))
convert_case("hf_shape_vs_offsets", ["transformer.wpe.weight", "shape [8, 9]", "data_offsets"],
             header_edit=_entry("transformer.wpe.weight", "shape", [8, 9]))
convert_case("hf_shape_vs_config", ["transformer.wpe.weight", "shape [4, 16]", "expected [8, 8]",
                                    "config.json"],
             header_edit=_entry("transformer.wpe.weight", "shape", [4, 16]))
convert_case("hf_missing_tensor", ["hf", "no tensor 'transformer.wte.weight'"],
             header_edit=lambda h: h.__delitem__("transformer.wte.weight"),
             data_edit=lambda d: d[:-16 * 8 * 4])
convert_case("hf_config_layers", ["config.json", "n_layer = 0", "positive integer"],
             config_edit=lambda j: j.__setitem__("n_layer", 0))
convert_case("hf_config_model_type", ["config.json", "model_type", "bert", "gpt2"],
             config_edit=lambda j: j.__setitem__("model_type", "bert"))
convert_case("hf_config_wider", ["transformer.wte.weight", "expected [16, 16]"],
             config_edit=lambda j: j.__setitem__("n_embd", 16))


@case("hf_no_safetensors", ["hf", "no model.safetensors or model.safetensors.index.json"])
def _(c):
    folder = _hf_gpt2(c)
    os.remove(c.path(os.path.join(folder, "model.safetensors")))
    return ["convert", "--from", folder, "--to", "w.h5"]


@case("hf_index_missing_shard", ["model-00002-of-00002.safetensors", "cannot open"])
def _(c):
    import json
    folder = _hf_gpt2(c)
    os.rename(c.path("hf/model.safetensors"), c.path("hf/model-00001-of-00002.safetensors"))
    wmap = {"transformer.ln_f.bias": "model-00002-of-00002.safetensors"}
    c.text("hf/model.safetensors.index.json", json.dumps({"weight_map": wmap}))
    return ["convert", "--from", folder, "--to", "w.h5"]


@case("hf_export_dtype", ["--dtype", "f16"])
def _(c):
    return ["convert", "--from", c.copy("weights.h5"), "--to", "out", "--dtype", "f16"]


@case("hf_export_shard_size", ["--max-shard-size", "lots"])
def _(c):
    return ["convert", "--from", c.copy("weights.h5"), "--to", "out", "--max-shard-size", "lots"]


@case("hf_export_over_other_shards", ["out", "model-00001-of-00003.safetensors", "would not replace"])
def _(c):
    os.makedirs(c.path("out"))
    c.text("out/model-00001-of-00003.safetensors", b"old")
    return ["convert", "--from", c.copy("weights.h5"), "--to", "out"]


@case("hf_export_not_trident", ["batch.h5", "format"])
def _(c):
    return ["convert", "--from", c.copy("batch.h5"), "--to", "out"]


@case("hf_import_with_dtype", ["--dtype", "export", "hf", "import"])
def _(c):
    return ["convert", "--from", _hf_gpt2(c), "--to", "w.h5", "--dtype", "bf16"]


@case("hf_export_with_seq_len", ["--seq-len", "import", "weights.h5", "export"])
def _(c):
    return ["convert", "--from", c.copy("weights.h5"), "--to", "out", "--seq-len", "4"]


@case("hf_import_seq_len_too_long", ["--seq-len 9", "n_positions = 8"])
def _(c):
    return ["convert", "--from", _hf_gpt2(c), "--to", "w.h5", "--seq-len", "9"]


@case("hf_convert_under_mpirun", ["convert", "one process"], np=2)
def _(c):
    return ["convert", "--from", c.copy("weights.h5"), "--to", "out"]


# -- the environment --

@case("env_out_dir_under_a_file", ["io.out_dir", "afile/run", "not a directory"], np=2)
def _(c):
    c.text("afile", "a file, not a directory\n")
    return c.train({"data.train": c.copy("tokens.h5"), "io.out_dir": "afile/run"})


@case("env_out_dir_permission_denied", ["io.out_dir", "locked/run", "permission denied"])
def _(c):
    # Root writes anywhere: the run drops to the nobody user (Linux, as root) so that the
    # folder's mode bites.
    os.makedirs(c.path("locked"))
    c.copy("tokens.h5")
    argv = c.train({"io.out_dir": "locked/run"})
    os.chmod(c.path("locked"), 0o555)
    if os.geteuid() == 0:
        uid, gid = 65534, 65534
        c.env["HOME"] = "/tmp"

        def drop():
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        c.preexec = drop
    return argv


def _mount_tmpfs(c, where, size, readonly=False, fill=None):
    """A tmpfs of `size` bytes at c.path(where), filled by fill(path) before it is made
    read-only; unmounted after the run. Returns False where mounting is not allowed."""
    path = c.path(where)
    os.makedirs(path)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return False
    c.cleanups.append(lambda: subprocess.run(["umount", "-l", path], capture_output=True))
    if fill:
        fill(path)
    if readonly:
        subprocess.run(["mount", "-o", "remount,ro", path], check=True)
    return True


def _sentinel_into(c, root):
    """Moves the case's sentinel out_dir into `root`/run (its decks then use that)."""
    dst = os.path.join(root, "run")
    shutil.copytree(c.out_dir, dst)
    shutil.rmtree(c.out_dir)
    c.out_dir = dst


@case("env_out_dir_read_only_fs", ["io.out_dir", "ro/run/.trident.lock", "read-only"], np=2)
def _(c):
    if not _mount_tmpfs(c, "ro", 8 << 20, readonly=True, fill=lambda p: _sentinel_into(c, p)):
        raise Skip("cannot mount a tmpfs here (not root?)")
    return c.train({"data.train": c.copy("tokens.h5"), "io.out_dir": "ro/run"})


# The *_write cases skip the free-space check before the write (TRIDENT_FAULT=no-room-check,
# core/fault.hpp) so that the full disk meets the write itself: the error paths behind the
# checks (a failed H5Fclose once left HDF5 to crash in MPI_Finalize, issue 32).
def _write_fails(setup, step):
    def with_fault(c):
        c.env["TRIDENT_FAULT"] = f"no-room-check:0:{step}"
        # Open MPI's MPI-IO (OMPIO) reports the failed write itself, on any number of ranks.
        c.mpi_lines = ("mca_fbtl_posix_pwritev:",)
        return setup(c)
    return with_fault


@case("env_disk_full_checkpoint_1rank", ["full/run/checkpoints/step-00000003.h5", "free",
                                        "disk full"])
@case("env_disk_full_checkpoint", ["full/run/checkpoints/step-00000003.h5", "free", "disk full"], np=2)
def _disk_full_checkpoint(c):
    # The sentinel (a step-2 checkpoint) on a tmpfs with room for the metrics row of step 3
    # but not for its checkpoint: the run resumes, trains step 3 and fails to save it.
    used = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(c.out_dir) for f in fs)
    ck = os.path.getsize(os.path.join(c.fixtures, "ckpt.h5"))
    size = (used + ck // 2 + 4095) // 4096 * 4096
    if not _mount_tmpfs(c, "full", size, fill=lambda p: _sentinel_into(c, p)):
        raise Skip("cannot mount a tmpfs here (not root?)")
    c.mutable = {"metrics.h5", "config.toml"}
    c.after = lambda: _metrics_kept(os.path.join(c.out_dir, "metrics.h5"))
    return c.train({"data.train": c.copy("tokens.h5"), "io.out_dir": "full/run",
                    "io.resume": "auto", "train.steps": SENTINEL_STEP + 1})


case("env_disk_full_checkpoint_write_1rank", ["full/run/checkpoints/step-00000003.h5",
                                             "disk full"])(
    _write_fails(_disk_full_checkpoint, SENTINEL_STEP + 1))
case("env_disk_full_checkpoint_write", ["full/run/checkpoints/step-00000003.h5", "disk full"],
     np=2)(_write_fails(_disk_full_checkpoint, SENTINEL_STEP + 1))


def _metrics_kept(path):
    try:
        with h5py.File(path, "r") as f:
            steps = list(f["step"][:SENTINEL_STEP])
    except Exception as e:  # noqa: BLE001 - any failure to read it is the finding
        return f"metrics.h5 unreadable after the run: {e}"
    if steps != list(range(1, SENTINEL_STEP + 1)):
        return f"metrics.h5 lost its rows: steps {steps}"
    return None


def _sentinel_leaving(c, free):
    """fill for _mount_tmpfs: the sentinel, then a filler file beside run/ that leaves about
    `free` bytes of the file system (tmpfs counts whole pages per file)."""
    def fill(root):
        _sentinel_into(c, root)
        st = os.statvfs(root)
        with open(os.path.join(root, "filler"), "wb") as f:
            f.truncate(0)
            left = st.f_bavail * st.f_frsize - free
            block = b"\0" * (1 << 20)
            while left > 0:
                f.write(block[:min(left, len(block))])
                left -= len(block)
    return fill


@case("env_disk_full_sample_index_1rank", ["full/run/data_index/", "2.0 MiB", "free",
                                           "disk full"])
@case("env_disk_full_sample_index", ["full/run/data_index/", "2.0 MiB", "free", "disk full"],
      np=2)
def _disk_full_sample_index(c):
    # A sample index of 2 MiB (65536 steps * 4 sequences * 8 bytes) on a tmpfs with 256 KiB
    # left after the sentinel: refused with the figure before any of it is written.
    if not _mount_tmpfs(c, "full", 8 << 20, fill=_sentinel_leaving(c, 256 << 10)):
        raise Skip("cannot mount a tmpfs here (not root?)")
    c.mutable = {"metrics.h5", "config.toml"}
    c.after = lambda: _metrics_kept(os.path.join(c.out_dir, "metrics.h5"))
    return c.train({"data.train": c.copy("tokens.h5"), "io.out_dir": "full/run",
                    "io.resume": "auto", "train.steps": 65536})


case("env_disk_full_sample_index_write_1rank", ["full/run/data_index/train.h5", "disk full"])(
    _write_fails(_disk_full_sample_index, 0))
case("env_disk_full_sample_index_write", ["full/run/data_index/train.h5", "disk full"], np=2)(
    _write_fails(_disk_full_sample_index, 0))


def _metrics_no_partial_row(path):
    """What a reader of a metrics.h5 whose first row could not be written sees: the file
    (if any) readable, and no row with step -1 or NaN (a half-written row)."""
    if not os.path.exists(path):
        return None
    try:
        with h5py.File(path, "r") as f:
            steps = list(f["step"][:])
            loss = list(f["loss"][:])
    except Exception as e:  # noqa: BLE001 - any failure to read it is the finding
        return f"{path} unreadable after the run: {e}"
    if any(s < 1 for s in steps) or any(np.isnan(loss)) or len(steps) != len(loss):
        return f"{path} holds a half-written row: steps {steps}, loss {loss}"
    return None


@case("env_disk_full_metrics_1rank", ["full/fresh/metrics.h5", "disk full"])
@case("env_disk_full_metrics", ["full/fresh/metrics.h5", "disk full"], np=2)
def _disk_full_metrics(c):
    # A fresh run beside the sentinel on a tmpfs with room for its sample index, not for the
    # metrics file's header with the reservation of its flush (metrics.cpp) nor for the
    # first chunk of its columns: the file cannot be created whole (it is deleted) or the row
    # of step 1 cannot be written. The sentinel (the case's out_dir) stays as it was.
    if not _mount_tmpfs(c, "full", 8 << 20, fill=_sentinel_leaving(c, 40 << 10)):
        raise Skip("cannot mount a tmpfs here (not root?)")
    c.after = lambda: _metrics_no_partial_row(c.path("full/fresh/metrics.h5"))
    return c.train({"data.train": c.copy("tokens.h5"), "io.out_dir": "full/fresh"})


# With the room check skipped, the first row meets the full disk at the reservation of its
# flush's bytes (metrics.cpp): the file keeps its last good flush (no rows) and reads. Before
# the reservation, the flush itself failed and left metrics.h5 unreadable ("addr overflow").
case("env_disk_full_metrics_write_1rank", ["full/fresh/metrics.h5", "disk full"])(
    _write_fails(_disk_full_metrics, 1))
case("env_disk_full_metrics_write", ["full/fresh/metrics.h5", "disk full"], np=2)(
    _write_fails(_disk_full_metrics, 1))


@case("env_file_size_limit_checkpoint", ["run/checkpoints/step-00000001.h5", "ulimit -f"], np=2)
def _(c):
    # `ulimit -f`: no file may grow beyond the limit (SIGXFSZ ignored, so that a write fails
    # with EFBIG as a full disk fails it with ENOSPC). A model whose checkpoint (~1.2 MiB)
    # is over the limit while the metrics file is not; resume = "none" starts afresh (so
    # metrics.h5 and config.toml are replaced, by design) and fails at its first save.
    limit = 512 << 10

    def limit_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    c.preexec = limit_size
    c.env["PMIX_MCA_gds"] = "hash"  # not PMIx's shared-memory store: its files are larger
    # mpirun starts its ranks with default signal dispositions: ignore SIGXFSZ again.
    c.wrapper = ["/bin/sh", "-c", 'trap "" XFSZ; exec "$0" "$@"']
    # io.overwrite deletes the old run's files: leave it only metrics.h5, which is replaced.
    shutil.rmtree(os.path.join(c.out_dir, "checkpoints"))
    c.mutable = {"metrics.h5", "config.toml"}
    return c.train({"model.d_model": 64})


@case("env_checkpoints_dir_is_a_file", ["run/checkpoints", "cannot create"], np=2)
def _(c):
    # Nothing to resume (checkpoints/ is a file): a fresh run, which fails at its first save.
    shutil.rmtree(os.path.join(c.out_dir, "checkpoints"))
    c.text("run/checkpoints", "a file where the checkpoints folder should be\n")
    c.mutable = {"metrics.h5", "config.toml"}
    return c.train({"data.train": c.copy("tokens.h5"), "io.resume": "auto"})


@case("env_metrics_is_a_directory", ["run/metrics.h5"], np=2)
def _(c):
    os.remove(os.path.join(c.out_dir, "metrics.h5"))
    os.makedirs(os.path.join(c.out_dir, "metrics.h5"))
    c.mutable = {"config.toml"}
    # A fresh run with nothing for io.overwrite to delete (resume = "auto" moves it aside).
    shutil.rmtree(os.path.join(c.out_dir, "checkpoints"))
    return c.train({"data.train": c.copy("tokens.h5")})


@case("env_deck_unreadable", ["deck.toml", "cannot be read", "permission denied"])
def _(c):
    argv = c.train()
    os.chmod(c.path("deck.toml"), 0o000)
    if os.geteuid() == 0:
        c.env["HOME"] = "/tmp"

        def drop():
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
        c.preexec = drop
    return argv


# --- issue 32, unbounded sizes (helper `faults`) ---------------------------------------------

@case("cli_grid_product_overflows", ["--tp * --cp * --dp * --pp", "4294967296", "1048576"])
def _(c):
    return ["grid", "--tp", "65536", "--pp", "65536", "--dp", "1"]

deck_case("rule_steps_overflow_int64", {"train.steps": 9223372036854775807},
          ["deck.toml:", "train.steps", "train.global_batch_size", "sample index"])
deck_case("rule_steps_unbounded_index", {"train.steps": 1000000000000},
          ["deck.toml:", "train.steps", "1099511627776", "8 TiB"])

# --- end of issue 32, unbounded sizes -------------------------------------------------------


class Skip(Exception):
    pass


# --- fixtures -------------------------------------------------------------------------------

def make_fixtures(exe, base):
    """tokens.h5, valid.h5, weights.h5, batch.h5, and a run (metrics, config, a checkpoint at
    SENTINEL_STEP) made by trident itself from the tiny deck."""
    d = os.path.join(base, "_fixtures")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    write_tokens(os.path.join(d, "tokens.h5"))
    write_tokens(os.path.join(d, "valid.h5"), ids=(np.arange(256) * 7) % 16)
    with h5py.File(os.path.join(d, "batch.h5"), "w") as f:
        f.create_dataset("inputs", data=_ids[:, :-1])
        f.create_dataset("targets", data=_ids[:, 1:])
    with open(os.path.join(d, "deck.toml"), "w") as f:
        f.write(render_deck({"train.steps": SENTINEL_STEP, "data.valid": "valid.h5",
                             "train.eval_every": 1, "train.eval_batches": 1}))
    for argv in (["train", "deck.toml"], ["init", "deck.toml", "--out", "weights.h5"]):
        p = subprocess.run([exe] + argv, cwd=d, capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise RuntimeError(f"fixture: trident {' '.join(argv)} failed ({p.returncode}):\n"
                               f"{p.stdout}{p.stderr}")
    shutil.copyfile(os.path.join(d, "run", SENTINEL_CKPT), os.path.join(d, "ckpt.h5"))
    return d


# --- running --------------------------------------------------------------------------------

def processes_with(marker):
    """PIDs of live processes whose environment holds marker (mpirun and its ranks)."""
    pids = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read():
                    with open(f"/proc/{entry}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            pids.append(int(entry))
        except OSError:
            continue
    return pids


def run_case(exe, mpirun, base, fixtures, name, ranks, setup, needles):
    """Returns (status 'ok' | 'FAIL' | 'skip', seconds, shown line, details for the log)."""
    d = os.path.join(base, name)
    if os.path.isdir(d):
        subprocess.run(["umount", "-l"] + [os.path.join(d, m) for m in ("ro", "full")],
                       capture_output=True)
        for dp, dirs, _ in os.walk(d):
            for x in dirs:
                os.chmod(os.path.join(dp, x), 0o755)
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    # The sentinel: what an earlier run left in the decks' out_dir.
    src = os.path.join(fixtures, "run")
    shutil.copytree(src, os.path.join(d, "run"))
    c = Ctx(d, fixtures)
    c.copy("tokens.h5")  # the decks' data.train
    try:
        try:
            args = setup(c)
        except Skip as e:
            return "skip", 0.0, f"(skipped: {e})", ""
        before = snapshot(c.out_dir)
        marker = f"TRIDENT_FAULT_CASE={name}.{os.getpid()}.{time.monotonic_ns()}"
        env = dict(os.environ)
        env.update(c.env)
        env["TRIDENT_FAULT_CASE"] = marker.split("=", 1)[1]
        if ranks == 1:
            argv = c.wrapper + [exe] + args
        else:
            argv = ([mpirun, "-np", str(ranks), "--oversubscribe", "--bind-to", "none"]
                    + c.wrapper + [exe] + args)
        cmd = " ".join(shlex.quote(a) for a in argv)
        t0 = time.monotonic()
        p = subprocess.Popen(argv, cwd=d, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, errors="replace",
                             start_new_session=True, env=env, preexec_fn=c.preexec)
        problems = []
        try:
            out, err = p.communicate(timeout=CASE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            problems.append(f"hung: killed after {CASE_TIMEOUT_S} s")
        # Every rank gone too, within the same CASE_TIMEOUT_S of the start.
        left = processes_with(marker)
        while left and time.monotonic() - t0 < CASE_TIMEOUT_S:
            time.sleep(0.1)
            left = processes_with(marker)
        if left:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            problems.append(f"{len(left)} process(es) still alive {CASE_TIMEOUT_S} s after "
                            "the start (killed)")
        elapsed = time.monotonic() - t0
        return judge(c, ranks, needles, p, out, err, problems, cmd, elapsed, before)
    finally:
        for fn in c.cleanups:
            fn()


def run_case_at(exe, mpirun, base, fixtures, index):
    name, ranks, setup, needles = CASES[index]
    return (name, ranks) + run_case(exe, mpirun, base, fixtures, name, ranks, setup, needles)


def judge(c, ranks, needles, p, out, err, problems, cmd, elapsed, before):
    """The verdict on one finished run (before any cleanup unmounts its out_dir)."""
    d = c.d
    with open(os.path.join(d, "stderr.txt"), "w") as f:
        f.write(err)
    with open(os.path.join(d, "stdout.txt"), "w") as f:
        f.write(out)

    err_lines = [l for l in err.splitlines() if l.strip()]
    errors = [l for l in err_lines + out.splitlines() if l.startswith(PREFIX)]
    shown = errors[0] if errors else (err_lines[0] if err_lines else "(no stderr)")
    if p.returncode == 0:
        problems.append("exit status 0")
    elif p.returncode < 0 and not any(pr.startswith("hung") for pr in problems):
        problems.append(f"killed by signal {-p.returncode}")
    if len(errors) != 1:
        problems.append(f"{len(errors)} lines start with '{PREFIX}'")
    if errors and not any(l.startswith(PREFIX) for l in err_lines):
        problems.append("the error went to stdout, not stderr")
    others = [l for l in err_lines if not l.startswith(PREFIX) and not l.startswith(ALLOWED)
              and not l.startswith(c.mpi_lines)]
    if ranks == 1 and others:
        problems.append(f"stderr has {len(others)} other line(s)")
    if ranks > 1 and any(l.startswith("trident:") for l in others):
        problems.append("other 'trident:' lines on stderr")
    if errors:
        missing = [n for n in needles if n.lower() not in errors[0].lower()]
        if missing:
            problems.append("the error line does not name " + ", ".join(repr(n) for n in missing))
    # Nothing that was in out_dir is damaged.
    after = snapshot(c.out_dir)
    for rel, digest in sorted(before.items()):
        # The sample index is a cache: rebuilt (atomically) when the deck asks another one.
        if rel in c.mutable or rel.startswith("data_index/"):
            continue
        if rel not in after:
            problems.append(f"out_dir file {rel} is gone")
        elif after[rel] != digest:
            problems.append(f"out_dir file {rel} was changed")
    if c.after:
        why = c.after()
        if why:
            problems.append(why)

    detail = (f"$ {cmd}  (in {d}; exit {p.returncode}, {elapsed:.1f} s)\n"
              + "".join(f"  stderr: {l}\n" for l in err_lines[:20])
              + "".join(f"  stdout: {l}\n" for l in out.splitlines()[-5:]))
    if problems:
        return "FAIL", elapsed, f"{shown}  <-- " + "; ".join(problems), detail
    return "ok", elapsed, shown, detail


def main():
    if "--list" in sys.argv[1:]:
        for name, ranks, _, _ in CASES:
            print(f"{name} (np {ranks})")
        return 0
    exe = os.environ.get("TRIDENT")
    if not exe or not os.access(exe, os.X_OK):
        print(f"{TEST}: FAIL: $TRIDENT is not set to an executable trident binary (got {exe!r})")
        return 1
    exe = os.path.abspath(exe)
    mpirun = shutil.which(os.environ.get("MPIEXEC", "mpirun"))
    if not mpirun:
        print(f"{TEST}: FAIL: mpirun not found")
        return 1
    base = os.path.join(os.environ.get("TRIDENT_TEST_OUT", os.path.join(os.getcwd(), "test-out")),
                        TEST)
    os.makedirs(base, exist_ok=True)
    os.chmod(base, 0o755)  # the cases that run as nobody walk through it
    # odls_base_sigkill_timeout 0: when a rank exits non-zero, mpirun sends SIGTERM to the
    # job's processes and waited 1 s (the default) before SIGKILL and its own exit, even with
    # every rank already gone: 1 s of each of the ~60 multi-rank cases. A rank that would
    # hang is killed by mpirun either way, so the cases see the same.
    for k, v in {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
                 "OMPI_MCA_rmaps_base_oversubscribe": "1",
                 "OMPI_MCA_odls_base_sigkill_timeout": "0"}.items():
        os.environ.setdefault(k, v)
    if os.geteuid() == 0:
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")

    names = [c[0] for c in CASES]
    assert len(names) == len(set(names)), "duplicate case names"
    wanted = sys.argv[1:]

    def selected(name):
        return not wanted or any(selected_by(w, name) for w in wanted)
    unknown = [w for w in wanted if not any(selected_by(w, n) for n in names)]
    if unknown:
        print(f"{TEST}: unknown case(s): {', '.join(unknown)} (--list shows them)")
        return 1

    t_start = time.monotonic()
    try:
        fixtures = make_fixtures(exe, base)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"{TEST}: FAIL: {e}")
        return 1
    chosen = [i for i, c in enumerate(CASES) if selected(c[0])]
    job = functools.partial(run_case_at, exe, mpirun, base, fixtures)
    # The cases share nothing (each has its own folder and process marker), and most of a
    # case is MPI's start-up, so running WORKERS at a time cuts the wall time. Forked workers,
    # not threads: some cases use preexec_fn, which is not safe in a threaded parent.
    with multiprocessing.get_context("fork").Pool(WORKERS) as pool:
        results = pool.map(job, chosen, chunksize=1)

    width = max(len(r[0]) for r in results)
    print(f"{'case':<{width}}  np  result  secs  error line")
    print(f"{'-' * width}  --  ------  ----  ----------")
    for name, ranks, status, secs, line, _ in results:
        print(f"{name:<{width}}  {ranks:>2}  {status:<6}  {secs:4.1f}  {line}")
    failed = [r for r in results if r[2] == "FAIL"]
    skipped = [r for r in results if r[2] == "skip"]
    for name, _, _, _, _, detail in failed:
        print(f"\n--- {name} ---\n{detail}", end="")
    print(f"\n{TEST}: {len(results) - len(failed) - len(skipped)} of {len(results)} cases ok"
          + (f", {len(skipped)} skipped" if skipped else "")
          + f" in {time.monotonic() - t_start:.0f} s"
          + (f"; FAILED: {', '.join(r[0] for r in failed)}" if failed else ""))
    return 1 if failed else 0


def selected_by(w, name):
    return name == w or (w.endswith("*") and name.startswith(w[:-1]))


if __name__ == "__main__":
    sys.exit(main())
