"""mpi.memory_report — the start-up memory prediction (model::predict_memory) against the
peak `trident train` measures (rank 0: RSS high-water mark over the steps, minus the RSS
before the model was built), and attention's stash linear in T.

Three layouts (serial, tp 2, pp 2 with 1f1b and 2 microbatches) and two sequence lengths with
the same tokens per microbatch (T = 512, micro_batch_size 8; T = 2048, micro_batch_size 2):
serial at both, tp 2 at 2048, pp 2 at 512; and a Llama (one kv head, replicated) at tp 2,
T = 512. And what PipeDream-2BW adds to 2D TP (tp 4 on 2 x 2, d_model 2048, T = 64: its
second weight version and swap buffer), measured (the peak against the same run with 1F1B)
within 10% of predicted. The measured peak within 10% of the prediction,
and the serial run's measured activation part at T = 2048 within 15% of that at T = 512
(a T x T attention stash would add 4 x 2048^2 floats per sequence and layer, +256 MiB, at
2048 with 2 sequences). One step
each, a 2-layer d_model 256 model on generated text (byte tokenizer). ~25 s on 2 cores.
The peak leaves the checkpoints out, so the runs set io.final_checkpoint = false (the 2D
ones would write 1.2-1.6 GB nobody reads), and the test checks that none was written.

What the prediction leaves out is the libraries' working memory, allocated on first use after
the baseline: OpenBLAS's packing buffers, MPI's temporary buffers for the tensor-parallel
all-reduces and the pipeline's messages, HDF5's structures. Measured here it puts the measured
peak 3.6% (serial) to 7.5% (Llama tp 2) above the prediction at 4096 tokens per microbatch; at
2048 tokens the Llama layout sat at 9.7-10.1% and failed now and then.
"""

import os
import random
import re
import shutil
import subprocess
import sys

TRIDENT = os.environ["TRIDENT"]
OUT = os.path.join(os.environ.get("TRIDENT_TEST_OUT", "/tmp"), "mpi.memory_report")
PEAK_TOL = 0.10
LINEAR_TOL = 0.15

DECK = """[model]
vocab_size = 0
seq_len = 512
n_layer = 2
n_head = 4
d_model = 256
[parallel]
micro_batch_size = 4
[train]
steps = 1
warmup_steps = 0
global_batch_size = 4
[data]
train = "train.h5"
[io]
out_dir = "out"
final_checkpoint = false
[runtime]
threads = 1
"""

SIZE = r"([0-9.]+ [KMG]iB)"
LINE = re.compile(rf"memory: rank 0 measured peak {SIZE} \(predicted {SIZE}\); "
                  rf"activations {SIZE} \(predicted {SIZE}\)")


