"""What the layout tests share: a tiny deck, a fixed batch and a token stream in a scratch
folder, `trident` under mpirun, and comparisons against the serial run."""
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np

TRIDENT = os.environ["TRIDENT"]


def deck_text(V, T, L, H, C, mbs, gbs, steps, warmup):
    return f"""
[model]
vocab_size = {V}
seq_len = {T}
n_layer = {L}
n_head = {H}
d_model = {C}
[parallel]
micro_batch_size = {mbs}
[train]
steps = {steps}
global_batch_size = {gbs}
warmup_steps = {warmup}
lr = 3e-3
grad_clip = 0.5
[data]
train = "tokens.h5"
[io]
out_dir = "run"
resume = "none"
[runtime]
threads = 1
watchdog_s = 120   # a hang fails the test naming the rank, the action and the peer
"""


def memory_report(stdout):
    """The end-of-run memory line of `trident train` (rank 0) in bytes: {"measured",
    "predicted", "activations", "activations_predicted"}."""
    size = r"([0-9.]+ [KMG]iB)"
    m = re.search(rf"memory: rank 0 measured peak {size} \(predicted {size}\); "
                  rf"activations {size} \(predicted {size}\)", stdout)
    if not m:
        sys.exit("FAIL: no 'memory: rank 0 measured peak' line in the output")
    unit = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    value = [round(float(v.split()[0]) * unit[v.split()[1]]) for v in m.groups()]
    return dict(zip(("measured", "predicted", "activations", "activations_predicted"), value))


class LayoutTest:
    """A scratch folder $TRIDENT_TEST_OUT/<name> with deck.toml, batch.h5 (gbs x T random
    ids), tokens.h5 (a noisy counter, so training learns) and the serial weights w.h5."""
    run_timeout = 120  # seconds a run() may take

    def __init__(self, name, deck, V, T, gbs, seed):
        self.name = name
        self.out = os.path.join(os.environ.get("TRIDENT_TEST_OUT", "/tmp"), name)
        self.failures = []
        shutil.rmtree(self.out, ignore_errors=True)
        os.makedirs(self.out)
        with open(os.path.join(self.out, "deck.toml"), "w") as f:
            f.write(deck)
        rng = np.random.default_rng(seed)
        with h5py.File(os.path.join(self.out, "batch.h5"), "w") as f:
            f["inputs"] = rng.integers(0, V, (gbs, T)).astype(np.int32)
            f["targets"] = rng.integers(0, V, (gbs, T)).astype(np.int32)
        tokens = (np.arange(20000) * 7 + rng.integers(0, 3, 20000)) % V
        with h5py.File(os.path.join(self.out, "tokens.h5"), "w") as f:
            f["tokens"] = tokens.astype(np.int32)
            f.attrs["vocab_size"] = V
            f.attrs["tokenizer"] = "byte" if V <= 256 else "sentencepiece"
            if V > 256:
                f["tokenizer/model"] = np.zeros(1, np.uint8)  # never decoded by training
        self.run(1, "init", "deck.toml", "--out", "w.h5")

    def path(self, *parts):
        return os.path.join(self.out, *parts)

    def run(self, np_, *args, sets=()):
        cmd = [TRIDENT, *args]
        for kv in sets:
            cmd += ["--set", kv]
        if np_ > 1:
            cmd = ["mpirun", "-np", str(np_), "--oversubscribe", *cmd]
        p = subprocess.run(cmd, cwd=self.out, capture_output=True, text=True,
                           timeout=self.run_timeout)
        if p.returncode != 0:
            print(p.stdout[-2000:], p.stderr[-2000:])
            sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}")
        self.last_stdout, self.last_stderr = p.stdout, p.stderr

    def check(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            self.failures.append(what)

    def grad(self, np_, out, sets=()):
        """`trident grad` on w.h5 and batch.h5: (loss, {name: gradient})."""
        self.run(np_, "grad", "deck.toml", "--weights", "w.h5", "--batch", "batch.h5", "--out",
                 out, sets=sets)
        with h5py.File(self.path(out), "r") as f:
            return float(f.attrs["loss"]), {k: f["grad"][k][:] for k in f["grad"]}

    def check_grad(self, what, got, ref, loss_rtol):
        (loss, g), (ref_loss, ref_g) = got, ref
        worst = max((float(np.abs(g[k] - r).max() / np.abs(r).max()), k) for k, r in ref_g.items())
        self.check(abs(loss - ref_loss) <= loss_rtol * abs(ref_loss),
                   f"grad {what}: loss {loss:.9f} vs serial {ref_loss:.9f}")
        self.check(worst[0] <= 1e-5, f"grad {what}: worst max|d|/max|g| = {worst[0]:.2e} ({worst[1]})")

    def train(self, np_, out_dir, sets=(), columns=("loss",)):
        """`trident train` into out_dir: the metrics columns asked for."""
        self.run(np_, "train", "deck.toml", sets=[f"io.out_dir={out_dir}", *sets])
        with h5py.File(self.path(out_dir, "metrics.h5"), "r") as f:
            return [f[c][:] for c in columns]

    def check_curve(self, what, got, ref):
        rel = float(np.max(np.abs(got - ref) / np.abs(ref)))
        self.check(rel <= 1e-5, f"train {what}: {len(ref)} losses within 1e-5 relative of serial ({rel:.2e})")

    def finish(self):
        if self.failures:
            sys.exit(f"{len(self.failures)} check(s) failed")
        print(f"{self.name}: PASS")
