"""`trident plan`'s predictions against `trident train` (issue 21), on this machine with a
calibration made in the test. Two tests, one script:

`plan_validate.py memory` (mpi.plan_memory, in `make test`): peak memory. World rank 0's
measured RSS high-water mark (`trident train`, one step) against the planner's prediction for
12 layouts of three models on 2 ranks: four spread over the ranking of a 4-layer d_model 128
model (T = 256, global batch 8: dp, pp, tp, micro-batch sizes, recomputation), two of a
2-layer d_model 256 model at T = 512, and six of issue 32's 6-layer
d_model 192 model (T = 160, vocab 1000). The prediction is the start-up report's
(model::predict_memory: at dp > 1 it counts MPI's temporaries of the DP buckets in flight,
machine.nonblocking_temp_ratio x the gradient bytes: Open MPI 4.1's libnbc holds one copy of
each in-place MPI_Iallreduce / MPI_Ireduce_scatter until it completes, calibrate measures 1.0
here; at pp > 1 the executor's message buffers; HDF5's metadata cache of each open file)
plus the libraries' working memory that `trident calibrate` measured (machine.library_mib:
what stays resident after its products and collectives, ~3 MiB here). Within 10% +
MEM_ABS_MIB: the few MiB left are the heap's and the page cache's granularity (seen: -3% to
+6%; before the message buffers and HDF5's caches were counted, model C's pipeline layouts
sat at -12% and -13%).

`plan_validate.py time` (mpi.plan_validate, label `timing`: not in `make test`, run by
`make test-timing`, alone): step time. `trident calibrate` (mpirun -np 2, wall clock), then
`trident plan --validate 6 --spread` on the 4-layer model, each layout trained through
`mpirun -np 2 trident train` for 8 steps. Holds issue 21's figures: each of the six layouts'
predicted step time within 25% of the measured one, and the Spearman correlation of predicted
and measured >= 0.8.

How noise is kept honest: both sides are wall-clock times on a machine with a core per rank (2
ranks, 2 cores), measured by the same clock: the calibration times its kernels and collectives,
the validation takes the median over steps 2..8 of each run (the first step's allocations and
page faults left out; the median, not the mean, so one step delayed by the system does not
move it). `make test-timing` runs it alone (ctest -L timing, RUN_SERIAL): nothing else of the
suite shares the cores. The load average is printed before each attempt; one more attempt (a
fresh calibration and validation) is made when the first misses, both printed. On an idle
machine, three runs gave errors of -14% to +14% (Spearman 0.94 to 1.0).

What an earlier version did instead, and why it changed: it measured CPU seconds per rank
(calibrate --cpu-time, plan --cpu-time) so that it could share the cores with other tests.
Open MPI's ranks busy-poll while they wait, so a rank's waits for its peer became a
load-dependent share of its CPU seconds (dp 2: ~25% of the step against 5 ms of DP reduction
predicted), and it held only a median within 25% and each within 40%. The --cpu-time options
remain for users on shared machines.
"""

import json
import os
import re
import random
import subprocess
import sys

import h5py

TRIDENT = os.environ["TRIDENT"]
MODES = {"time": "mpi.plan_validate", "memory": "mpi.plan_memory"}
if len(sys.argv) != 2 or sys.argv[1] not in MODES:
    sys.exit("usage: plan_validate.py time|memory")
mode = sys.argv[1]
NAME = MODES[mode]
OUT = os.path.join(os.environ.get("TRIDENT_TEST_OUT", "/tmp"), NAME)
TIME_TOL = 0.25        # each layout's error
SPEARMAN_MIN = 0.8
MEM_REL, MEM_ABS_MIB = 0.10, 2.0
ATTEMPTS = 2
STEPS = 8

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

# Issue 32's shape: the one whose start-up report and plan disagreed (6 layers, d_model 192).
DECK_C = DECK_A.replace("vocab_size = 0", "vocab_size = 1000").replace("seq_len = 256", "seq_len = 160") \
    .replace("n_layer = 4", "n_layer = 6").replace("n_head = 4", "n_head = 6") \
    .replace("d_model = 128", "d_model = 192").replace('"out-a"', '"out-c"')

