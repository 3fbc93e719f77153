#!/usr/bin/python3
"""cli.bad_input: trident on bad input fails fast, cleanly and helpfully (FORMAT.md, "The
command line": errors go to stderr as one line starting `trident: error:`, non-zero exit).

Each case runs `$TRIDENT ...` once (a single rank, no mpirun) in its own fresh folder under
`$TRIDENT_TEST_OUT/cli.bad_input/<case>/` and must:
  - exit with a non-zero status,
  - write to stderr exactly one line that starts with `trident: error:`; other lines may only
    be trident's warnings and notes (`trident: warning:`/`trident: note:`), before it,
  - name in that line the key or file that is wrong (every needle, case-insensitive),
  - finish within TIMEOUT_S seconds (a hang is a failure; the process group is killed).
Prints a table (case, ok/FAIL, the error line) and exits 1 if any case failed.

Usage: TRIDENT=build/trident TRIDENT_TEST_OUT=/tmp/out test/cli/bad_input.py [CASE...]
defines: CASES, run_case, main
"""

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

TEST = "cli.bad_input"
TIMEOUT_S = 20
PREFIX = "trident: error:"
# Lines that may precede the error: trident's own warnings and notes (e.g. about the machine).
ALLOWED = ("trident: warning:", "trident: note:")

# A model small enough that anything that gets as far as computing finishes at once.
TINY = dict(vocab_size=10, seq_len=8, n_layer=1, n_head=2, d_model=8)


# --- files the cases write ------------------------------------------------------------------

def write_deck(path, model=None, extra=""):
    """A valid deck for the tiny model (training steps 1, output in the case folder), with
    `extra` TOML appended; a key set in `extra` must not also be set here."""
    m = dict(TINY)
    m.update(model or {})
    lines = ["[model]"] + [f"{k} = {v}" for k, v in m.items()]
    text = "\n".join(lines) + "\n" + extra
    if "[parallel]" not in text:
        text += "\n[parallel]\nmicro_batch_size = 1\n"
    if "[train]" not in text:
        text += "\n[train]\nsteps = 1\nwarmup_steps = 0\nglobal_batch_size = 2\n"
    if "[io]" not in text:
        text += '\n[io]\nout_dir = "run"\nresume = "none"\n'
    with open(path, "w") as f:
        f.write(text)
    return os.path.basename(path)


def param_shapes(vocab_size, seq_len, n_layer, n_head, d_model):
    """FORMAT.md's tensors and logical shapes (n_head does not change any shape)."""
    del n_head
    c = d_model
    shapes = {"wte": (vocab_size, c), "wpe": (seq_len, c)}
    for i in range(n_layer):
        h = f"h.{i}."
        shapes.update({
            h + "ln_1.weight": (c,), h + "ln_1.bias": (c,),
            h + "attn.c_attn.weight": (c, 3 * c), h + "attn.c_attn.bias": (3 * c,),
            h + "attn.c_proj.weight": (c, c), h + "attn.c_proj.bias": (c,),
            h + "ln_2.weight": (c,), h + "ln_2.bias": (c,),
            h + "mlp.c_fc.weight": (c, 4 * c), h + "mlp.c_fc.bias": (4 * c,),
            h + "mlp.c_proj.weight": (4 * c, c), h + "mlp.c_proj.bias": (c,),
        })
    shapes.update({"ln_f.weight": (c,), "ln_f.bias": (c,)})
    return shapes


def write_weights(path, wrong=None):
    """A weights file (FORMAT.md) for TINY; `wrong` = (name, shape) replaces one shape."""
    rng = np.random.default_rng(0)
    shapes = param_shapes(**TINY)
    if wrong:
        assert wrong[0] in shapes, wrong
        shapes[wrong[0]] = wrong[1]
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "trident-weights"
        f.attrs["format_version"] = np.int64(1)
        for k, v in TINY.items():
            f.attrs[k] = np.int64(v)
        g = f.create_group("model")
        for name, shape in shapes.items():
            g.create_dataset(name, data=(0.02 * rng.standard_normal(shape)).astype(np.float32))
    return os.path.basename(path)


