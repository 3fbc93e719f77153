"""mpi.device_layouts — trident on device memory against trident on the CPU, layout by layout.

TRIDENT_TEST_DEVICE picks the device (default "cpu-guarded"):
  cpu-guarded  the CPU kernels on guarded memory that host code cannot touch
               (ops/cpu/guarded_ops.cpp): every host <-> device crossing (tokens, loss,
               checkpoints, MPI staging of TP/PP/DP traffic) is exercised, and a missing one
               crashes. Same kernels, so every result must be bit-identical to "cpu".
  cuda         the GPU (skipped, exit 77, when none is visible). Ranks share the GPU. fp32
               products: gradients within 1e-4 of the CPU's (max|d|/max|g| per tensor), losses
               within 1e-4 relative; bf16 (TRIDENT_TEST_PRECISION=bf16, or the bf16 case
               below): 20 steps within 1e-3 of the fp32 CPU loss curve (and 6 steps in a few
               layouts, with heads of 16 among them: attention on the tensor cores), and the
               arena's peak below fp32's by the bf16 stash's predicted saving.
Cases: serial training with eval, a checkpoint and a resume; tp 2; tp 2 with sequence
parallelism; pp 2 under 1f1b, zb-h1, interleaved-1f1b and zb-v (vpp 2) (bf16: also GPT-2 and
Llama under zb-h1 and zb-v, with and without full recompute, against the serial bf16 run and
the zb-v arena's peak; GPT-2 under selective recompute serial, pp 2 1f1b and zb-v, tp 2, and
its arena's peak; Llama's serial, pp 2 zb-v, tp 2 with and without SP, tp 4, and its arena's
peak; context parallelism on the fused blocks: GPT-2 cp 2 ring, Ulysses, x tp 2, selective,
x pp 2 zb-v, Llama cp 2 ring, Ulysses, x tp 2 selective, against the fp32 CPU and the serial bf16
run, and GPT-2's and Llama's cp 2 arena peaks; in seven of them the ring and Ulysses on the
block's bf16 operands against TRIDENT_CUDA_CP_BF16=0's fp32 copies (close, the same bytes), and
those copies' bf16 wire against TRIDENT_CUDA_CP_BF16_WIRE=0: bit for bit, fewer bytes); dp 2, alone and with ZeRO-1
(small buckets: several deferred collectives in flight at once);
tp 2 x pp 2; `trident grad` serial and at tp 2 x dp 2 (ZeRO-1's gradient gather).
"""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layout_common as lc  # noqa: E402

DEVICE = os.environ.get("TRIDENT_TEST_DEVICE", "cpu-guarded")
PRECISION = os.environ.get("TRIDENT_TEST_PRECISION", "fp32")
EXACT = DEVICE == "cpu-guarded"
V, T, L, H, C = 64, 16, 4, 4, 32


def gpu_visible():
    if not shutil.which("nvidia-smi"):
        return False
    p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return p.returncode == 0 and "GPU" in p.stdout


def device_sets(precision=PRECISION):
    return [f'runtime.device="{DEVICE}"', f'runtime.precision="{precision}"']


def weights_of(path):
    with h5py.File(path, "r") as f:
        return {k: f["model"][k][:] for k in f["model"]}


