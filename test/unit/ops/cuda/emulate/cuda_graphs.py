"""runtime.cuda_graphs in real training on the CUDA backend: from the second step each
microbatch's forward and backward is one CUDA graph (pipeline/executor.cpp, ops/cuda/graphs.cpp),
captured once and launched for every later microbatch. A graph replays the same kernels on
the same buffers, so the losses and the final weights must be those of eager training bit for
bit; the end-of-run line "CUDA graphs: N captured, M microbatches launched as graphs" must
count launches (> 0), so that the check cannot pass by running eagerly. Cases: GPT-2 fp32;
GPT-2 bf16 (the fused block and head); GPT-2 bf16 with TRIDENT_CUDA_FUSED_HEAD=0; Llama bf16
with selective recompute; GPT-2 bf16 with full recompute; with evaluation and a checkpoint
between launches; dp 2 with ZeRO-1 in bf16 with evaluation (the bucket sync after the last
microbatch; the weight cache stale after the all-gather, fresh after the evaluation). Refused:
gpipe (its backward does not follow its forward), pipedream-2bw, pp 2.
Failures (the stand-in's TRIDENT_EMU_CAPTURE_FAIL): the capture invalidated at its end, a
cuBLAS call refused half way through the forward, the capture refused at its start, the
instantiation refused: one line "CUDA graphs: capture failed (...): microbatches run
eagerly", no launches, and the same losses and weights. 4 steps of 2 microbatches a case.
usage: TRIDENT=... TRIDENT_TEST_OUT=... python3 cuda_graphs.py (emulate/train.sh, gpu_check.sh)
"""
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.environ.get("TRIDENT_SOURCE_DIR", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "..")), "test", "mpi"))
import layout_common as lc  # noqa: E402

V, T, L, H, C = 64, 16, 2, 4, 32
MBS, GBS, STEPS = 2, 4, 4
CUDA = ['runtime.device="cuda"', "train.eval_every=0"]
LINE = re.compile(r"CUDA graphs: (\d+) captured, (\d+) microbatches launched as graphs, (\d+) eager")