# Context parallelism (issue 30): sequences of 1024 on a small model, where the activations
# are most of the peak; a spread of 3 of its cp 2 layouts on 2 ranks.
DECK_D = DECK_A.replace("seq_len = 256", "seq_len = 1024").replace("n_layer = 4", "n_layer = 2") \
    .replace("micro_batch_size = 2", "micro_batch_size = 1").replace('"out-a"', '"out-d"')


def run(cmd, timeout=400):
    p = subprocess.run(cmd, cwd=OUT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        print(f"FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        sys.exit(1)
    return p.stdout


def validate(deck, k, steps, ranks, cp=1):
    # Models A-C: the spread over the cp = 1 layouts, the layouts these figures were held on;
    # model D's long sequences over the cp = 2 ones (--min-cp / --max-cp).
    out = run([TRIDENT, "plan", deck, "--machine", "machine.toml", "--ranks-per-node",
               str(ranks), "--validate", str(k), "--spread", "--validate-steps", str(steps),
               "--min-cp", str(cp), "--max-cp", str(cp), "--json", "--top", "1",
               "--launcher", LAUNCHER])
    return json.loads(out)


def check_memory(rows, fails, out_dir):
    for v in rows:
        pred, meas = v["predicted_rank0_peak_mib"], v["measured_rank0_peak_mib"]
        # plan reads its measurements from each run's metrics.h5 (the last row's
        # memory/peak_bytes), which h5py users read too: the same figure.
        with h5py.File(os.path.join(OUT, out_dir, "plan-validate", str(v["rank"]), "metrics.h5"),
                       "r") as f:
            stored = float(f["memory/peak_bytes"][-1]) / 2**20
        if abs(stored - meas) > 1e-9 * max(1.0, meas):
            fails.append(f"{v['layout']}: plan measured {meas} MiB, metrics.h5 holds {stored}")
        ok = abs(meas - pred) <= MEM_REL * pred + MEM_ABS_MIB
        print(f"  memory {v['layout']:52s} predicted {pred:7.1f} MiB measured {meas:7.1f} MiB "
              f"({pred / meas - 1:+.1%}) {'ok' if ok else 'FAIL'}")
        if not ok:
            fails.append(f"{v['layout']}: peak predicted {pred:.1f} MiB, measured {meas:.1f} MiB")


LAUNCHER = "mpirun --oversubscribe -np {np}"


def startup_agrees(deck, fails):
    """The start-up report's figure is plan's (less the machine file's library_mib) for the
    same layout: plan's first dp 2 ZeRO-1 layout, trained for one step."""
    plan = json.loads(run([TRIDENT, "plan", deck, "--machine", "machine.toml", "--ranks-per-node",
                           "2", "--json", "--top", "0"]))
    lay = next(l for l in plan["layouts"] if l["dp"] == 2 and l["pp"] == 1 and l["zero_stage"] == 1)
    with open(os.path.join(OUT, "machine.toml")) as f:
        lib_mib = float(re.search(r"library_mib = ([0-9.e+-]+)", f.read()).group(1))
    with open(os.path.join(OUT, deck)) as f:
        text = f.read()
    text = text.replace("steps = 5", "steps = 1").replace(
        f"micro_batch_size = 2", f"micro_batch_size = {lay['micro_batch_size']}\n"
        f"dp = 2\nzero_stage = 1\nrecompute = \"{lay['recompute']}\"").replace(
        'out_dir = "', 'overwrite = true\nresume = "none"\nout_dir = "startup-')
    with open(os.path.join(OUT, "startup.toml"), "w") as f:
        f.write(text)
    out = run(LAUNCHER.replace("{np}", "2").split() + [TRIDENT, "train", "startup.toml"])
    said = float(re.search(r"memory: rank 0 predicted peak ([0-9.]+) MiB", out).group(1))
    planned = lay["rank0_peak_bytes"] / 1048576 - lib_mib
    ok = abs(said - planned) <= 0.051
    print(f"  start-up line {lay['layout']}: {said:.1f} MiB, plan less libraries {planned:.2f} MiB "
          f"{'ok' if ok else 'FAIL'}")
    if not ok:
        fails.append(f"start-up line {said:.1f} MiB != plan's {planned:.2f} MiB for {lay['layout']}")
    # The third report, at the end of the run: the same prediction, and the measured peak
    # within the tolerance of plan's (with the libraries): a dp 2 ZeRO-1 layout of model C
    # measured whatever the spread above picked.
    end = re.search(r"memory: rank 0 measured peak ([0-9.]+) MiB \(predicted ([0-9.]+) MiB\)", out)
    measured, predicted_end = float(end.group(1)), float(end.group(2))
    pred = lay["rank0_peak_bytes"] / 1048576
    ok = abs(predicted_end - said) <= 0.051 and abs(measured - pred) <= MEM_REL * pred + MEM_ABS_MIB
    print(f"  end-of-run line {lay['layout']}: measured {measured:.1f} MiB, predicted "
          f"{predicted_end:.1f} MiB; plan {pred:.1f} MiB ({pred / measured - 1:+.1%}) "
          f"{'ok' if ok else 'FAIL'}")
    if not ok:
        fails.append(f"end-of-run line for {lay['layout']}: measured {measured:.1f} MiB, "
                     f"predicted {predicted_end:.1f} MiB, plan {pred:.1f} MiB")


def calibrate():
    print(run(LAUNCHER.replace("{np}", "2").split() +
              [TRIDENT, "calibrate", "a.toml", "--out", "machine.toml", "--min-seconds", "0.1"]).strip())


def attempt(n):
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"attempt {n} (load average {' '.join(load)}): calibrate (2 ranks), then 6 layouts "
          "of model A, wall clock")
    calibrate()
    j = validate("a.toml", 6, STEPS, 2)
    fails = []
    xs, ys = [], []
    for v in j["validation"]:
        p, m = v["predicted_step_s"], v["measured_step_s"]
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
    print(f"  Spearman {rho:.3f} over {len(xs)} layouts (plan's own: {j['spearman']:.3f})")
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
    for name, text in (("a.toml", DECK_A), ("b.toml", DECK_B), ("c.toml", DECK_C),
                       ("d.toml", DECK_D)):
        with open(os.path.join(OUT, name), "w") as f:
            f.write(text)
    run([TRIDENT, "prepare-data", "--input", "corpus.txt", "--output", "train.h5"])

    if mode == "time":
        for n in range(1, ATTEMPTS + 1):
            fails = attempt(n)[1]
            if not fails:
                break
            print(f"attempt {n} missed:", "; ".join(fails))
    else:
        fails = []
        print("calibrate (2 ranks), then 4 layouts of model A, 2 of model B, 6 of model C and "
              "3 cp 2 layouts of model D (memory, one step each)")
        calibrate()
        check_memory(validate("a.toml", 4, 1, 2)["validation"], fails, "out-a")
        check_memory(validate("b.toml", 2, 1, 2)["validation"], fails, "out-b")
        rows = validate("c.toml", 6, 1, 2)["validation"]
        check_memory(rows, fails, "out-c")
        if len(rows) != 6:
            fails.append(f"model C: validated {len(rows)} layouts, expected 6")
        startup_agrees("c.toml", fails)
        rows = validate("d.toml", 3, 1, 2, cp=2)["validation"]
        check_memory(rows, fails, "out-d")
        cp_rows = [v for v in rows if re.search(r"\bcp2\b", v["layout"])]
        if len(rows) != 3 or len(cp_rows) != len(rows):
            fails.append(f"model D: validated {len(rows)} layouts, {len(cp_rows)} of them at "
                         "cp 2; expected 3, all at cp 2")
    for f in fails:
        print("FAIL:", f)
    print(f"{NAME}:", "FAIL" if fails else "PASS")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