def mib(size):
    """'12.5 MiB' (or KiB, GiB, as trident picks the unit) in MiB."""
    value, unit = size.split()
    return float(value) * {"KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}[unit]


def run(np_, *args):
    cmd = [TRIDENT, *args]
    if np_ > 1:
        cmd = ["mpirun", "-np", str(np_), "--oversubscribe", *cmd]
    p = subprocess.run(cmd, cwd=OUT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300)
    if p.returncode != 0:
        print(f"FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout}")
        sys.exit(1)
    return p.stdout


def no_checkpoint(fails, out_dir):
    """io.final_checkpoint = false: a 1-step run leaves no checkpoint."""
    d = os.path.join(OUT, out_dir, "checkpoints")
    left = os.listdir(d) if os.path.isdir(d) else []
    if left:
        fails.append(f"{out_dir}: io.final_checkpoint = false, yet {d} holds {left}")


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(1)
    words = "the and of to in that he shall unto for his a lord they be is him not".split()
    with open(os.path.join(OUT, "corpus.txt"), "w") as f:
        f.write("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(3000)))
    with open(os.path.join(OUT, "deck.toml"), "w") as f:
        f.write(DECK)
    run(1, "prepare-data", "--input", "corpus.txt", "--output", "train.h5")

    fails = []
    layouts = {"serial": (1, []), "tp2": (2, ["parallel.tp=2"]),
               "pp2": (2, ["parallel.pp=2", "parallel.schedule=1f1b"]),
               "llama_tp2": (2, ["parallel.tp=2", "model.arch=llama", "model.n_kv_head=1"])}
    lengths = {512: 8, 2048: 2}  # T: micro_batch_size (4096 tokens per microbatch)
    # serial at both lengths (the linearity check), the parallel layouts at one each: every
    # run costs a process start (mpirun: ~4 s more on 2 cores).
    runs = [("serial", 512), ("serial", 2048), ("tp2", 2048), ("pp2", 512), ("llama_tp2", 512)]
    acts = {}
    for name, T in runs:
        np_, sets = layouts[name]
        mbs = lengths[T]
        gbs = mbs * (2 if name == "pp2" else 1)  # pp2: two microbatches in flight
        extra = [*sets, f"model.seq_len={T}", f"parallel.micro_batch_size={mbs}",
                 f"train.global_batch_size={gbs}", f"io.out_dir=out-{name}-{T}"]
        shutil.rmtree(os.path.join(OUT, f"out-{name}-{T}"), ignore_errors=True)
        out = run(np_, "train", "deck.toml", *sum((["--set", s] for s in extra), []))
        no_checkpoint(fails, f"out-{name}-{T}")
        m = LINE.search(out)
        if not m:
            fails.append(f"{name} T={T}: no 'memory: rank 0 measured peak' line in:\n{out}")
            continue
        peak, pred, act, act_pred = map(mib, m.groups())
        rel = abs(peak - pred) / pred
        print(f"{name:6s} T={T:4d} B={mbs}: measured peak {peak:7.1f} MiB, predicted "
              f"{pred:7.1f} MiB ({rel:+.1%}); activations {act:6.1f} MiB, predicted "
              f"{act_pred:6.1f} MiB")
        if rel > PEAK_TOL:
            fails.append(f"{name} T={T}: measured {peak} MiB vs predicted {pred} MiB: "
                         f"{rel:.1%} > {PEAK_TOL:.0%}")
        acts[(name, T)] = act
    for name in layouts:
        if (name, 512) in acts and (name, 2048) in acts:
            a, b = acts[(name, 512)], acts[(name, 2048)]
            rel = abs(b - a) / a
            print(f"{name:6s} activations at T=2048 / T=512 (same tokens per microbatch): "
                  f"{b / a:.3f}")
            if rel > LINEAR_TOL:
                fails.append(f"{name}: activation part {a} MiB at T=512 vs {b} MiB at T=2048: "
                             f"{rel:.1%} apart > {LINEAR_TOL:.0%}")
    # 2D TP (tp 4 on 2 x 2) with PipeDream-2BW against the same deck with 1F1B: the second
    # weight version and the swap buffer are all the asynchronous schedule adds, so the
    # measured peaks differ by what predict_memory adds, within 10% of it (here 98.3 MiB
    # predicted, 98.0 to 98.3 measured). Wide and short (d_model 2048, T = 64): the weights dominate.
    # The whole 2D peak sits 7-14% above its prediction at this size for both schedules
    # (not counted: the libraries' working memory of the SUMMA collectives), so this compares
    # the difference, where that common part cancels.
    peaks = {}
    for sched in ("1f1b", "pipedream-2bw"):
        extra = ["parallel.tp=4", "parallel.tp_mode=2d", "model.d_model=2048", "model.seq_len=64",
                 "parallel.micro_batch_size=2", "train.global_batch_size=2",
                 f"parallel.schedule={sched}", f"io.out_dir=out-2d-{sched}"]
        shutil.rmtree(os.path.join(OUT, f"out-2d-{sched}"), ignore_errors=True)
        out = run(4, "train", "deck.toml", *sum((["--set", s] for s in extra), []))
        no_checkpoint(fails, f"out-2d-{sched}")
        m = LINE.search(out)
        if not m:
            fails.append(f"2d {sched}: no 'memory: rank 0 measured peak' line in:\n{out}")
            continue
        peaks[sched] = (mib(m.group(1)), mib(m.group(2)))
        print(f"2d tp4 {sched:13s}: measured peak {peaks[sched][0]:7.1f} MiB, predicted "
              f"{peaks[sched][1]:7.1f} MiB")
    if len(peaks) == 2:
        measured = peaks["pipedream-2bw"][0] - peaks["1f1b"][0]
        predicted = peaks["pipedream-2bw"][1] - peaks["1f1b"][1]
        rel = abs(measured - predicted) / max(predicted, 1e-9)
        print(f"2d tp4 pipedream-2bw adds {measured:.1f} MiB measured, {predicted:.1f} MiB "
              f"predicted ({rel:.1%} apart)")
        if predicted <= 0 or rel > PEAK_TOL:
            fails.append(f"2d pipedream-2bw: adds {measured:.1f} MiB measured vs {predicted:.1f} "
                         f"MiB predicted: {rel:.1%} > {PEAK_TOL:.0%}")
    for f in fails:
        print("FAIL:", f)
    print("mpi.memory_report:", "FAIL" if fails else "PASS")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