def write_batch(path, with_targets=True, batch=2):
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, TINY["vocab_size"], size=(batch, TINY["seq_len"] + 1))
    with h5py.File(path, "w") as f:
        f.create_dataset("inputs", data=tokens[:, :-1].astype(np.int32))
        if with_targets:
            f.create_dataset("targets", data=tokens[:, 1:].astype(np.int32))
    return os.path.basename(path)


def write_tokens(path, vocab_size, max_id):
    """A token dataset whose ids run up to max_id (inclusive)."""
    ids = np.arange(200) % (max_id + 1)
    with h5py.File(path, "w") as f:
        f.create_dataset("tokens", data=ids.astype(np.int32))
        f.attrs["vocab_size"] = np.int64(vocab_size)
        f.attrs["tokenizer"] = "byte"
    return os.path.basename(path)


# --- the cases ------------------------------------------------------------------------------
# Each: (name, setup(dir) -> argv after $TRIDENT, needles the error line must contain).

def c_no_deck(d):
    return ["train"]


def c_deck_missing(d):
    return ["train", "no_such_deck.toml"]


def c_toml_syntax(d):
    with open(os.path.join(d, "syntax.toml"), "w") as f:
        f.write("[model]\nn_layer = = 4\n")
    return ["train", "syntax.toml"]


def c_unknown_key(d):
    return ["train", write_deck(os.path.join(d, "deck.toml"), extra="[runtime]\nthreds = 1\n")]


def c_wrong_type(d):
    return ["train", write_deck(os.path.join(d, "deck.toml"), model={"n_layer": '"two"'})]


def c_d_model_n_head(d):
    return ["train", write_deck(os.path.join(d, "deck.toml"), model={"n_head": 3})]


def c_lr_range(d):
    return ["train", write_deck(os.path.join(d, "deck.toml"),
                                extra="[train]\nsteps = 1\nwarmup_steps = 0\nlr = -0.001\n"
                                      "global_batch_size = 2\n")]


def c_bad_schedule(d):
    return ["train", write_deck(os.path.join(d, "deck.toml"),
                                extra='[parallel]\nmicro_batch_size = 1\nschedule = "2f2b"\n')]


def c_bad_set_syntax(d):
    return ["train", write_deck(os.path.join(d, "deck.toml")), "--set", "lr"]


def c_set_unknown_key(d):
    return ["train", write_deck(os.path.join(d, "deck.toml")), "--set", "train.lrr=1e-3"]


def c_bf16_on_cpu(d):
    return ["train", write_deck(os.path.join(d, "deck.toml"),
                                extra='[runtime]\ndevice = "cpu"\nprecision = "bf16"\n')]


def c_batch_divisibility(d):
    return ["train", write_deck(os.path.join(d, "deck.toml"),
                                extra="[parallel]\nmicro_batch_size = 4\n"
                                      "[train]\nsteps = 1\nwarmup_steps = 0\n"
                                      "global_batch_size = 10\n")]


def c_vpp_needs_schedule(d):
    return ["train", write_deck(os.path.join(d, "deck.toml"), model={"n_layer": 4},
                                extra='[parallel]\nmicro_batch_size = 1\npp = 2\nvpp = 2\n'
                                      'schedule = "1f1b"\n')]


def c_vpp_layers(d):
    return ["train", write_deck(os.path.join(d, "deck.toml"), model={"n_layer": 2},
                                extra='[parallel]\nmicro_batch_size = 1\npp = 2\nvpp = 2\n'
                                      'schedule = "interleaved-1f1b"\n')]


def c_vpp_needs_pp(d):
    return ["train", write_deck(os.path.join(d, "deck.toml"), model={"n_layer": 2},
                                extra='[parallel]\nmicro_batch_size = 1\nvpp = 2\n'
                                      'schedule = "looped-bfs"\n')]


