"""TRIDENT_CUDA_LT_TUNE (src/ops/cuda/lt_tune.hpp) in real training under runtime.precision =
"bf16" on the CPU stand-in, whose cuBLASLt offers three algorithms of identical math
(shim/cublasLt.h), the heuristic's first made slow (TRIDENT_EMU_LT_SLOW_ALGO) so that tuning
moves every plan off it. Checked:
  tuned        the loss curve equals the untuned bit for bit; one summary line on stderr
  file         TRIDENT_CUDA_LT_TUNE=FILE writes one entry per plan; a second run reads them all,
               times nothing (the slow knob moved: a re-tune would choose differently), same curve
  foreign      the file's entries made another device's plus an unreadable line: one line says
               so, every shape is tuned again, same curve
  resume       2 steps and a checkpoint with FILE, then the rest from it: the resumed process
               reads every shape from FILE (the plan keys, pointer alignments included, are
               the same after a resume) and times none; the curve is the untuned resume's
  dp2          each rank keeps its own file (FILE, FILE.rank1), same curve as untuned dp2
  llama        Llama (grouped-query) the same way: tuned = untuned bit for bit, the file's second
               run reads every shape and times none
Both models' files hold bf16-D gemm plans (the fused blocks' gemm_rm16_to16: GPT-2's attention
c_proj backward, Llama's o and down) beside the fp32-D gemm and bias_lt plans; each file check
says the three counts.
usage: TRIDENT=... TRIDENT_TEST_OUT=... python3 lt_tune.py (emulate/train.sh)
"""
import os
import re
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.environ.get("TRIDENT_SOURCE_DIR", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "..")), "test", "mpi"))
import layout_common as lc  # noqa: E402

V, T, L, H, C = 64, 16, 2, 4, 32
MBS, GBS, STEPS = 2, 8, 3
BF16 = ['runtime.device="cuda"', 'runtime.precision="bf16"', "io.checkpoint_every=0",
        "train.eval_every=0"]
SUMMARY = re.compile(r"cuBLASLt tuning \(TRIDENT_CUDA_LT_TUNE\): (\d+) shape\(s\) timed .*?, "
                     r"(\d+) with one candidate, (\d+) read from")


class Test(lc.LayoutTest):
    run_timeout = 300  # the shim's slow candidates sleep while tuning


def train(t, np_, name, env, sets=()):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update({k: v for k, v in env.items() if v is not None})
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
    try:
        curve, = t.train(np_, name, sets=[*BF16, *sets])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return curve, [tuple(map(int, m)) for m in SUMMARY.findall(t.last_stderr)], t.last_stderr


def entries(path):
    with open(path) as f:
        return [l for l in f if l.strip() and not l.startswith("#")]


def kinds(path):
    """The file's plans by kind (matmul.cpp's keys): bias_lt, gemm_lt16 with fp32 D (key word 5
    bit 62), with bf16 D (bits 62 and 29: gemm_rm16_to16)."""
    n = {"bias_lt": 0, "gemm fp32 D": 0, "gemm bf16 D": 0}
    for line in entries(path):
        word = int(line.split()[6])
        n["bias_lt" if not word >> 62 & 1 else "gemm bf16 D" if word >> 29 & 1 else "gemm fp32 D"] += 1
    return n