def weights(t, out_dir):
    """Every dataset of the run's final checkpoint."""
    ckpt = t.path(out_dir, "checkpoints", f"step-{STEPS:08d}.h5")
    found = {}
    with h5py.File(ckpt, "r") as f:
        f.visititems(lambda n, o: found.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return found


def run(t, np_, name, sets, env=None):
    """(losses, weights, (captured, launched, eager) or None, stderr) of one training run."""
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        loss, = t.train(np_, name, sets=sets)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    m = LINE.search(t.last_stdout + t.last_stderr)
    return loss, weights(t, name), tuple(int(g) for g in m.groups()) if m else None, t.last_stderr


def same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def main():
    t = lc.LayoutTest("cuda.graphs", lc.deck_text(V, T, L, H, C, MBS, GBS, STEPS, 1), V, T, GBS, 17)
    mpi = shutil.which("mpirun") is not None
    bf16 = ['runtime.precision="bf16"']
    cases = [("gpt2-fp32", 1, [], {}),
             ("gpt2-bf16", 1, bf16, {}),
             ("gpt2-bf16-composed-head", 1, bf16, {"TRIDENT_CUDA_FUSED_HEAD": "0"}),
             ("llama-bf16-selective", 1, [*bf16, 'model.arch="llama"',
                                          'parallel.recompute="selective"'], {}),
             ("gpt2-bf16-full-recompute", 1, [*bf16, 'parallel.recompute="full"'], {}),
             # evaluation (its own executor) and a checkpoint between the launches
             ("gpt2-bf16-eval-checkpoint", 1, [*bf16, "train.eval_every=1",
                                               'data.valid="tokens.h5"', "train.eval_batches=3",
                                               "io.checkpoint_every=2"], {})]
    if mpi:
        # bf16 with evaluation: ZeRO-1's all-gather makes the weight cache stale after each
        # step, the evaluation fresh again (Ops::before_graph converts before each launch)
        cases.append(("gpt2-bf16-dp2-zero-eval", 2, [*bf16, "parallel.dp=2", "parallel.zero_stage=1",
                                                    "parallel.grad_bucket_mb=0.02",
                                                    "train.eval_every=1", 'data.valid="tokens.h5"',
                                                    "train.eval_batches=2"], {}))
    microbatches = GBS // MBS
    eager = {}
    for name, np_, sets, env in cases:
        eager_loss, eager_w, line, _ = run(t, np_, f"eager-{name}", [*CUDA, *sets], env)
        eager[name] = eager_loss, eager_w
        t.check(line is None, f"{name}: no graphs line without runtime.cuda_graphs")
        loss, w, line, _ = run(t, np_, f"graphs-{name}", [*CUDA, *sets, "runtime.cuda_graphs=true"],
                               env)
        want = (1, (STEPS - 1) * microbatches // np_, 0)  # one slot; rank 0's count
        t.check(line == want, f"{name}: captured, launched, eager = {line} (expected {want})")
        t.check(np.array_equal(loss, eager_loss),
                f"{name}: {len(loss)} losses with graphs equal eager ones bit for bit "
                f"(max |d| {float(np.max(np.abs(loss - eager_loss))):.2e})")
        t.check(same(w, eager_w), f"{name}: the final weights ({len(w)} tensors) equal bit for bit")

    # Failures (the stand-in's knob): the microbatch whose capture failed runs eagerly, and
    # every later one. On a GPU the knob does nothing: skipped there.
    eager_loss, eager_w = eager["gpt2-bf16"]
    stand_in = "emulated GPU (trident CPU shim)" in t.last_stdout
    print(("" if stand_in else "skipped (a GPU: no TRIDENT_EMU_CAPTURE_FAIL) ") + "capture failures")
    for knob in ("end", "cublas", "begin", "instantiate") if stand_in else ():
        loss, w, line, err = run(t, 1, f"fail-{knob}", [*CUDA, *bf16, "runtime.cuda_graphs=true"],
                                 {"TRIDENT_EMU_CAPTURE_FAIL": knob})
        lines = [x for x in err.splitlines() if x.startswith("CUDA graphs: capture failed (")]
        t.check(len(lines) == 1 and lines[0].endswith("microbatches run eagerly"),
                f"{knob}: one line {lines[:1]}")
        want = (0, 0, (STEPS - 1) * microbatches)
        t.check(line == want, f"{knob}: captured, launched, eager = {line} (expected {want})")
        t.check(np.array_equal(loss, eager_loss) and same(w, eager_w),
                f"{knob}: losses and weights equal eager training's bit for bit")

    # Refused: one line naming the keys, a non-zero exit (every rank).
    refusals = [("gpipe", 1, ['parallel.schedule="gpipe"'], "parallel.schedule = gpipe"),
                ("pipedream-2bw", 1, ['parallel.schedule="pipedream-2bw"'],
                 "one synchronous weight update a step")]
    if mpi:
        refusals += [("pp2", 2, ["parallel.pp=2"], "expected parallel.tp = 1, parallel.pp = 1")]
    for name, np_, sets, words in refusals:
        cmd = [lc.TRIDENT, "train", "deck.toml"]
        for kv in [*CUDA, *sets, "runtime.cuda_graphs=true", f"io.out_dir=refused-{name}"]:
            cmd += ["--set", kv]
        if np_ > 1:
            cmd = ["mpirun", "-np", str(np_), "--oversubscribe", *cmd]
        p = subprocess.run(cmd, cwd=t.out, capture_output=True, text=True, timeout=120)
        errors = [x for x in (p.stdout + p.stderr).splitlines() if x.startswith("trident: error:")]
        t.check(p.returncode != 0 and len(errors) == 1 and "runtime.cuda_graphs" in errors[0] and
                words in errors[0], f"refused {name}: {errors[:1]}")
    t.finish()


if __name__ == "__main__":
    main()