def check_cp_wire(t):
    """bf16 on a GPU: context parallelism on the fused bf16 block. By default the ring and
    Ulysses run on the block's bf16 operands (BlockAttention's bf16 entry points: bf16 buffers,
    no fp32 copies); TRIDENT_CUDA_CP_BF16=0 calls them on fp32 copies, where they move bf16 only
    where that is exact (bf16_exact: the ring's key/value blocks and each gradient's last hop,
    Ulysses' every all-to-all), and TRIDENT_CUDA_CP_BF16_WIRE=0 besides sends fp32. The copies'
    two wires: losses and final weights bit for bit, fewer bytes with bf16 (a ring that sent its
    summed dk/dv partials as bf16 fails it). The bf16 operands against the copies: the same
    bytes on the cp communicator (rank 0's comm/cp/bytes over the run), losses within 2e-4
    relative (the ring rounds each block's partial output to bf16 once more; said whether the
    losses and final weights are bit for bit: Ulysses' are on the stand-in). Not the weights'
    values: AdamW turns the noise of gradients that are zero in exact arithmetic (GPT-2's key
    bias) into whole steps of the learning rate."""
    llama = ['model.arch="llama"', "model.n_kv_head=2"]
    ulysses = 'parallel.cp_mode="ulysses"'
    zb_v = ["parallel.vpp=2", 'parallel.schedule="zb-v"']
    cases = [("cp2", 2, ["parallel.cp=2"]), ("cp2-ulysses", 2, ["parallel.cp=2", ulysses]),
             ("llama-cp2", 2, [*llama, "parallel.cp=2"]),
             ("llama-cp2-ulysses", 2, [*llama, "parallel.cp=2", ulysses]),
             ("cp2-tp2", 4, ["parallel.cp=2", "parallel.tp=2"]),
             ("cp2-sel", 2, ["parallel.cp=2", 'parallel.recompute="selective"']),
             ("cp2-pp2-zbv", 4, ["parallel.cp=2", "parallel.pp=2", *zb_v])]
    knobs = {"bf16": {}, "copies": {"TRIDENT_CUDA_CP_BF16": "0"},
             "fp32": {"TRIDENT_CUDA_CP_BF16": "0", "TRIDENT_CUDA_CP_BF16_WIRE": "0"}}
    for lname, np_, sets in cases:
        runs = {}
        for wire, env in knobs.items():
            os.environ.update(env)
            try:
                loss, sent = t.train(np_, f"wire-{wire}-{lname}",
                                     sets=[*sets, *device_sets("bf16")],
                                     columns=("loss", "comm/cp/bytes"))
            finally:
                for k in env:
                    os.environ.pop(k, None)
            weights = weights_of(t.path(f"wire-{wire}-{lname}", "checkpoints",
                                        "step-00000006.h5"))
            runs[wire] = (loss, float(np.sum(sent)), weights)
        (loss16, sent16, w16), (loss32, sent32, w32) = runs["copies"], runs["fp32"]
        t.check(np.array_equal(loss16, loss32), f"cp wire {lname}: {len(loss32)} losses bit "
                "for bit with TRIDENT_CUDA_CP_BF16_WIRE=0 (both TRIDENT_CUDA_CP_BF16=0)")
        t.check(w16.keys() == w32.keys() and all(np.array_equal(w16[k], w32[k]) for k in w32),
                f"cp wire {lname}: weights after 6 steps bit for bit with the fp32 wire")
        t.check(0 < sent16 < sent32, f"cp wire {lname}: rank 0 sent {sent16:.0f} B over cp, "
                f"{sent32:.0f} B with the fp32 wire ({sent16 / sent32:.3f})")
        lossb, sentb, wb = runs["bf16"]
        rel = float(np.max(np.abs(lossb - loss16) / np.abs(loss16)))
        bits = (np.array_equal(lossb, loss16) and wb.keys() == w16.keys() and
                all(np.array_equal(wb[k], w16[k]) for k in w16))
        t.check(rel <= 2e-4, f"cp bf16 {lname}: {len(loss16)} losses within {rel:.2e} of "
                f"TRIDENT_CUDA_CP_BF16=0's (losses and weights "
                f"{'bit for bit' if bits else 'not bit for bit'})")
        t.check(sentb == sent16, f"cp bf16 {lname}: rank 0 sent {sentb:.0f} B over cp, as "
                f"the fp32 copies' bf16 wire ({sent16:.0f} B)")


