"""Shared by the tests of test/tools and test/slurm: a tiny corpus, its token datasets, a
tiny deck, trident runs (serial or under mpirun) and metrics.h5 reading. Through the
command line and the HDF5 files only (FORMAT.md)."""
import os
import subprocess
import sys
import time

import h5py
import numpy as np

TRIDENT = os.environ.get("TRIDENT", "trident")
SOURCE = os.environ.get("TRIDENT_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
SKIP = 77  # CTest's SKIP_RETURN_CODE for these tests

# A model small enough that a step takes milliseconds on one core.
DECK = """
[model]
seq_len = 32
n_layer = 2
n_head = 2
d_model = 32
[parallel]
micro_batch_size = 4
[train]
steps = {steps}
global_batch_size = 8
lr = 3e-3
min_lr = 3e-4
warmup_steps = 10
eval_every = {eval_every}
eval_batches = 2
[data]
train = "{data}/train.h5"
valid = "{data}/valid.h5"
[io]
out_dir = "{out_dir}"
checkpoint_every = {checkpoint_every}
keep_checkpoints = 0
[runtime]
threads = 1
"""


class Checks:
    def __init__(self, name):
        self.name = name
        self.failures = []

    def __call__(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            self.failures.append(what)
        return cond

    def finish(self):
        if self.failures:
            sys.exit(f"{len(self.failures)} check(s) failed: {self.failures}")
        print(f"{self.name}: PASS")


def out_dir(name):
    return os.path.join(os.environ.get("TRIDENT_TEST_OUT", "/tmp"), name)


def mpi_env():
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    return env


def mpirun(np_):
    return ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none"]


def trident(*args, cwd, np_=0, timeout=300, check=True):
    """Runs trident (under mpirun when np_ > 0); returns the CompletedProcess."""
    cmd = (mpirun(np_) if np_ else []) + [TRIDENT, *args]
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env=mpi_env())
    if check and p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}")
    return p


def make_data(root):
    """<root>/data/{corpus.txt,train.h5,valid.h5}: an English-like byte corpus."""
    data = os.path.join(root, "data")
    os.makedirs(data, exist_ok=True)
    rng = np.random.default_rng(0)
    words = "and the of to in that he said unto for his lord shall they was is".split()
    with open(os.path.join(data, "corpus.txt"), "w") as f:
        f.write("\n".join(" ".join(rng.choice(words, 12)) + "." for _ in range(4000)) + "\n")
    trident("prepare-data", "--input", "data/corpus.txt", "--output", "data/train.h5",
            "--valid-output", "data/valid.h5", "--valid-every", "20", cwd=root)
    return data


def write_deck(path, out_dir, steps, eval_every=0, checkpoint_every=0, data="data"):
    with open(path, "w") as f:
        f.write(DECK.format(steps=steps, eval_every=eval_every, out_dir=out_dir,
                            checkpoint_every=checkpoint_every, data=data))
    return path


def read_metrics(path, tries=5):
    """The step and eval tables of a metrics.h5 as numpy arrays (retries a racing read)."""
    for i in range(tries):
        try:
            with h5py.File(path, "r") as f:
                m = {k: f[k][:] for k in ("step", "loss", "lr", "grad_norm", "step_time_s",
                                          "tokens_per_s") if k in f}
                if "eval" in f:
                    m["eval/step"] = f["eval/step"][:]
                    m["eval/loss"] = f["eval/loss"][:]
                return m
        except OSError:
            if i == tries - 1:
                raise
            time.sleep(0.5)


def checkpoint_path(run_dir, step):
    return os.path.join(run_dir, "checkpoints", f"step-{step:08d}.h5")


def checkpoint_step(path):
    with h5py.File(path, "r") as f:
        return int(f.attrs["step"])


def same_curve(check, ref_metrics, got_metrics, what):
    """Checks that two runs' tables are bitwise the same (steps, loss, lr, grad norm, eval)."""
    a, b = read_metrics(ref_metrics), read_metrics(got_metrics)
    check(np.array_equal(a["step"], b["step"]),
          f"{what}: steps 1..{len(a['step'])} once each (got {len(b['step'])} rows)")
    if len(a["step"]) == len(b["step"]):
        for col in ("loss", "lr", "grad_norm"):
            check(np.array_equal(a[col], b[col]), f"{what}: {col} bitwise equal to the "
                  "uninterrupted run")
    if "eval/step" in a:
        check("eval/step" in b and np.array_equal(a["eval/step"], b["eval/step"])
              and np.array_equal(a["eval/loss"], b["eval/loss"]),
              f"{what}: eval losses bitwise equal")


def rank_pids(mpirun_pid):
    """{world rank: pid} of the trident processes mpirun started."""
    ranks = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            if b"OMPI_COMM_WORLD_RANK" in env:
                ranks[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(d)
        except (OSError, ValueError, IndexError):
            continue
    return ranks
