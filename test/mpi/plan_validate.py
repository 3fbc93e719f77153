"""mpi.plan_validate — `trident plan`'s predictions against `trident train` (issue 21), on this
machine with a calibration made in the test.

Step time, one rank: `trident calibrate` (the rank and thread count the runs have), then
`trident plan --validate 6 --spread`: six layouts spread evenly over the planner's ranking of a
4-layer d_model 128 model (T = 256, global batch 8: micro-batch sizes and recomputation),
each run for 6 steps through `trident train`. Holds each predicted step time within 25% of the
measured one and the Spearman correlation of predicted and measured times >= 0.8. Against
noise (2 cores shared with other tests): the measured time is the median of steps 2..6; the
prediction is made from the mean of two calibrations, one just before the runs and one just
after (the machine over the time the runs took; each figure itself the mean over five rounds:
the share of the cores a step sees, preemptions included); up to two more attempts (each a fresh calibration
and validation) are made when one misses, all printed: a busy moment (the load of the other
tests changes within seconds) spoils an attempt, a wrong model every one. Several ranks on 2 shared cores are not held to 25%: a rank that waits gives
its core to the others, so the pipeline bubble and TP waits the model charges (for ranks with
a core each) partly vanish here; their figures are in the issue's note.

Peak memory (world rank 0, `trident train`'s measured RSS high-water mark): the six runs above
and three layouts of a 2-layer d_model 256 model at T = 512 on 2 ranks (tp, pp, dp; one step
each). Within 10% + 12 MiB: the planner's prediction is the start-up report's
(model::predict_memory); what the process touches after start-up outside the model (OpenBLAS
and MPI buffers, the dataset reader: ~4-12 MiB here) is not in it, so small layouts carry that
constant (mpi.memory_report holds 10% on layouts of ~0.5-1 GiB). ~60 s on 2 cores when the first attempt holds, ~35 s more per extra attempt.
"""

import json
import tomllib
import os
import random
import subprocess
import sys

TRIDENT = os.environ["TRIDENT"]
OUT = os.path.join(os.environ.get("TRIDENT_TEST_OUT", "/tmp"), "mpi.plan_validate")
TIME_TOL = 0.25
SPEARMAN_MIN = 0.8
MEM_REL, MEM_ABS_MIB = 0.10, 12.0
ATTEMPTS = 3
STEPS = 6

DECK_A = """[model]
vocab_size = 0
seq_len = 256
n_layer = 4
n_head = 4
d_model = 128
[parallel]
micro_batch_size = 2
[train]
steps = 5
warmup_steps = 0
global_batch_size = 8
[data]
train = "train.h5"
[io]
out_dir = "out-a"
[runtime]
threads = 1
"""

DECK_B = DECK_A.replace("seq_len = 256", "seq_len = 512").replace("n_layer = 4", "n_layer = 2") \
    .replace("d_model = 128", "d_model = 256").replace('"out-a"', '"out-b"')