def c_watchdog_negative(d):
    return ["train", write_deck(os.path.join(d, "deck.toml"), extra="[runtime]\nwatchdog_s = -1\n")]


def c_cuda_graphs_on_cpu(d):
    return ["train", write_deck(os.path.join(d, "deck.toml"), extra="[runtime]\ncuda_graphs = true\n")]


def c_trace_step_past_end(d):
    return ["train", write_deck(os.path.join(d, "deck.toml"), extra="[io]\nout_dir = \"run\"\n"
                                "resume = \"none\"\ntrace_step = 5\n")]


def c_unknown_subcommand(d):
    return ["frobnicate", write_deck(os.path.join(d, "deck.toml"))]


def c_data_missing(d):
    return ["train", write_deck(os.path.join(d, "deck.toml"),
                                extra='[data]\ntrain = "missing_tokens.h5"\n')]


def c_data_not_hdf5(d):
    with open(os.path.join(d, "plain_text.h5"), "w") as f:
        f.write("In the beginning God created the heaven and the earth.\n" * 20)
    return ["train", write_deck(os.path.join(d, "deck.toml"),
                                extra='[data]\ntrain = "plain_text.h5"\n')]


def c_token_out_of_vocab(d):
    write_tokens(os.path.join(d, "big_ids.h5"), vocab_size=10, max_id=12)
    return ["train", write_deck(os.path.join(d, "deck.toml"), model={"vocab_size": 0},
                                extra='[data]\ntrain = "big_ids.h5"\n')]


def c_resume_missing(d):
    write_tokens(os.path.join(d, "tokens.h5"), vocab_size=10, max_id=9)
    return ["train", write_deck(os.path.join(d, "deck.toml"),
                                extra='[data]\ntrain = "tokens.h5"\n'
                                      '[io]\nout_dir = "run"\nresume = "no_such_ckpt.h5"\n')]


def c_grad_weights_shape(d):
    deck = write_deck(os.path.join(d, "deck.toml"))
    w = write_weights(os.path.join(d, "weights.h5"), wrong=("h.0.mlp.c_fc.weight", (8, 31)))
    b = write_batch(os.path.join(d, "batch.h5"))
    return ["grad", deck, "--weights", w, "--batch", b, "--out", "grad.h5"]


def c_grad_no_targets(d):
    deck = write_deck(os.path.join(d, "deck.toml"))
    w = write_weights(os.path.join(d, "weights.h5"))
    b = write_batch(os.path.join(d, "inputs_only.h5"), with_targets=False)
    return ["grad", deck, "--weights", w, "--batch", b, "--out", "grad.h5"]


# --- trident plan and calibrate (issue 21) ---------------------------------------------------

MACHINE = """[machine]
name = "test"
ranks_per_node = 2
memory_gib = 1
peak_flops = 1e11
[compute]
gemm_flops = 5e10
attention_flops = 2e10
kernel_bytes_per_s = 1e10
[intra]
alpha_s = 1e-5
bytes_per_s = 1e9
[inter]
alpha_s = 1e-4
bytes_per_s = 1e8
"""


def write_machine(d, text=MACHINE):
    with open(os.path.join(d, "machine.toml"), "w") as f:
        f.write(text)
    return "machine.toml"


def c_plan_machine_missing(d):
    return ["plan", write_deck(os.path.join(d, "deck.toml")), "--machine", "no_machine.toml"]


def c_plan_machine_negative(d):
    m = write_machine(d, MACHINE.replace("bytes_per_s = 1e8", "bytes_per_s = -1e8"))
    return ["plan", write_deck(os.path.join(d, "deck.toml")), "--machine", m]


def c_plan_machine_incomplete(d):
    m = write_machine(d, MACHINE.replace("attention_flops = 2e10\n", ""))
    return ["plan", write_deck(os.path.join(d, "deck.toml")), "--machine", m]


