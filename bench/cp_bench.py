#!/usr/bin/env python3
"""Context parallelism (issue 30): activation memory per rank and the ring's hidden share, at a
fixed sequence length against cp (bench/run.sh runs it; also alone:
/usr/bin/python3 bench/cp_bench.py --build build).

For cp = 1, 2, 4 (--cps) `trident train` runs --steps steps of one sequence of T = --seq tokens
(GPT-2: --layers layers, d_model --dmodel, --heads heads, vocabulary --vocab, recompute none,
dp = 1, one thread per rank, ranks = cp under mpirun) and reads from each run:
  - the measured peak (rank 0; metrics column memory/peak_bytes, bytes above the resident size
    at start-up), the start-up line's prediction, and trident's own "activations" figure (the
    peak less what was in use before the first microbatch: it leaves out buffers made with the
    model, such as the ring's);
  - the ring's end-of-run line (cp > 1): its passes, bytes, the seconds in the ring and the
    part blocked waiting for messages (wall and CPU), its buffers.
The activation part: the peak at T less the peak of the same cp at T0 = --tiny tokens with the
vocabulary grown by T - T0 (so that both runs have the same parameters: GPT-2's position table
shrinks by what the tied token table gains), so that the weights, gradients, optimizer state,
MPI's buffers (the gradient reductions over DP x CP) and the libraries' memory cancel; what
remains is what grows with T, less the T0 run's own few activations. The goal is act(cp) within 10% of
act(1) / cp "up to the ring's buffers", i.e. (act(cp) - ring buffers) / (act(1) / cp) <= 1.1
(both ratios are printed).
The hidden share of the ring: `trident_bench_ring` (bench/cp_ring_bench.cpp) times the same
messages alone at the same shape on cp ranks (per forward and per backward pass), and
hidden = 1 - (time blocked waiting in the ring during training) / (passes x the messages alone),
in wall and in thread-CPU seconds; the bench's own forward + backward of one ring (ranks in step
after a barrier) gives the same ratio without the training's skew between ranks.
On a CPU the "communication" is a copy a core makes inside MPI (Open MPI's shared memory: the
receiver copies, in the wait): tiles cannot hide it, only the waiting for the peer's send; and
the machine's cores are shared, so the waits also hold the time a rank was descheduled. With
fewer cores than 4 ranks cp = 4 is oversubscribed: its wall times lie (the CPU-time columns
and the memory do not). Prints two tables; --json writes the rows.
usage: cp_bench.py --build BUILD [--json PATH] [--seq T] [--cps 1,2,4] [--steps N] ...
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1048576.0


def log(msg):
    print(f"cp bench: {msg}", file=sys.stderr, flush=True)


def mpi_env():
    e = dict(os.environ)
    e.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    return e


def random_tokens(path, vocab):
    import h5py
    import numpy as np
    if not os.path.exists(path):
        with h5py.File(path, "w") as f:
            f["tokens"] = np.random.default_rng(0).integers(0, vocab, 400000).astype(np.int32)
            f.attrs["vocab_size"] = vocab
            f.attrs["tokenizer"] = "sentencepiece"
            f["tokenizer/model"] = np.zeros(1, np.uint8)  # never decoded by training
    return path


def mpirun(n, cmd):
    return ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none", *cmd]


def mib_of(text):
    """'290.1 MiB' -> bytes (format_bytes: B, KiB, MiB, GiB)."""
    num, unit = text.split()
    return float(num) * {"B": 1, "KiB": 1024, "MiB": MIB, "GiB": MIB * 1024}[unit]


def train(a, work, data, cp, seq, vocab):
    """One `trident train` run; a dict of what it reported (or {"error": ...})."""
    name = f"cp{cp}-T{seq}"
    out_dir = os.path.join(work, name)
    deck = os.path.join(work, f"{name}.toml")
    with open(deck, "w") as f:
        f.write(f"""[model]
