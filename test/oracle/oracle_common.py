"""Shared plumbing of the oracle drivers: environment, importing torch and tools/trident_torch.py,
running the trident binary with a clear message when it fails, and comparison tables.

defines: SKIP, setup, out_dir, run_trident, compare_tensors, Failures, check_model_group,
check_round_trip
"""

import os
import shlex
import subprocess
import sys

SKIP = 77  # CTest's SKIP_RETURN_CODE for these tests


def setup(test_name):
    """Threads before torch loads, torch/h5py/numpy or skip, then trident_torch.
    Returns (torch, np, h5py, tt)."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import h5py
        import numpy as np
        import torch
    except ImportError as e:
        print(f"{test_name}: skipped: {e} (install python3-torch, python3-h5py)")
        sys.exit(SKIP)
    src = os.environ.get("TRIDENT_SOURCE_DIR",
                         os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
    sys.path.insert(0, os.path.join(src, "tools"))
    import trident_torch as tt
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    return torch, np, h5py, tt


def out_dir(test_name):
    base = os.environ.get("TRIDENT_TEST_OUT", os.path.join(os.getcwd(), "test-out"))
    d = os.path.join(base, test_name)
    os.makedirs(d, exist_ok=True)
    return d


def trident_binary(test_name):
    exe = os.environ.get("TRIDENT")
    if not exe or not os.access(exe, os.X_OK):
        print(f"{test_name}: FAIL: $TRIDENT is not set to an executable trident binary "
              f"(got {exe!r})")
        sys.exit(1)
    return exe


def run_trident(test_name, args, cwd, mpi_ranks=1):
    """Run `$TRIDENT args...` (under `mpirun -np mpi_ranks` when more than one); on a non-zero
    exit print the command and its output and exit 1."""
    cmd = [trident_binary(test_name)] + [str(a) for a in args]
    if mpi_ranks > 1:
        cmd = ["mpirun", "-np", str(mpi_ranks), "--oversubscribe"] + cmd
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(f"{test_name}: FAIL: command exited with status {p.returncode}:\n"
              f"  {' '.join(shlex.quote(c) for c in cmd)}\n--- its output ---\n{p.stdout}"
              "--- end ---")
        sys.exit(1)
    return p.stdout


class Failures:
    """Collects failure lines; report() prints them and returns the exit status."""

    def __init__(self, test_name):
        self.test_name = test_name
        self.lines = []

    def add(self, line):
        self.lines.append(line)

    def check(self, ok, line):
        if not ok:
            self.add(line)
        return ok

    def report(self):
        if self.lines:
            print(f"\n{self.test_name}: FAIL ({len(self.lines)} problem(s)):")
            for line in self.lines:
                print("  " + line)
            return 1
        print(f"\n{self.test_name}: PASS")
        return 0


def compare_tensors(np, got, want, rel_tol, failures, what, scale=None):
    """Per tensor: max|got - want| <= rel_tol * scale, where scale defaults to max|want| of that
    tensor. Prints a table; adds a failure line per tensor out of tolerance (or mis-shaped).
    got, want: dict name -> array (want in float64). Returns the worst ratio."""
    print(f"  {'tensor':<28} {'shape':<14} {'max|ref|':>11} {'max|d|':>11} {'max|d|/ref':>11}")
    worst = 0.0
    for name, ref in want.items():
        ref = np.asarray(ref, dtype=np.float64)
        g = np.asarray(got[name], dtype=np.float64)
        if g.shape != ref.shape:
            failures.add(f"{what} {name}: shape {g.shape}, expected {ref.shape}")
            continue
        s = float(np.max(np.abs(ref))) if scale is None else float(scale(name, ref))
        d = float(np.max(np.abs(g - ref))) if ref.size else 0.0
        finite = bool(np.all(np.isfinite(g)))
        ratio = d / s if s > 0 else (0.0 if d == 0 else float("inf"))
        if not finite:
            ratio = float("inf")
        worst = max(worst, ratio)
        bad = ratio > rel_tol
        flag = "  <-- FAIL" if bad else ""
        print(f"  {name:<28} {str(list(ref.shape)):<14} {s:11.3e} {d:11.3e} {ratio:11.2e}{flag}")
        if bad:
            failures.add(f"{what} {name}: max|d| = {d:.3e} is {ratio:.2e} of max|ref| = {s:.3e} "
                         f"(tolerance {rel_tol:g})" + ("" if finite else "; non-finite values"))
    return worst


def check_model_group(f, table, fails, tag):
    """A weights file's /model (an open h5py File) holds exactly FORMAT.md's table
    (name -> shape), every dataset float32."""
    import h5py
    import numpy as np
    names = set()
    f["model"].visit(lambda n: names.add(n) if isinstance(f["model"][n], h5py.Dataset) else None)
    fails.check(names == set(table), f"{tag}: /model names differ from FORMAT.md: extra "
                f"{sorted(names - set(table))}, missing {sorted(set(table) - names)}")
    for n, shape in table.items():
        if n in f["model"]:
            ds = f["model"][n]
            fails.check(ds.shape == shape and ds.dtype == np.float32,
                        f"{tag}: /model/{n} is {ds.dtype} {ds.shape}, expected float32 {shape}")


def check_round_trip(tt, torch, model, wpath, cfg, fails, tag):
    """tools/trident_torch.py reads back what it wrote: the same config and every weight
    bit for bit. Returns the float64 model it loaded."""
    cfg2, model2 = tt.load_weights(wpath, dtype=torch.float64)
    fails.check(cfg2 == cfg, f"{tag}: load_weights config {cfg2} != {cfg}")
    for (n, a), (_, b) in zip(model.named_parameters(), model2.named_parameters()):
        fails.check(torch.equal(a.double(), b), f"{tag}: weights round trip: {n} differs")
    return model2