def c_plan_nothing_fits(d):
    # 1 GiB per rank against a 48-layer d_model 2048 model (~2.4 G parameters, 16 B each).
    m = write_machine(d)
    deck = write_deck(os.path.join(d, "deck.toml"),
                      model={"n_layer": 48, "d_model": 2048, "n_head": 16, "seq_len": 64})
    return ["plan", deck, "--machine", m]


def c_plan_nodes_zero(d):
    return ["plan", write_deck(os.path.join(d, "deck.toml")), "--machine", write_machine(d),
            "--nodes", "0"]


def c_calibrate_without_out(d):
    return ["calibrate", write_deck(os.path.join(d, "deck.toml"))]


CASES = [
    ("plan_machine_missing", c_plan_machine_missing, ["no_machine.toml", "calibrate"]),
    ("plan_machine_negative", c_plan_machine_negative, ["machine.toml:15", "inter.bytes_per_s", "> 0"]),
    ("plan_machine_incomplete", c_plan_machine_incomplete, ["machine.toml", "compute.attention_flops"]),
    ("plan_nothing_fits", c_plan_nothing_fits, ["deck.toml", "no layout fits", "the smallest",
                                                "mostly optimizer"]),
    ("plan_nodes_zero", c_plan_nodes_zero, ["--nodes"]),
    ("calibrate_without_out", c_calibrate_without_out, ["--out"]),
    ("no_deck_argument", c_no_deck, ["deck"]),
    ("deck_missing", c_deck_missing, ["no_such_deck.toml"]),
    ("toml_syntax_error", c_toml_syntax, ["syntax.toml:2:"]),
    ("unknown_key", c_unknown_key, ["deck.toml", "runtime.threds", "runtime.threads"]),
    ("wrong_type", c_wrong_type, ["deck.toml", "model.n_layer", "integer"]),
    ("d_model_not_divisible_by_n_head", c_d_model_n_head,
     ["deck.toml", "model.d_model", "model.n_head"]),
    ("lr_out_of_range", c_lr_range, ["deck.toml", "train.lr"]),
    ("bad_schedule", c_bad_schedule, ["deck.toml", "parallel.schedule", "2f2b"]),
    ("bad_set_syntax", c_bad_set_syntax, ["--set", "section.key=value"]),
    ("set_unknown_key", c_set_unknown_key, ["train.lrr", "did you mean"]),
    ("bf16_on_cpu", c_bf16_on_cpu, ["deck.toml", "runtime.precision"]),
    ("global_batch_not_divisible", c_batch_divisibility,
     ["deck.toml", "train.global_batch_size", "parallel.micro_batch_size"]),
    ("vpp_needs_interleaving_schedule", c_vpp_needs_schedule,
     ["deck.toml", "parallel.vpp", "parallel.schedule"]),
    ("n_layer_fewer_than_pp_vpp", c_vpp_layers,
     ["deck.toml", "model.n_layer", "parallel.pp * parallel.vpp"]),
    ("vpp_needs_pp", c_vpp_needs_pp, ["deck.toml", "parallel.vpp", "parallel.pp"]),
    ("watchdog_negative", c_watchdog_negative, ["deck.toml", "runtime.watchdog_s"]),
    ("cuda_graphs_on_cpu", c_cuda_graphs_on_cpu,
     ["deck.toml", "runtime.cuda_graphs", 'runtime.device = "cuda"', '"cpu"']),
    ("trace_step_past_the_end", c_trace_step_past_end, ["deck.toml", "io.trace_step", "train.steps"]),
    ("unknown_subcommand", c_unknown_subcommand, ["frobnicate"]),
    ("data_train_missing", c_data_missing, ["missing_tokens.h5"]),
    ("data_train_not_hdf5", c_data_not_hdf5, ["plain_text.h5"]),
    ("token_id_out_of_vocab", c_token_out_of_vocab, ["big_ids.h5"]),
    ("resume_checkpoint_missing", c_resume_missing, ["no_such_ckpt.h5"]),
    ("grad_weights_wrong_shape", c_grad_weights_shape, ["h.0.mlp.c_fc.weight"]),
    ("grad_batch_missing_targets", c_grad_no_targets, ["targets"]),
]