vocab_size = {vocab}
seq_len = {seq}
n_layer = {a.layers}
n_head = {a.heads}
d_model = {a.dmodel}
[parallel]
cp = {cp}
micro_batch_size = 1
recompute = "none"
[train]
steps = {a.steps}
global_batch_size = 1
warmup_steps = 1
[data]
train = "{data}"
[io]
out_dir = "{out_dir}"
resume = "none"
overwrite = true
final_checkpoint = false
[runtime]
threads = 1
watchdog_s = {a.watchdog}
""")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(mpirun(cp, [os.path.join(a.build, "trident"), "train", deck]),
                       env=mpi_env(), capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        return {"cp": cp, "seq": seq, "error": f"exited {p.returncode}: "
                f"{(p.stderr or p.stdout).strip()[-400:]}"}
    text = p.stdout + p.stderr
    r = {"cp": cp, "seq": seq,
         "cpu_s_per_rank": (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / cp}
    m = re.search(r"measured peak ([\d.]+ \w+) \(predicted ([\d.]+ \w+)\); activations "
                  r"([\d.]+ \w+) \(predicted ([\d.]+ \w+)\)", text)
    if m:
        r.update(peak_line=mib_of(m.group(1)), predicted_peak=mib_of(m.group(2)),
                 trident_activations=mib_of(m.group(3)), predicted_activations=mib_of(m.group(4)))
    m = re.search(r"predicted peak .*? = weights ([\d.]+ \w+) \+ gradients ([\d.]+ \w+) \+ "
                  r"optimizer ([\d.]+ \w+)", text)
    if m:
        r["predicted_static"] = sum(mib_of(m.group(i)) for i in (1, 2, 3))
    m = re.search(r"ring attention: (\d+) forward and (\d+) backward passes over cp = \d+, sent "
                  r"([\d.]+) MiB in (\d+) messages; blocked waiting ([\d.]+) s of ([\d.]+) s in "
                  r"the ring \(forward ([\d.]+) of ([\d.]+) s, backward ([\d.]+) of ([\d.]+) s; "
                  r"CPU time: the waits' ([\d.]+) s of ([\d.]+) s\), buffers ([\d.]+) MiB", text)
    if m:
        g = [float(x) for x in m.groups()]
        r["ring"] = {"forward_passes": int(g[0]), "backward_passes": int(g[1]),
                     "sent_mib": g[2], "messages": int(g[3]), "wait_s": g[4], "ring_s": g[5],
                     "forward_wait_s": g[6], "forward_s": g[7], "backward_wait_s": g[8],
                     "backward_s": g[9], "wait_cpu_s": g[10], "ring_cpu_s": g[11],
                     "buffers": g[12] * MIB}
    elif cp > 1:
        r["error"] = "no 'ring attention:' line in trident's output"
    import h5py
    import numpy as np
    with h5py.File(os.path.join(out_dir, "metrics.h5"), "r") as f:
        r["peak"] = float(np.asarray(f["memory/peak_bytes"][...])[-1])
        st = np.asarray(f["step_time_s"][...], dtype=np.float64)
        r["step_s"] = float(np.median(st[1:] if len(st) > 1 else st))
    return r


def ring_alone(a, cp):
    """trident_bench_ring at the model's attention shape on cp ranks: its JSON line."""
    cmd = mpirun(cp, [os.path.join(a.build, "bench", "trident_bench_ring"), "--seq", str(a.seq),
                      "--batch", "1", "--dmodel", str(a.dmodel), "--heads", str(a.heads),
                      "--reps", str(a.ring_reps), "--watchdog", str(a.watchdog)])
    p = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True)
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"error": f"trident_bench_ring exited {p.returncode}: {p.stderr.strip()[-400:]}"}
    return json.loads(lines[-1])


def hidden(wait, alone):
    return max(0.0, 1.0 - wait / alone) if alone > 0 else None