def run(cmd, timeout=400):
    p = subprocess.run(cmd, cwd=OUT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        print(f"FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        sys.exit(1)
    return p.stdout


def validate(deck, k, steps, ranks):
    out = run([TRIDENT, "plan", deck, "--machine", "machine.toml", "--ranks-per-node",
               str(ranks), "--validate", str(k), "--spread", "--validate-steps", str(steps),
               "--json", "--top", "1", "--launcher", "mpirun --oversubscribe -np {np}"])
    return json.loads(out)


def check_memory(rows, fails):
    for v in rows:
        pred, meas = v["predicted_rank0_peak_mib"], v["measured_rank0_peak_mib"]
        ok = abs(meas - pred) <= MEM_REL * pred + MEM_ABS_MIB
        print(f"  memory {v['layout']:52s} predicted {pred:7.1f} MiB measured {meas:7.1f} MiB "
              f"({pred / meas - 1:+.1%}) {'ok' if ok else 'FAIL'}")
        if not ok:
            fails.append(f"{v['layout']}: peak predicted {pred:.1f} MiB, measured {meas:.1f} MiB")


def calibrate(out):
    print(run([TRIDENT, "calibrate", "a.toml", "--out", out, "--min-seconds", "0.1"]).strip())
    with open(os.path.join(OUT, out), "rb") as f:
        return tomllib.load(f)


def toml_value(v):
    return f'"{v}"' if isinstance(v, str) else repr(v)


def write_mean_machine(a, b, out):
    """The figures of two calibrations averaged (rates and latencies alike), as a machine
    file: the machine over the time the runs took, not at one end of it."""
    def mean(x, y):
        return x if isinstance(x, (str, int)) and not isinstance(x, float) and x == y or \
            isinstance(x, str) else (x + y) / 2
    lines = []
    for section in ("machine", "compute", "intra", "inter"):
        lines.append(f"[{section}]")
        for k, v in a[section].items():
            if k == "gemm":
                continue
            lines.append(f"{k} = {toml_value(mean(v, b[section][k]))}")
    for ga, gb in zip(a["compute"].get("gemm", []), b["compute"].get("gemm", [])):
        lines.append("[[compute.gemm]]")
        lines += [f"m = {ga['m']}", f"n = {ga['n']}", f"k = {ga['k']}",
                  f"flops_per_s = {(ga['flops_per_s'] + gb['flops_per_s']) / 2!r}"]
    with open(os.path.join(OUT, out), "w") as f:
        f.write("\n".join(lines) + "\n")


def attempt(n):
    print(f"attempt {n}: calibrate, run 6 layouts of model A on one rank, calibrate again")
    before = calibrate("machine.toml")
    j = validate("a.toml", 6, STEPS, 1)
    after = calibrate("after.toml")
    write_mean_machine(before, after, "mean.toml")
    pred = {l["layout"]: l["step_s"] for l in json.loads(run(
        [TRIDENT, "plan", "a.toml", "--machine", "mean.toml", "--ranks-per-node", "1", "--json",
         "--top", "0"]))["layouts"]}
    fails = []
    xs, ys = [], []
    for v in j["validation"]:
        p, m = pred[v["layout"]], v["measured_step_s"]
        xs.append(p)
        ys.append(m)
        err = p / m - 1
        ok = abs(err) <= TIME_TOL
        print(f"  #{v['rank']:<4d} {v['layout']:52s} predicted {p:.3f} s measured {m:.3f} s "
              f"({err:+.1%}) {'ok' if ok else 'FAIL'}")
        if not ok:
            fails.append(f"{v['layout']}: step predicted {p:.3f} s, measured {m:.3f} s "
                         f"({err:+.1%} > {TIME_TOL:.0%})")
    rho = spearman(xs, ys)
    print(f"  Spearman {rho:.3f} over {len(xs)} layouts (plan --validate's own, from the first "
          f"calibration alone: {j['spearman']:.3f})")
    if len(xs) != 6:
        fails.append(f"validated {len(xs)} layouts, expected 6")
    if rho < SPEARMAN_MIN:
        fails.append(f"Spearman {rho:.3f} < {SPEARMAN_MIN}")
    return j, fails


def spearman(x, y):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for pos, i in enumerate(order):
            r[i] = float(pos)
        return r
    rx, ry = ranks(x), ranks(y)
    n = len(x)
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else 0.0


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(1)
    words = "the and of to in that he shall unto for his a lord they be is him not".split()
    with open(os.path.join(OUT, "corpus.txt"), "w") as f:
        f.write("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(3000)))
    for name, text in (("a.toml", DECK_A), ("b.toml", DECK_B)):
        with open(os.path.join(OUT, name), "w") as f:
            f.write(text)
    run([TRIDENT, "prepare-data", "--input", "corpus.txt", "--output", "train.h5"])

    for n in range(1, ATTEMPTS + 1):
        j, time_fails = attempt(n)
        if not time_fails:
            break
        print(f"attempt {n} missed:", "; ".join(time_fails))
    mem_fails = []
    check_memory(j["validation"], mem_fails)
    print("3 layouts of model B on 2 ranks (memory, one step each)")
    check_memory(validate("b.toml", 3, 1, 2)["validation"], mem_fails)
    fails = time_fails + mem_fails
    for f in fails:
        print("FAIL:", f)
    print("mpi.plan_validate:", "FAIL" if fails else "PASS")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
