"""The CUDA backend's bf16 weight cache (CudaOps::set_weights, src/ops/cuda/cuda_ops.hpp) in
real training under runtime.precision = "bf16": the products read their weight operand from
one bf16 copy of the parameters, remade after every change. The copy is the same rounding of
the same fp32 weights as each product's own conversion, so the loss curve with the cache must
be the one without it (TRIDENT_CUDA_WEIGHT_CACHE=0) bit for bit; a copy left stale after any
write of the weights changes the next step's loss (the weights move by ~lr, far more than a
bf16 step of the tiny model's weights). Each way the weights are written is a case:
  serial       AdamW's update (an op's write into the range)
  dp2-zero     ZeRO-1's all-gather of the updated shards (staged through the host here: the
               copy back is CudaMemory::to_device's, which the cache watches)
  dp2-zero-direct  the same with TRIDENT_MPI_CUDA_AWARE=1: MPI writes the device memory itself
               (the stand-in's is host memory), as a CUDA-aware MPI on a GPU does; only
               AdamW::step's weights_changed() tells the cache (Ops::adamw_segments refreshed
               it for this rank's shard alone)
  dp2          every rank updates every parameter: adamw_segments writes the cache's copy as
               it updates, and the cache stays fresh across the step (no conversion pass)
  pipedream    per-microbatch updates and weight-version swaps inside a step (ops' copies;
               Llama with untied embeddings, as the schedule needs: the products are gemm's)
  pipedream-2bw  the delayed W(t-1) swapped in and out each step
  resume       a checkpoint's weights copied from the host (CudaMemory::to_device's watch;
               no product runs between set_weights and the restore, so a missed watch
               would not show here: the stale flag is already down)
plus the curve against the fp32 CPU within the bf16 checks' 1e-3 (device_layouts.py).
usage: TRIDENT=... TRIDENT_TEST_OUT=... python3 weight_cache.py (emulate/train.sh, gpu_check.sh)
"""
import os
import shutil
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.environ.get("TRIDENT_SOURCE_DIR", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "..")), "test", "mpi"))
import layout_common as lc  # noqa: E402

V, T, L, H, C = 64, 16, 2, 4, 32
MBS, GBS, STEPS = 2, 8, 5
BF16 = ['runtime.device="cuda"', 'runtime.precision="bf16"', "io.checkpoint_every=0",
        "train.eval_every=0"]


def main():
    t = lc.LayoutTest("cuda.weight_cache", lc.deck_text(V, T, L, H, C, MBS, GBS, STEPS, 1), V, T,
                      GBS, 13)
    mpi = shutil.which("mpirun") is not None
    cases = [("serial", 1, [])]
    if mpi:
        cases += [("dp2-zero", 2, ["parallel.dp=2", "parallel.zero_stage=1",
                                   "parallel.grad_bucket_mb=0.02"]),
                  ("dp2-zero-direct", 2, ["parallel.dp=2", "parallel.zero_stage=1",
                                          "parallel.grad_bucket_mb=0.02"]),
                  ("dp2", 2, ["parallel.dp=2", "parallel.grad_bucket_mb=0.02"]),
                  ("pipedream", 2, ["parallel.pp=2", 'parallel.schedule="pipedream"',
                                    "train.grad_clip=0", 'model.arch="llama"',
                                    "model.tie_embeddings=false"]),
                  ("pipedream-2bw", 2, ["parallel.pp=2", 'parallel.schedule="pipedream-2bw"'])]
    for name, np_, sets in cases:
        if name.endswith("-direct"):
            os.environ["TRIDENT_MPI_CUDA_AWARE"] = "1"
        os.environ["TRIDENT_CUDA_WEIGHT_CACHE"] = "0"
        try:
            plain, = t.train(np_, f"plain-{name}", sets=[*sets, *BF16])
        finally:
            del os.environ["TRIDENT_CUDA_WEIGHT_CACHE"]
        try:
            cached, = t.train(np_, f"cached-{name}", sets=[*sets, *BF16])
        finally:
            os.environ.pop("TRIDENT_MPI_CUDA_AWARE", None)
        moved = float(np.max(np.abs(np.diff(plain))))
        t.check(moved > 1e-3, f"{name}: the loss moves between steps (max |d| {moved:.2e})")
        t.check(np.array_equal(cached, plain),
                f"{name}: {len(plain)} losses with the weight cache equal those without it "
                f"(max |d| {float(np.max(np.abs(cached - plain))):.2e})")
        if name == "serial":
            cpu, = t.train(np_, "cpu-serial", sets=[*sets, "io.checkpoint_every=0",
                                                    "train.eval_every=0"])
            rel = float(np.max(np.abs(cached - cpu) / np.abs(cpu)))
            t.check(rel <= 1e-3, f"serial: within 1e-3 of the fp32 CPU curve ({rel:.2e})")

    # A resume: 2 steps and a checkpoint, then the rest from it, with and without the cache.
    half = [*BF16[:2], "train.eval_every=0", "io.checkpoint_every=2"]
    resumed = {}
    for side in ("plain", "cached"):
        if side == "plain":
            os.environ["TRIDENT_CUDA_WEIGHT_CACHE"] = "0"
        try:
            out = f'io.out_dir="resume-{side}"'
            t.run(1, "train", "deck.toml", sets=[out, "train.steps=2", *half])
            t.run(1, "train", "deck.toml", sets=[out, 'io.resume="auto"', *half])
        finally:
            os.environ.pop("TRIDENT_CUDA_WEIGHT_CACHE", None)
        with h5py.File(t.path(f"resume-{side}", "metrics.h5"), "r") as f:
            resumed[side] = f["loss"][:]
    t.check(len(resumed["plain"]) == STEPS and np.array_equal(resumed["cached"], resumed["plain"]),
            f"resume at step 2: {len(resumed['plain'])} losses with the cache equal those without it")
    t.finish()


if __name__ == "__main__":
    main()