def pct(x):
    return "-" if x is None else f"{100 * x:.0f}%"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--cps", default="1,2,4")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--tiny", type=int, default=64, help="T0 of the runs that measure the static part")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dmodel", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--ring-reps", type=int, default=5)
    ap.add_argument("--watchdog", type=float, default=0.0,
                    help="runtime.watchdog_s (> 0: waits poll and sleep, leaving shared cores)")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    cps = [int(x) for x in a.cps.split(",") if x]
    work = os.path.join(a.build, "bench-work", "cp")
    os.makedirs(work, exist_ok=True)
    data = random_tokens(os.path.join(work, f"tokens-{a.vocab}.h5"), a.vocab)
    load = os.getloadavg()[0]

    rows = []
    for cp in cps:
        log(f"cp = {cp}: T = {a.seq}, T0 = {a.tiny}")
        big = train(a, work, data, cp, a.seq, a.vocab)
        small = train(a, work, data, cp, a.tiny, a.vocab + a.seq - a.tiny)
        row = {"cp": cp, "run": big, "tiny_run": small}
        if "error" in big or "error" in small:
            row["error"] = big.get("error") or small.get("error")
            rows.append(row)
            continue
        row["activation_part"] = big["peak"] - small["peak"]
        row["ring_buffers"] = big.get("ring", {}).get("buffers", 0.0)
        row["ring_alone"] = ring_alone(a, cp)  # cp = 1: plain flash attention's time
        rows.append(row)

    base = next((r for r in rows if r["cp"] == 1 and "error" not in r), None)
    for r in rows:
        if base and "error" not in r:
            ideal = base["activation_part"] / r["cp"]
            r["ratio"] = r["activation_part"] / ideal
            r["ratio_without_ring_buffers"] = (r["activation_part"] - r["ring_buffers"]) / ideal
        ring, alone = r.get("run", {}).get("ring"), r.get("ring_alone")
        if ring and alone and "error" not in alone:
            f, b = ring["forward_passes"], ring["backward_passes"]
            wall = f * alone["forward_alone_s"] + b * alone["backward_alone_s"]
            cpu = f * alone["forward_alone_cpu_s"] + b * alone["backward_alone_cpu_s"]
            r["messages_alone_s"], r["messages_alone_cpu_s"] = wall, cpu
            r["hidden"], r["hidden_cpu"] = hidden(ring["wait_s"], wall), hidden(ring["wait_cpu_s"], cpu)

    cores = os.cpu_count()
    print(f"\n  context parallelism: GPT-2 L={a.layers}, d_model={a.dmodel}, heads={a.heads}, "
          f"vocab={a.vocab}, T={a.seq}, 1 sequence, recompute none, {a.steps} steps; ranks = cp, "
          f"1 thread each, {cores} cores (load average {load:.2f} at the start)"
          + (f"; cp > {cores} oversubscribed: wall times lie" if max(cps) > cores else ""))
    print(f"  memory per rank (rank 0, MiB): peak at T, peak at T0 = {a.tiny} (vocabulary "
          f"{a.vocab + a.seq - a.tiny}: the same parameters), activation part = the difference, "
          f"the ring's buffers, ratios to act(cp=1)/cp; trident's own activations figure and "
          f"the start-up prediction")
    print(f"  {'cp':>3} {'peak':>8} {'peak T0':>8} {'act part':>9} {'ring buf':>9} "
          f"{'act/ideal':>9} {'-ring/ideal':>11}  {'trident act':>11} {'pred peak':>9} {'pred act':>8}")
    for r in rows:
        if "error" in r:
            print(f"  {r['cp']:>3} {r['error']}")
            continue
        big = r["run"]
        print(f"  {r['cp']:>3} {big['peak'] / MIB:8.1f} {r['tiny_run']['peak'] / MIB:8.1f} "
              f"{r['activation_part'] / MIB:9.1f} {r['ring_buffers'] / MIB:9.1f} "
              f"{r.get('ratio', float('nan')):9.3f} {r.get('ratio_without_ring_buffers', float('nan')):11.3f}  "
              f"{big.get('trident_activations', 0) / MIB:11.1f} "
              f"{big.get('predicted_peak', 0) / MIB:9.1f} {big.get('predicted_activations', 0) / MIB:8.1f}")
    print("  time per rank (s): median step (wall), CPU per rank (whole run); the ring over the "
          "run: time in it (wall, CPU), blocked waiting (wall, CPU), the same messages alone x "
          "passes (trident_bench_ring), hidden = 1 - wait / alone (wall, CPU)")
    print(f"  {'cp':>3} {'step s':>7} {'cpu s':>7} {'ring s':>7} {'ring cpu':>8} {'wait s':>7} {'wait cpu':>8} "
          f"{'alone s':>8} {'alone cpu':>9} {'hidden':>6} {'hid cpu':>7}")
    for r in rows:
        if "error" in r:
            continue
        big, ring, alone = r["run"], r["run"].get("ring"), r.get("ring_alone") or {}
        line = f"  {r['cp']:>3} {big['step_s']:7.2f} {big['cpu_s_per_rank']:7.1f}"
        if ring:
            line += (f" {ring['ring_s']:7.2f} {ring['ring_cpu_s']:8.2f} {ring['wait_s']:7.3f} "
                     f"{ring['wait_cpu_s']:8.3f}")
            if "messages_alone_s" in r:
                line += (f" {r['messages_alone_s']:8.3f} {r['messages_alone_cpu_s']:9.3f} "
                         f"{pct(r['hidden']):>6} {pct(r['hidden_cpu']):>7}")
            elif "error" in alone:
                line += f"  {alone['error']}"
        else:
            line += "       - (no ring at cp = 1)"
        print(line)
    print("  one attention layer alone (trident_bench_ring, medians over ranks and reps; best: "
          "from the minima): CPU s of a forward + backward pass (tiles and waits), its messages "
          "alone (wall), hidden share fwd / bwd from the medians (wall, CPU) and the minima (wall, CPU)")
    print(f"  {'cp':>3} {'pass cpu':>8} {'alone s':>8}  {'hidden':>11} {'hid cpu':>11} "
          f"{'best':>11} {'best cpu':>11}")
    for r in rows:
        b = r.get("ring_alone")
        if not b or "error" in b:
            continue
        two = lambda f, bw: f"{pct(b[f])} / {pct(b[bw])}" if r["cp"] > 1 else "-"
        print(f"  {r['cp']:>3} {b['forward_cpu_s'] + b['backward_cpu_s']:8.3f} "
              f"{b['forward_alone_s'] + b['backward_alone_s']:8.4f}  "
              f"{two('forward_hidden', 'backward_hidden'):>11} "
              f"{two('forward_hidden_cpu', 'backward_hidden_cpu'):>11} "
              f"{two('forward_hidden_best', 'backward_hidden_best'):>11} "
              f"{two('forward_hidden_cpu_best', 'backward_hidden_cpu_best'):>11}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": {"n_layer": a.layers, "d_model": a.dmodel, "n_head": a.heads,
                                 "vocab": a.vocab, "seq_len": a.seq, "tiny_seq_len": a.tiny},
                       "steps": a.steps, "cores": cores, "load_average": load, "rows": rows},
                      f, indent=2)
        print(f"results: {a.json}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