# --- running --------------------------------------------------------------------------------

def run_case(exe, base, name, setup, needles):
    """Returns (ok, error line or what went wrong, details for the log)."""
    d = os.path.join(base, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    argv = [exe] + setup(d)
    cmd = " ".join(shlex.quote(a) for a in argv)
    t0 = time.monotonic()
    p = subprocess.Popen(argv, cwd=d, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return False, f"(hung: killed after {TIMEOUT_S} s)", f"$ {cmd}\n{err}"
    elapsed = time.monotonic() - t0
    with open(os.path.join(d, "stderr.txt"), "w") as f:
        f.write(err)
    with open(os.path.join(d, "stdout.txt"), "w") as f:
        f.write(out)

    lines = [l for l in err.splitlines() if l.strip()]
    errors = [l for l in lines if l.startswith(PREFIX)]
    shown = errors[0] if errors else (lines[0] if lines else "(no stderr)")
    problems = []
    if p.returncode == 0:
        problems.append("exit status 0")
    elif p.returncode < 0:
        problems.append(f"killed by signal {-p.returncode}")
    if len(errors) != 1:
        problems.append(f"{len(errors)} lines start with '{PREFIX}'")
    others = [l for l in lines if not l.startswith(PREFIX) and not l.startswith(ALLOWED)]
    if others:
        problems.append(f"stderr has {len(others)} line(s) that are neither the error nor a warning")
    if errors and lines.index(errors[0]) != len(lines) - 1:
        problems.append("stderr goes on after the error line")
    if errors:
        missing = [n for n in needles if n.lower() not in errors[0].lower()]
        if missing:
            problems.append("the error line does not name " + ", ".join(repr(n) for n in missing))
    detail = (f"$ {cmd}  (in {d}; exit {p.returncode}, {elapsed:.1f} s)\n"
              + "".join(f"  stderr: {l}\n" for l in lines[:20]))
    if problems:
        return False, f"{shown}  <-- " + "; ".join(problems), detail
    return True, shown, detail


def main():
    exe = os.environ.get("TRIDENT")
    if not exe or not os.access(exe, os.X_OK):
        print(f"{TEST}: FAIL: $TRIDENT is not set to an executable trident binary (got {exe!r})")
        return 1
    exe = os.path.abspath(exe)
    base = os.path.join(os.environ.get("TRIDENT_TEST_OUT", os.path.join(os.getcwd(), "test-out")),
                        TEST)
    os.makedirs(base, exist_ok=True)
    # One rank, few threads: every case must fail before any real work.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    wanted = set(sys.argv[1:])
    unknown = wanted - {c[0] for c in CASES}
    if unknown:
        print(f"{TEST}: unknown case(s): {', '.join(sorted(unknown))}")
        return 1
    results = []
    for name, setup, needles in CASES:
        if wanted and name not in wanted:
            continue
        ok, line, detail = run_case(exe, base, name, setup, needles)
        results.append((name, ok, line, detail))

    width = max(len(r[0]) for r in results)
    print(f"{'case':<{width}}  result  error line")
    print(f"{'-' * width}  ------  ----------")
    for name, ok, line, _ in results:
        print(f"{name:<{width}}  {'ok' if ok else 'FAIL':<6}  {line}")
    failed = [r for r in results if not r[1]]
    for name, _, _, detail in failed:
        print(f"\n--- {name} ---\n{detail}", end="")
    print(f"\n{TEST}: {len(results) - len(failed)} of {len(results)} cases ok"
          + (f"; FAILED: {', '.join(r[0] for r in failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