def main():
    t = Test("cuda.lt_tune", lc.deck_text(V, T, L, H, C, MBS, GBS, STEPS, 1), V, T, GBS, 17)
    off = {"TRIDENT_CUDA_LT_TUNE": None, "TRIDENT_EMU_LT_SLOW_ALGO": None}
    plain, lines, _ = train(t, 1, "plain", off)
    t.check(lines == [], "untuned: no tuning line")
    tuned, lines, _ = train(t, 1, "tuned", {"TRIDENT_CUDA_LT_TUNE": "1",
                                            "TRIDENT_EMU_LT_SLOW_ALGO": "11"})
    t.check(np.array_equal(tuned, plain), f"tuned: {len(plain)} losses equal the untuned bit for bit")
    t.check(len(lines) == 1 and lines[0][0] > 0 and lines[0][2] == 0,
            f"tuned: one line, shapes timed, none read ({lines})")

    path = t.path("choices.txt")
    first, lines, _ = train(t, 1, "file1", {"TRIDENT_CUDA_LT_TUNE": path,
                                            "TRIDENT_EMU_LT_SLOW_ALGO": "11"})
    n = len(entries(path)) if os.path.exists(path) else 0
    t.check(np.array_equal(first, plain), "file, first run: same curve")
    t.check(len(lines) == 1 and n > 0 and lines[0][0] + lines[0][1] == n,
            f"file, first run: one entry per tuned plan ({n} entries, {lines})")
    k = kinds(path)
    t.check(min(k.values()) > 0, f"file, first run: every kind of plan tuned ({k})")
    second, lines, _ = train(t, 1, "file2", {"TRIDENT_CUDA_LT_TUNE": path,
                                             "TRIDENT_EMU_LT_SLOW_ALGO": "12,13"})
    t.check(np.array_equal(second, plain), "file, second run: same curve")
    t.check(lines == [(0, 0, n)], f"file, second run: all {n} read, nothing timed ({lines})")

    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        for line in text.splitlines():
            f.write(line if line.startswith("#") else "other_card" + line[line.index(" "):])
            f.write("\n")
        f.write("this is no entry\n")
    foreign, lines, err = train(t, 1, "foreign", {"TRIDENT_CUDA_LT_TUNE": path,
                                                  "TRIDENT_EMU_LT_SLOW_ALGO": "11"})
    said = [l for l in err.splitlines() if "another device" in l]
    t.check(np.array_equal(foreign, plain), "foreign/corrupt file: same curve")
    t.check(len(said) == 1 and "1 unreadable line(s)" in said[0] and f"{n} entries" in said[0],
            f"foreign/corrupt file: one line says so ({said})")
    t.check(len(lines) == 1 and lines[0][2] == 0 and lines[0][0] + lines[0][1] == n,
            f"foreign/corrupt file: every shape tuned again ({lines})")
    t.check(len(entries(path)) == 2 * n, "foreign/corrupt file: rewritten with both devices' entries")

    # a resume: 2 steps and a checkpoint, then the rest, both with the same file
    path_r = t.path("choices-resume.txt")
    env = {"TRIDENT_CUDA_LT_TUNE": path_r, "TRIDENT_EMU_LT_SLOW_ALGO": "11"}
    half = ["io.checkpoint_every=2"]
    _, lines1, _ = train(t, 1, "resume", env, [*half, "train.steps=2"])
    env["TRIDENT_EMU_LT_SLOW_ALGO"] = "12,13"  # a re-tune would choose differently
    resumed, lines2, _ = train(t, 1, "resume", env, [*half, 'io.resume="auto"'])
    n1 = lines1[0][0] + lines1[0][1] if lines1 else -1
    train(t, 1, "resume-plain", off, [*half, "train.steps=2"])
    resumed_plain, _, _ = train(t, 1, "resume-plain", off, [*half, 'io.resume="auto"'])
    t.check(len(resumed) == STEPS and np.array_equal(resumed, resumed_plain),
            f"resume at step 2: {len(resumed)} losses equal the untuned resume's")
    t.check(lines2 == [(0, 0, n1)], f"resume: all {n1} shapes read, none timed ({lines1} then {lines2})")

    if shutil.which("mpirun"):
        dp = ["parallel.dp=2", "parallel.grad_bucket_mb=0.02"]
        plain2, _, _ = train(t, 2, "plain-dp2", off, dp)
        path2 = t.path("choices-dp2.txt")
        tuned2, lines, _ = train(t, 2, "tuned-dp2", {"TRIDENT_CUDA_LT_TUNE": path2,
                                                     "TRIDENT_EMU_LT_SLOW_ALGO": "11"}, dp)
        t.check(np.array_equal(tuned2, plain2), "dp2: tuned curve equals the untuned")
        t.check(len(lines) == 2 and os.path.exists(path2) and os.path.exists(path2 + ".rank1"),
                f"dp2: one line per rank, FILE and FILE.rank1 written ({lines})")
    # Llama (grouped-query): its fused block's products, [q k v] and [gate up] without a bias
    llama = ['model.arch="llama"', "model.n_kv_head=2"]
    plain_l, _, _ = train(t, 1, "plain-llama", off, llama)
    path_l = t.path("choices-llama.txt")
    tuned_l, lines, _ = train(t, 1, "tuned-llama", {"TRIDENT_CUDA_LT_TUNE": path_l,
                                                    "TRIDENT_EMU_LT_SLOW_ALGO": "11"}, llama)
    n_l = len(entries(path_l)) if os.path.exists(path_l) else 0
    k = kinds(path_l) if n_l else {}
    t.check(np.array_equal(tuned_l, plain_l), f"llama: {len(plain_l)} losses equal the untuned bit for bit")
    t.check(len(lines) == 1 and n_l > 0 and lines[0][0] + lines[0][1] == n_l and
            min(k.values()) > 0, f"llama: one entry per tuned plan, every kind ({k}, {lines})")
    again_l, lines, _ = train(t, 1, "again-llama", {"TRIDENT_CUDA_LT_TUNE": path_l,
                                                    "TRIDENT_EMU_LT_SLOW_ALGO": "12,13"}, llama)
    t.check(np.array_equal(again_l, plain_l) and lines == [(0, 0, n_l)],
            f"llama, file's second run: same curve, all {n_l} read, nothing timed ({lines})")
    t.finish()


if __name__ == "__main__":
    main()
