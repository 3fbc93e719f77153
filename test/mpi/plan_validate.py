"""mpi.plan_validate — `trident plan`'s predictions against `trident train` (issue 21), on this
machine with a calibration made in the test.

Step time, one rank: `trident calibrate` (the rank and thread count the runs have), then
`trident plan --validate 6 --spread`: six layouts spread evenly over the planner's ranking of a
4-layer d_model 128 model (T = 256, global batch 8: micro-batch sizes and recomputation),
each run for 5 steps through `trident train`. Holds each predicted step time within 25% of the
measured one and the Spearman correlation of predicted and measured times >= 0.8. Against
noise (2 cores shared with other tests): the measured time is the median of steps 2..5; the
calibration is made seconds before, its figures the mean over five rounds (the share of the
cores a step sees, preemptions included); one more attempt (a fresh calibration and
validation) is made when the first misses, both printed: a busy moment spoils one attempt, a
wrong model both. Several ranks on 2 shared cores are not held to 25%: a rank that waits gives
its core to the others, so the pipeline bubble and TP waits the model charges (for ranks with
a core each) partly vanish here; their figures are in the issue's note.

Peak memory (world rank 0, `trident train`'s measured RSS high-water mark): the six runs above
and three layouts of a 2-layer d_model 256 model at T = 512 on 2 ranks (tp, pp, dp; one step
each). Within 10% + 12 MiB: the planner's prediction is the start-up report's
(model::predict_memory); what the process touches after start-up outside the model (OpenBLAS
and MPI buffers, the dataset reader: ~4-12 MiB here) is not in it, so small layouts carry that
constant (mpi.memory_report holds 10% on layouts of ~0.5-1 GiB). ~45 s on 2 cores.
"""

import json
import os
import random
import subprocess
import sys

TRIDENT = os.environ["TRIDENT"]
OUT = os.path.join(os.environ.get("TRIDENT_TEST_OUT", "/tmp"), "mpi.plan_validate")
TIME_TOL = 0.25
SPEARMAN_MIN = 0.8
MEM_REL, MEM_ABS_MIB = 0.10, 12.0

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


def attempt(n):
    print(f"attempt {n}: calibrate, then 6 layouts of model A on one rank")
    print(run([TRIDENT, "calibrate", "a.toml", "--out", "machine.toml", "--min-seconds",
               "0.05"]).strip())
    j = validate("a.toml", 6, 5, 1)
    fails = []
    for v in j["validation"]:
        p, m = v["predicted_step_s"], v["measured_step_s"]
        err = p / m - 1
        ok = abs(err) <= TIME_TOL
        print(f"  #{v['rank']:<4d} {v['layout']:52s} predicted {p:.3f} s measured {m:.3f} s "
              f"({err:+.1%}) {'ok' if ok else 'FAIL'}")
        if not ok:
            fails.append(f"{v['layout']}: step predicted {p:.3f} s, measured {m:.3f} s "
                         f"({err:+.1%} > {TIME_TOL:.0%})")
    rho = j["spearman"]
    print(f"  Spearman {rho:.3f} over {len(j['validation'])} layouts")
    if len(j["validation"]) != 6:
        fails.append(f"validated {len(j['validation'])} layouts, expected 6")
    if rho < SPEARMAN_MIN:
        fails.append(f"Spearman {rho:.3f} < {SPEARMAN_MIN}")
    return j, fails


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

    j, time_fails = attempt(1)
    if time_fails:
        print("attempt 1 missed:", "; ".join(time_fails))
        j, time_fails = attempt(2)
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
