"""Long-sequence attention benchmark (bench/run.sh runs it; issue 18), all in this one run on the
same threads:
  1. causal attention forward + backward at T = 512, 1024, 2048, 4096 (d_model 768, 12 heads,
     batch 1): trident's flash path, trident's T x T path (attention_naive_*), and PyTorch's
     scaled_dot_product_attention (bench/attention_torch.py); with each trident path's
     attention buffers (flash: [B,NH,T] log-sum-exp; T x T: att + datt);
  2. the whole training step at T = 2048 (1 layer, d_model 768, 12 heads, batch 1):
     `trident train`'s median step time and its peak RSS (wait4's ru_maxrss), for this build
     and, when BENCH_BEFORE_TRIDENT names another trident binary (one from before flash
     attention), for that one too; the two alternate BENCH_STEP_ROUNDS times (default 3) and
     the medians of the runs' median step times are compared.
Goals: memory linear in T; the step at T = 2048 >= 1.3x faster than before.
usage: attention_bench.py --build BUILD [--json PATH]
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.environ.get("PYTHON", "/usr/bin/python3")
THREADS = int(os.environ.get("BENCH_THREADS", "2"))
LENGTHS = [512, 1024, 2048, 4096]
STEP_T = 2048
STEPS = int(os.environ.get("BENCH_ATTENTION_STEPS", "6"))
ROUNDS = int(os.environ.get("BENCH_STEP_ROUNDS", "3"))


def log(msg):
    print(f"attention bench: {msg}", file=sys.stderr, flush=True)


def env_threads():
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(THREADS), OPENBLAS_NUM_THREADS=str(THREADS),
               OMP_WAIT_POLICY="PASSIVE")
    return env


def json_lines(cmd, env):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        log(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-400:]}")
        return []
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def run_step(trident, work, name, env):
    """Median step time (s) and peak RSS (bytes) of `trident train` at T = STEP_T."""
    out = os.path.join(work, name)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [trident, "train", os.path.join(work, "deck.toml"), "--set", f"io.out_dir={out}"]
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    text = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        log(f"{name}: trident train failed:\n{text[-1500:]}")
        return None
    import h5py
    with h5py.File(os.path.join(out, "metrics.h5"), "r") as f:
        times = list(f["step_time_s"][:])
    return statistics.median(times[1:] if len(times) > 1 else times), usage.ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--json")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    env = env_threads()
    work = os.path.join(a.build, "bench-work", "attention")
    os.makedirs(work, exist_ok=True)

    rows = {}
    kernel = os.path.join(a.build, "bench", "trident_bench_attention")
    for r in json_lines([kernel, "--threads", str(THREADS), *map(str, LENGTHS)], env):
        rows.setdefault(r["t"], {})[r["path"]] = r
    for r in json_lines([PYTHON, os.path.join(HERE, "attention_torch.py"), "--threads",
                         str(THREADS), *map(str, LENGTHS)], env):
        rows.setdefault(r["t"], {})[r["path"]] = r

    # The whole step at T = 2048 on generated text (byte tokenizer).
    trident = os.path.join(a.build, "trident")
    rng = random.Random(1)
    words = "the and of to in that he shall unto for his a lord they be is him not".split()
    with open(os.path.join(work, "corpus.txt"), "w") as f:
        f.write("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(8000)))
    subprocess.run([trident, "prepare-data", "--input", "corpus.txt", "--output", "train.h5"],
                   cwd=work, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(work, "deck.toml"), "w") as f:
        f.write(f"""[model]
vocab_size = 0
seq_len = {STEP_T}
n_layer = 1
n_head = 12
d_model = 768
[parallel]
micro_batch_size = 1
[train]
steps = {STEPS}
warmup_steps = 0
global_batch_size = 1
[data]
train = "train.h5"
[runtime]
threads = {THREADS}
""")
    # The machine may be shared: before and after alternate, ROUNDS times each, and the medians
    # are compared (with the spread printed).
    binaries = {"after": trident}
    before = os.environ.get("BENCH_BEFORE_TRIDENT")
    if before:
        binaries["before"] = before
    runs = {name: [] for name in binaries}
    for _ in range(ROUNDS):
        for name, binary in binaries.items():
            r = run_step(binary, work, name, env)
            if r:
                runs[name].append(r)
    steps = {name: (statistics.median(x[0] for x in v), max(x[1] for x in v),
                    min(x[0] for x in v), max(x[0] for x in v))
             for name, v in runs.items() if v}

    kind = next((r["torch"].get("kind") for r in rows.values() if "torch" in r), "-")
    print(f"\nPyTorch: {kind} ('math' = softmax(q k^T) v written out: this torch has no SDPA)")
    print(f"\nCausal attention forward + backward, d_model 768, 12 heads, batch 1, {THREADS} threads "
          "(ms, median; attention buffers in MiB)")
    print(f"{'T':>6} {'flash':>9} {'T x T':>9} {'torch sdpa':>11} {'flash/torch':>12} "
          f"{'T x T/flash':>12} {'flash MiB':>10} {'T x T MiB':>10}")
    for t in sorted(rows):
        r = rows[t]
        fl, nv, th = (r.get(k, {}).get("ms") for k in ("flash", "naive", "torch"))
        fb, nb = (r.get(k, {}).get("bytes") for k in ("flash", "naive"))

        def f(v, spec):
            return format(v, spec) if v is not None else "-"
        print(f"{t:>6} {f(fl, '9.1f')} {f(nv, '9.1f')} {f(th, '11.1f')} "
              f"{f(fl / th if fl and th else None, '12.2f')} "
              f"{f(nv / fl if fl and nv else None, '12.2f')} "
              f"{f(fb / 2**20 if fb else None, '10.2f')} {f(nb / 2**20 if nb else None, '10.1f')}")
    print(f"\nWhole training step at T = {STEP_T} (1 layer, d_model 768, 12 heads, batch 1):")
    for name, v in steps.items():
        print(f"  {name:6s}: {v[0] * 1e3:8.1f} ms/step (median of {len(runs[name])} runs; "
              f"{v[2] * 1e3:.0f}..{v[3] * 1e3:.0f}), peak RSS {v[1] / 2**20:7.1f} MiB")
    if steps.get("before") and steps.get("after"):
        print(f"  speed-up {steps['before'][0] / steps['after'][0]:.2f}x (goal >= 1.3x), "
              f"memory {steps['after'][1] / steps['before'][1]:.2f}x")
        # What attention could give at most: the step if the flash forward + backward were free.
        fl = rows.get(STEP_T, {}).get("flash", {}).get("ms")
        if fl and steps["after"][0] * 1e3 > fl:
            rest = steps["after"][0] - fl / 1e3
            print(f"  the step without attention ~{rest * 1e3:.0f} ms: at most "
                  f"{steps['before'][0] / rest:.2f}x with attention free")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"attention": rows, "step": steps, "step_runs": runs, "threads": THREADS}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