def main():
    if DEVICE == "cuda" and not gpu_visible():
        print("mpi.device_layouts: no GPU visible: skipped")
        return 77
    name = "mpi.device_layouts" + ("" if EXACT else "." + DEVICE)
    t = lc.LayoutTest(name, lc.deck_text(V, T, L, H, C, 2, 8, 6, 2), V, T, 8, 5)
    # The shared deck, with evaluation on the training tokens and a checkpoint at step 3.
    with open(t.path("deck.toml")) as f:
        text = f.read()
    text = text.replace('train = "tokens.h5"', 'train = "tokens.h5"\nvalid = "tokens.h5"')
    text = text.replace("[train]", "[train]\neval_every = 3\neval_batches = 1", 1)
    # overwrite: the CUDA-aware pass below trains into the dev-* out_dirs a second time
    text = text.replace("[io]", "[io]\ncheckpoint_every = 3\noverwrite = true", 1)
    with open(t.path("deck.toml"), "w") as f:
        f.write(text)

    def same(what, got, ref, tol):
        if EXACT:
            ok = all(np.array_equal(got[k], ref[k]) for k in ref) and got.keys() == ref.keys()
            t.check(ok, f"{what}: bit-identical to cpu")
        else:
            worst = max((float(np.abs(got[k] - r).max() / max(np.abs(r).max(), 1e-30)), k)
                        for k, r in ref.items())
            t.check(worst[0] <= tol, f"{what}: worst max|d|/max|ref| = {worst[0]:.2e} ({worst[1]}) <= {tol:g}")

    def curve(what, got, ref, tol):
        rel = float(np.max(np.abs(got - ref) / np.abs(ref)))
        if EXACT:
            t.check(np.array_equal(got, ref), f"{what}: {len(ref)} losses bit-identical to cpu")
        else:
            t.check(rel <= tol, f"{what}: {len(ref)} losses within {tol:g} relative of cpu ({rel:.2e})")

    # ---- training, with eval, checkpoints and a resume ----------------------------------
    layouts = [
        ("serial", 1, []),
        ("tp2", 2, ["parallel.tp=2"]),
        ("tp2-sp", 2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
        ("pp2-1f1b", 2, ["parallel.pp=2"]),
        ("pp2-zb", 2, ["parallel.pp=2", 'parallel.schedule="zb-h1"']),
        ("pp2-vpp2", 2, ["parallel.pp=2", "parallel.vpp=2", 'parallel.schedule="interleaved-1f1b"']),
        ("pp2-zbv", 2, ["parallel.pp=2", "parallel.vpp=2", 'parallel.schedule="zb-v"']),
        ("dp2", 2, ["parallel.dp=2", "parallel.grad_bucket_mb=0.02"]),
        ("dp2-zero", 2, ["parallel.dp=2", "parallel.zero_stage=1", "parallel.grad_bucket_mb=0.02"]),
        ("tp2xpp2", 4, ["parallel.tp=2", "parallel.pp=2"]),
        # Context parallelism: the ring (key/value blocks between the ranks' device buffers)
        # and Ulysses (all-to-all over heads).
        ("cp2", 2, ["parallel.cp=2"]),
        ("cp2-ulysses", 2, ["parallel.cp=2", 'parallel.cp_mode="ulysses"']),
    ]
    # Each layout on the CPU and on the device (reductions are ordered by the layout, so the
    # reference is the CPU in the same layout).
    cpu_curves = {}
    for lname, np_, sets in layouts:
        ref_loss, = t.train(np_, f"cpu-{lname}", sets=sets)
        cpu_curves[lname] = ref_loss
        got_loss, = t.train(np_, f"dev-{lname}", sets=[*sets, *device_sets()])
        curve(f"train {lname}", got_loss, ref_loss, 1e-4)
        same(f"weights after 6 steps {lname}",
             weights_of(t.path(f"dev-{lname}", "checkpoints", "step-00000006.h5")),
             weights_of(t.path(f"cpu-{lname}", "checkpoints", "step-00000006.h5")), 1e-3)
        if lname in ("serial", "pp2-vpp2"):
            evals = []
            for side in ("cpu", "dev"):
                with h5py.File(t.path(f"{side}-{lname}", "metrics.h5"), "r") as f:
                    evals.append(f["eval/loss"][:])
            curve(f"eval {lname}", evals[1], evals[0], 1e-4)
    # A serial run's step-3 checkpoint resumed at dp 2 with ZeRO-1 (moments scattered to
    # shards), on each side.
    for side, extra in (("cpu", []), ("dev", device_sets())):
        t.run(1, "train", "deck.toml", sets=[f'io.out_dir="{side}-resume"', "train.steps=3", *extra])
        t.run(2, "train", "deck.toml", sets=[f'io.out_dir="{side}-resume"', 'io.resume="auto"',
                                              "parallel.dp=2", "parallel.zero_stage=1", *extra])
    same("serial run resumed at dp 2 with ZeRO-1",
         weights_of(t.path("dev-resume", "checkpoints", "step-00000006.h5")),
         weights_of(t.path("cpu-resume", "checkpoints", "step-00000006.h5")), 1e-3)

    # ---- gradients: trident grad ----------------------------------------------------------
    for gname, np_, sets in [("serial", 1, []),
                             ("tp2xdp2-zero", 4, ["parallel.tp=2", "parallel.dp=2",
                                                  "parallel.zero_stage=1"])]:
        ref_grad = t.grad(np_, f"g-cpu-{gname}.h5", sets=sets)
        loss, g = t.grad(np_, f"g-dev-{gname}.h5", sets=[*sets, *device_sets()])
        curve(f"grad {gname} loss", np.array([loss]), np.array([ref_grad[0]]), 1e-5)
        same(f"grad {gname}", g, ref_grad[1], 1e-4)

    # ---- no GPU: runtime.device = "cuda" is one clear error, on every rank's exit ----------
    if DEVICE != "cuda" and not gpu_visible():
        cmd = ["mpirun", "-np", "2", "--oversubscribe", lc.TRIDENT, "train", "deck.toml",
               "--set", 'runtime.device="cuda"', "--set", "parallel.dp=2",
               "--set", 'io.out_dir="no-gpu"']
        p = subprocess.run(cmd, cwd=t.out, capture_output=True, text=True, timeout=120)
        said = [ln for ln in (p.stdout + p.stderr).splitlines() if "runtime.device" in ln]
        t.check(p.returncode != 0 and len(said) == 1 and
                ("no CUDA GPU is visible" in said[0] or "built without CUDA" in said[0]),
                f"runtime.device = \"cuda\" without a GPU: exit {p.returncode}, {said}")

    # ---- a CUDA-aware MPI: device pointers to MPI against host staging -------------------
    if DEVICE == "cuda":
        for lname, np_, sets in [l for l in layouts if l[0] in ("dp2-zero", "tp2xpp2")]:
            direct, = t.train(np_, f"dev-{lname}", sets=[*sets, *device_sets()])
            said = "CUDA-aware: device buffers are passed to MPI" in t.last_stdout
            os.environ["TRIDENT_MPI_CUDA_AWARE"] = "0"
            try:
                staged, = t.train(np_, f"staged-{lname}", sets=[*sets, *device_sets()])
            finally:
                del os.environ["TRIDENT_MPI_CUDA_AWARE"]
            rel = float(np.max(np.abs(staged - direct) / np.abs(direct)))
            t.check(rel <= 1e-6, f"{lname}: host-staged MPI against the default "
                    f"({'direct' if said else 'also staged: MPI is not CUDA-aware'}): {rel:.2e}")

    # ---- bf16 on a GPU: loss curves against the fp32 CPU's ----------------------------------
    # bf16 rounds the products' inputs and the stash (each layer's large activations) to 8
    # significant bits. Measured on the CUDA stand-in (emulate/train.sh), 20 serial steps:
    # 7.6e-5 with an fp32 stash, 8.9e-5 with the bf16 one; an H200 gave 1.6e-4 (fp32 stash).
    # 1e-3 leaves room for the GPU's own rounding and still fails a stash mix-up: one stale
    # tensor (a layer's GELU output left from another layer) moves the curve 7.4e-3. The
    # zero-bubble split backward unpacks every layer twice (B and W), and sequence
    # parallelism stashes rows of two sizes; Llama's MLP stashes gate | up: each 6 steps
    # against the CPU in the same layout. TP 2 (alone, with SP, x pp 2, x pp 2 under zb-v with
    # and without SP) runs GPT-2's fused block with its collectives: against the CPU and the
    # serial bf16 run. Llama's the same (llama_tp below).
    if DEVICE == "cuda":
        twenty = ["train.steps=20", "io.checkpoint_every=0", "train.eval_every=0"]
        cpu20, = t.train(1, "cpu-20", sets=twenty)
        bf20, = t.train(1, "bf16-20", sets=[*twenty, *device_sets("bf16")])
        rel = float(np.max(np.abs(bf20 - cpu20) / np.abs(cpu20)))
        t.check(rel <= 1e-3, f"bf16: 20 losses within 1e-3 of the fp32 CPU curve ({rel:.2e})")
        llama = ['model.arch="llama"', "model.n_kv_head=2"]  # SwiGLU: [gate | up] stashed
        cpu_curves["llama"], = t.train(1, "cpu-llama", sets=llama)
        # Two heads of 16: attention on the tensor cores (flash_attention_tc.cu; the heads of 8
        # above keep the fp32 kernels), GPT and Llama with both query heads on one kv head.
        tc = [("hs16", 1, ["model.n_head=2"]),
              ("hs16-llama-gqa", 1, ['model.arch="llama"', "model.n_head=2", "model.n_kv_head=1"])]
        for lname, _, sets in tc:
            cpu_curves[lname], = t.train(1, f"cpu-{lname}", sets=sets)
        # The zero-bubble split backward on the fused block (B with a W stash in the layers'
        # dead bf16 qkv and fch, or its own under full recompute; then W), GPT-2 and Llama.
        zb_h1, zb_v = ['parallel.schedule="zb-h1"'], ["parallel.vpp=2", 'parallel.schedule="zb-v"']
        zb = [("pp2-zb-full", 2, ["parallel.pp=2", *zb_h1, 'parallel.recompute="full"']),
              ("llama-pp2-zb", 2, [*llama, "parallel.pp=2", *zb_h1]),
              ("llama-pp2-zbv", 2, [*llama, "parallel.pp=2", *zb_v]),
              ("llama-pp2-zbv-full", 2, [*llama, "parallel.pp=2", *zb_v,
                                         'parallel.recompute="full"']),
              # GPT-2's fused block under TP (c_projs' partials with the residual and bias
              # on TP rank 0 only, allreduced; the LayerNorms' input gradients allreduced)
              # and SP (bf16 LayerNorm rows all-gathered, partials reduce-scattered).
              ("tp2xpp2-zbv", 4, ["parallel.tp=2", "parallel.pp=2", *zb_v]),
              ("tp2xpp2-sp-zbv", 4, ["parallel.tp=2", "parallel.sequence_parallel=true",
                                     "parallel.pp=2", *zb_v])]
        # Selective recompute on GPT-2's fused block: each layer's bf16 qkv and fch kept, the
        # one shared bf16 atty, lse, fch_gelu filled again before its backward
        # (Ops::gpt2_block_recompute); pp 2 under 1f1b and zb-v, tp 2.
        sel = ['parallel.recompute="selective"']
        zb += [("sel", 1, sel), ("pp2-1f1b-sel", 2, ["parallel.pp=2", *sel]),
               ("pp2-zbv-sel", 2, ["parallel.pp=2", *zb_v, *sel]),
               ("tp2-sel", 2, ["parallel.tp=2", *sel])]
        # Llama's fused block under TP the same way: kv heads split (2 on tp 2) or replicated
        # (n_kv_head 1 < tp 2: each rank computes the one, its k/v weights' gradients summed
        # over TP), SP, and x pp 2 under zb-v.
        llama_kv1 = ['model.arch="llama"', "model.n_kv_head=1"]
        llama_tp = [("llama-kv1", 1, llama_kv1),
                    ("llama-tp2", 2, [*llama, "parallel.tp=2"]),
                    ("llama-tp2-sp", 2, [*llama, "parallel.tp=2",
                                         "parallel.sequence_parallel=true"]),
                    ("llama-tp2-kv1", 2, [*llama_kv1, "parallel.tp=2"]),
                    # 2 kv heads replicated over tp 4: each rank's query head reads the
                    # second on ranks 2, 3 (kv_head0), the other's gradient zero there.
                    ("llama-tp4", 4, [*llama, "parallel.tp=4"]),
                    ("llama-tp2xpp2-zbv", 4, [*llama, "parallel.tp=2", "parallel.pp=2", *zb_v]),
                    # context parallelism's ring: RoPE at each rank's two chunks' positions
                    ("llama-cp2", 2, [*llama, "parallel.cp=2"])]
        # The fused blocks under context parallelism (the ring or Ulysses as their attention
        # hook on fp32 copies of the bf16 [q k v]; Llama's bf16 RoPE per run of positions),
        # with TP, selective recompute, and pp 2 under zb-v.
        cp_fused = [("cp2-tp2", 4, ["parallel.cp=2", "parallel.tp=2"]),
                    ("cp2-sel", 2, ["parallel.cp=2", *sel]),
                    ("cp2-pp2-zbv", 4, ["parallel.cp=2", "parallel.pp=2", *zb_v]),
                    ("llama-cp2-ulysses", 2, [*llama, "parallel.cp=2",
                                              'parallel.cp_mode="ulysses"']),
                    ("llama-cp2-tp2-sel", 4, [*llama, "parallel.cp=2", "parallel.tp=2", *sel])]
        # Selective recompute on Llama's fused block (Ops::llama_block_recompute: attention on
        # the kept rotated bf16 [q k v], SwiGLU on the kept [gate up]); under TP on this rank's
        # heads and columns (tp 4: ranks 2, 3 read the second kv head, kv_head0).
        llama_tp += [("llama-sel", 1, [*llama, *sel]),
                     ("llama-pp2-zbv-sel", 2, [*llama, "parallel.pp=2", *zb_v, *sel]),
                     ("llama-tp2-sel", 2, [*llama, "parallel.tp=2", *sel]),
                     ("llama-tp2-sp-sel", 2, [*llama, "parallel.tp=2",
                                              "parallel.sequence_parallel=true", *sel]),
                     ("llama-tp4-sel", 4, [*llama, "parallel.tp=4", *sel])]
        # The LM head's vocabulary split unevenly over TP 3 (22 + 22 + 20 columns; the fused
        # head's two-pass classifier on each shard, the statistics combined over the group).
        uneven = [("tp3-vocab-uneven", 3, ["parallel.tp=3", "model.d_model=48", "model.n_head=6"])]
        for lname, np_, sets in zb + llama_tp + uneven + cp_fused:
            cpu_curves[lname], = t.train(np_, f"cpu-{lname}", sets=sets)
        bf16_curves = {}
        for lname, np_, sets in [("serial", 1, [])] + \
                [l for l in layouts if l[0] in ("pp2-zb", "pp2-zbv", "tp2-sp", "tp2", "tp2xpp2", "cp2",
                                                "cp2-ulysses")] + \
                [("llama", 1, llama)] + zb + tc + llama_tp + uneven + cp_fused:
            got, = t.train(np_, f"bf16-{lname}", sets=[*sets, *device_sets("bf16")])
            bf16_curves[lname] = got
            rel = float(np.max(np.abs(got - cpu_curves[lname]) / np.abs(cpu_curves[lname])))
            t.check(rel <= 1e-3, f"bf16 {lname}: 6 losses within 1e-3 of the fp32 CPU curve "
                    f"({rel:.2e})")
        # The split runs against the serial bf16 run of their architecture: the split B and W
        # run the whole fused backward's products (emulate/fused_block.cpp: bit for bit per
        # microbatch), so only the pipeline's order of sums and the roundings it moves differ.
        # Measured on the stand-in: 6.3e-6 (GPT-2; Llama's bit for bit); a W reading a stale
        # stash moves the curve far more (the fp32 CPU check above fails it at 1e-3).
        for lname, serial in (("pp2-zb", "serial"), ("pp2-zbv", "serial"),
                              ("pp2-zb-full", "serial"), ("llama-pp2-zb", "llama"),
                              ("llama-pp2-zbv", "llama"), ("llama-pp2-zbv-full", "llama"),
                              ("tp2", "serial"), ("tp2xpp2", "serial"),
                              ("tp2xpp2-zbv", "serial"), ("tp2-sp", "serial"),
                              ("tp2xpp2-sp-zbv", "serial"), ("llama-tp2", "llama"),
                              ("llama-tp2-sp", "llama"), ("llama-tp2-kv1", "llama-kv1"),
                              ("llama-tp4", "llama"), ("llama-tp2xpp2-zbv", "llama"),
                              ("sel", "serial"), ("pp2-1f1b-sel", "serial"),
                              ("pp2-zbv-sel", "serial"), ("tp2-sel", "serial"),
                              ("llama-sel", "llama"), ("llama-pp2-zbv-sel", "llama"),
                              ("llama-tp2-sel", "llama"), ("llama-tp2-sp-sel", "llama"),
                              ("llama-tp4-sel", "llama"), ("cp2", "serial"),
                              ("cp2-ulysses", "serial"), ("cp2-tp2", "serial"),
                              ("cp2-sel", "serial"), ("cp2-pp2-zbv", "serial"),
                              ("llama-cp2", "llama"), ("llama-cp2-ulysses", "llama"),
                              ("llama-cp2-tp2-sel", "llama")):
            ref = bf16_curves[serial]
            rel = float(np.max(np.abs(bf16_curves[lname] - ref) / np.abs(ref)))
            t.check(rel <= 2e-4, f"bf16 {lname}: 6 losses within 2e-4 of the serial bf16 run "
                    f"({rel:.2e})")

    if DEVICE == "cuda":
        check_cp_wire(t)

    # ---- bf16 on a GPU: the stash at 2 bytes, measured by the arena's high-water mark ------
    # bf16 keeps each layer's large activations as bf16 (GptChunk::bf16_storage). Two steps
    # of 4 microbatches of 8 under gpipe (all 4 stashes alive at once) make the stash most of
    # the peak; the measured peak must fall by what predict_memory says bf16 saves (4
    # microbatches x 4 layers x the fused block's bf16 stash, res2 fp32, and no fp32 working
    # copy; with TRIDENT_CUDA_FUSED_BLOCK=0 the packed stash less one working copy: ~1.6 MiB
    # either way) within 15% (the bf16 GEMM inputs' scratch, which the prediction leaves out,
    # and the report's 0.1 MiB rounding).
    # The zero-bubble split backward (zb-v, pp 2: rank 0's report) the same way: the fused
    # block's W stash in the layers' own bf16 qkv and fch, where fp32 keeps it in theirs.
    if DEVICE == "cuda":
        two = ["train.steps=2", "io.checkpoint_every=0", "train.eval_every=0",
               "parallel.micro_batch_size=8", "train.global_batch_size=32"]
        gpipe = ['parallel.schedule="gpipe"']
        # Llama's block (Ops::llama_block_*: the same stash rule) the same way.
        for arch, np_, arch_sets in (("", 1, gpipe),
                                     ("llama-", 1, [*gpipe, 'model.arch="llama"',
                                                    "model.n_kv_head=2"]),
                                     ("zbv-", 2, ["parallel.pp=2", "parallel.vpp=2",
                                                  'parallel.schedule="zb-v"']),
                                     ("tp2-", 2, [*gpipe, "parallel.tp=2"]),
                                     ("tp2-sp-", 2, [*gpipe, "parallel.tp=2",
                                                     "parallel.sequence_parallel=true"]),
                                     ("llama-tp2-", 2, [*gpipe, 'model.arch="llama"',
                                                        "model.n_kv_head=2", "parallel.tp=2"]),
                                     ("llama-tp2-sp-", 2, [*gpipe, 'model.arch="llama"',
                                                           "model.n_kv_head=2", "parallel.tp=2",
                                                           "parallel.sequence_parallel=true"]),
                                     # selective recompute: fp32's layers and shared copy
                                     # against the fused block's bf16 ones
                                     ("sel-", 1, [*gpipe, 'parallel.recompute="selective"']),
                                     ("llama-sel-", 1, [*gpipe, 'model.arch="llama"',
                                                        "model.n_kv_head=2",
                                                        'parallel.recompute="selective"']),
                                     # context parallelism: the fused block's stash and its
                                     # ring's / Ulysses' bf16 buffers against fp32's
                                     # composition
                                     ("cp2-", 2, [*gpipe, "parallel.cp=2"]),
                                     ("llama-cp2-", 2, [*gpipe, 'model.arch="llama"',
                                                        "model.n_kv_head=2", "parallel.cp=2"])):
            mem = {}
            for p in ("fp32", "bf16"):
                t.train(np_, f"mem-{arch}{p}", sets=[*two, *arch_sets, *device_sets(p)])
                mem[p] = lc.memory_report(t.last_stdout)
            measured = mem["fp32"]["measured"] - mem["bf16"]["measured"]
            predicted = mem["fp32"]["predicted"] - mem["bf16"]["predicted"]
            t.check(predicted > 0 and abs(measured - predicted) <= 0.15 * predicted,
                    f"{arch}bf16 stash: the arena's peak {mem['bf16']['measured']} B against "
                    f"fp32's {mem['fp32']['measured']} B: {measured} B less (predicted "
                    f"{predicted} B less)")
    t.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
