"""cuDNN attention's loading and fallback (src/ops/cuda/cudnn_attention.hpp) in real bf16
training on runtime.device = "cuda": the CPU stand-in under emulate/train.sh (where cuDNN can
never run: its loader and fallback are the real code when the cuDNN headers are on the build
machine, a stub otherwise), or a GPU under bench/gpu_check.sh.
Runs the same 3 steps four ways: TRIDENT_CUDNN=0, TRIDENT_CUDNN_LIBRARY=/nonexistent, the
default, and TRIDENT_CUDA_BASELINE=1. Checks: each refusal prints exactly one line
"cuDNN attention unavailable (REASON): using trident's kernel" on stderr naming its reason
(TRIDENT_CUDNN=0; "cannot load /nonexistent"), the baseline prints none (no cuDNN path at all),
and the /nonexistent run's losses are bit for bit the TRIDENT_CUDNN=0 run's. The
default run: where it printed the line (no usable cuDNN: the stand-in) the same bit-for-bit
check; where cuDNN ran (its rows in the per-op table), its losses must be within 1e-3
relative of the kernel's (bf16 products either way), and with no line at all every call went
to cuDNN (both cudnn rows, no plain attention row). TRIDENT_CUDNN_LIBRARY, where the caller set
it (bench/gpu_check.sh), holds for the default run.
usage: TRIDENT=... TRIDENT_TEST_OUT=... python3 cudnn_fallback.py
"""
import json
import os
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.environ.get("TRIDENT_SOURCE_DIR", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "..")), "test", "mpi"))
import layout_common as lc  # noqa: E402

V, T, L, H, C = 64, 16, 2, 4, 32  # head size 8: a shape cuDNN takes
MBS, GBS, STEPS = 2, 8, 3
SETS = ['runtime.device="cuda"', 'runtime.precision="bf16"']
LINE = "cuDNN attention unavailable ("


def train(t, out, env_extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRIDENT_CUDNN", "TRIDENT_CUDA_BASELINE", "TRIDENT_OP_TIMING")}
    env.update(env_extra)
    cmd = [lc.TRIDENT, "train", "deck.toml", "--set", f"io.out_dir={out}"]
    for kv in SETS:
        cmd += ["--set", kv]
    p = subprocess.run(cmd, cwd=t.out, capture_output=True, text=True, timeout=300, env=env)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}")
    with h5py.File(t.path(out, "metrics.h5"), "r") as f:
        loss = f["loss"][:]
    lines = [ln for ln in p.stderr.splitlines() if LINE in ln]
    return loss, lines


def main():
    t = lc.LayoutTest("cuda.cudnn_fallback", lc.deck_text(V, T, L, H, C, MBS, GBS, STEPS, 1), V,
                      T, GBS, 13)
    kernel, off_lines = train(t, "off", {"TRIDENT_CUDNN": "0"})
    t.check(len(off_lines) == 1 and "(TRIDENT_CUDNN=0)" in off_lines[0],
            f"TRIDENT_CUDNN=0: one line naming it ({off_lines})")
    missing, miss_lines = train(t, "missing", {"TRIDENT_CUDNN_LIBRARY": "/nonexistent"})
    stub = any("no cuDNN headers" in ln for ln in miss_lines)
    t.check(len(miss_lines) == 1 and ("cannot load /nonexistent" in miss_lines[0] or stub),
            f"TRIDENT_CUDNN_LIBRARY=/nonexistent: one line naming it ({miss_lines})")
    t.check(np.array_equal(missing, kernel),
            f"/nonexistent: losses bit for bit the kernel's ({missing} vs {kernel})")
    base, base_lines = train(t, "baseline", {"TRIDENT_CUDA_BASELINE": "1"})
    t.check(not base_lines and len(base) == len(kernel),
            f"TRIDENT_CUDA_BASELINE=1: trains, no cuDNN line ({base_lines})")

    table_path = t.path("ops-default.json")
    default, lines = train(t, "default", {"TRIDENT_OP_TIMING": table_path})
    with open(table_path) as f:
        rows = {r["op"]: r["calls"] for r in json.load(f)["ops"]}
    ran = [op for op in ("attention_forward cudnn", "attention_backward cudnn") if rows.get(op)]
    t.check(len(lines) <= 1, f"default: at most one line ({lines})")
    if not ran:
        t.check(len(lines) == 1, f"default: cuDNN never ran, and the line says why ({lines})")
        t.check(np.array_equal(default, kernel),
                f"default: losses bit for bit the kernel's ({default} vs {kernel})")
    else:
        print(f"default: cuDNN attention ran ({', '.join(ran)})" +
              (f"; refused once: {lines[0]}" if lines else ""))
        if not lines:
            for op in ("attention_forward cudnn", "attention_backward cudnn"):
                t.check(rows.get(op, 0) > 0, f"default: '{op}' in the per-op table ({rows.get(op)})")
            for op in ("attention_forward", "attention_backward"):
                t.check(op not in rows, f"default: no '{op}' row: every call went to cuDNN")
        rel = float(np.max(np.abs(default - kernel) / np.abs(kernel)))
        t.check(rel <= 1e-3, f"default: losses within 1e-3 of the kernel's ({rel:.2e})")
    t.finish()


if __name__ == "__main__":
    main()
