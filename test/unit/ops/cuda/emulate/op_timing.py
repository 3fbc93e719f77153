"""The CUDA backend's per-op timing (TRIDENT_OP_TIMING, src/ops/cuda/op_timer.hpp) in real
training: `trident train` on runtime.device = "cuda" (the CPU stand-in under emulate/train.sh,
where the events are host clock readings; a real GPU under bench/gpu_check.sh).
Checks: no file when the variable is unset; with it, a JSON table whose shares sum to 1, whose
total is within the run's wall time, and whose counts are the step's: the optimizer's
adamw_segments and sum_squares_spans once a step (no per-tensor adamw, sum_squares), the
one-pass classifier (xent_forward) once per microbatch in a serial run and the three-pass one
per shard (xent_shard_stats, xent_rescale_sumexp, xent_loss) at tp 2, where the vocabulary is
sharded; under bf16 the fused LM head's steps once per microbatch (and the one-pass
classifier again with TRIDENT_CUDA_FUSED_HEAD=0), at tp 2 its two-pass form on each shard; at cp 2
under bf16 the fused block's ring on its bf16 operands (no copies, bf16 attention), with
TRIDENT_CUDA_CP_BF16=0 its attention hook copies once per layer forward and backward (none with
TRIDENT_CUDA_FUSED_BLOCK=0); rank 1 writes
FILE.rank1 (left out where there is no mpirun). usage: TRIDENT=... TRIDENT_TEST_OUT=... python3 op_timing.py
"""
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.environ.get("TRIDENT_SOURCE_DIR", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "..")), "test", "mpi"))
import layout_common as lc  # noqa: E402

V, T, L, H, C = 64, 16, 2, 4, 32
MBS, GBS, STEPS = 2, 8, 3
DEVICE = ["runtime.device=\"cuda\""]


def table(path):
    with open(path) as f:
        return json.load(f)


def calls(tab, name):
    return sum(r["calls"] for r in tab["ops"] if r["op"] == name)


def calls_of(tab, prefix):
    return sum(r["calls"] for r in tab["ops"] if r["op"].startswith(prefix))


def main():
    t = lc.LayoutTest("cuda.op_timing", lc.deck_text(V, T, L, H, C, MBS, GBS, STEPS, 1), V, T,
                      GBS, 11)
    os.environ.pop("TRIDENT_OP_TIMING", None)
    t.train(1, "off", sets=DEVICE)
    t.check(not any(n.startswith("ops") for n in os.listdir(t.out)),
            "TRIDENT_OP_TIMING unset: no table written")

    path = t.path("ops.json")
    os.environ["TRIDENT_OP_TIMING"] = path
    t0 = time.monotonic()
    t.train(1, "serial", sets=DEVICE)
    wall_ms = 1e3 * (time.monotonic() - t0)
    tab = table(path)
    shares = sum(r["share"] for r in tab["ops"])
    t.check(abs(shares - 1.0) <= 1e-4, f"serial: shares sum to {shares:.6f}")
    t.check(0 < tab["total_ms"] <= wall_ms,
            f"serial: {tab['total_ms']:.1f} ms of ops within the run's {wall_ms:.0f} ms ({tab['events']} events)")
    t.check(all(r["total_ms"] >= 0 and r["calls"] > 0 for r in tab["ops"]), "serial: every row has calls and time")
    micro = STEPS * GBS // MBS
    t.check(calls(tab, "xent_forward") == micro,
            f"serial: xent_forward {calls(tab, 'xent_forward')} calls = {micro} microbatches")
    t.check(calls(tab, "xent_row_max") == 0 and calls(tab, "xent_shard_stats") == 0,
            "serial: no sharded or three-pass classifier")
    t.check(calls(tab, "xent_backward") == micro, f"serial: xent_backward once per microbatch")
    for op, old in (("adamw_segments", "adamw"), ("sum_squares_spans", "sum_squares")):
        # the optimizer: one call each a step, none per tensor
        t.check(calls(tab, op) == STEPS and calls(tab, old) == 0,
                f"serial: {op} {calls(tab, op)} calls = {STEPS} steps, {old} {calls(tab, old)}")
    for op in ["embedding_forward", "layernorm_forward", "attention_forward", "attention_backward"]:
        t.check(calls(tab, op) > 0, f"serial: {op} timed ({calls(tab, op)} calls)")
    linears = [r for r in tab["ops"] if r["op"].startswith("linear_forward n=")]
    t.check(len(linears) >= 2, f"serial: linear_forward per shape ({[r['op'] for r in linears]})")
    print("serial table (first rows):")
    for r in tab["ops"][:8]:
        print(f"  {r['op']:<40} {r['calls']:>5} {r['total_ms']:9.2f} ms {100 * r['share']:5.1f}%")

    # bf16: the fused LM head (Ops::lm_head, ops/cuda/lm_head.cpp) once per microbatch, each
    # step its own row; no fp32 classifier. TRIDENT_CUDA_FUSED_HEAD=0: the composition again.
    for knob, fused in (("1", True), ("0", False)):
        path16 = t.path(f"ops-bf16-{knob}.json")
        os.environ["TRIDENT_OP_TIMING"] = path16
        os.environ["TRIDENT_CUDA_FUSED_HEAD"] = knob
        t.train(1, f"bf16-{knob}", sets=DEVICE + ['runtime.precision="bf16"'])
        del os.environ["TRIDENT_CUDA_FUSED_HEAD"]
        tab = table(path16)
        steps = {s: calls_of(tab, f"lm_head {s}") for s in ("logits", "classifier", "dlnf", "dwte")}
        if fused:
            t.check(all(n == micro for n in steps.values()) and calls(tab, "xent_forward") == 0
                    and calls(tab, "xent_backward") == 0,
                    f"bf16: the fused head's steps once per microbatch ({steps}), no fp32 classifier")
        else:
            t.check(all(n == 0 for n in steps.values()) and calls(tab, "xent_forward") == micro,
                    f"bf16, TRIDENT_CUDA_FUSED_HEAD=0: the composition (xent_forward "
                    f"{calls(tab, 'xent_forward')} calls, fused steps {steps})")

    if not shutil.which("mpirun"):  # a GPU machine with the bundle only (bench/gpu_check.sh)
        print("tp 2: skipped (no mpirun)")
        os.environ.pop("TRIDENT_OP_TIMING", None)
        t.finish()
        return
    path2 = t.path("ops-tp2.json")
    os.environ["TRIDENT_OP_TIMING"] = path2
    t.train(2, "tp2", sets=DEVICE + ["parallel.tp=2"])
    for p in [path2, path2 + ".rank1"]:
        tab = table(p)
        name = os.path.basename(p)
        t.check(calls(tab, "xent_shard_stats") == micro and calls(tab, "xent_rescale_sumexp") == micro
                and calls(tab, "xent_forward") == 0 and calls(tab, "xent_row_max") == 0,
                f"tp 2, {name}: one pass per shard and the rescale, {calls(tab, 'xent_shard_stats')} calls")
    # bf16 at tp 2: the fused head on each vocabulary shard (Ops::lm_head with the TP group's
    # collectives): the classifier's two passes around them, no fp32 classifier.
    path3 = t.path("ops-tp2-bf16.json")
    os.environ["TRIDENT_OP_TIMING"] = path3
    t.train(2, "tp2-bf16", sets=DEVICE + ["parallel.tp=2", 'runtime.precision="bf16"'])
    for p in [path3, path3 + ".rank1"]:
        tab = table(p)
        steps = {s: calls_of(tab, f"lm_head {s}")
                 for s in ("logits", "classifier stats", "classifier backward", "dlnf", "dwte")}
        t.check(all(n == micro for n in steps.values()) and calls(tab, "xent_shard_stats") == 0
                and calls(tab, "xent_backward") == 0,
                f"tp 2 bf16, {os.path.basename(p)}: the fused head's steps on each shard once per "
                f"microbatch ({steps}), no fp32 classifier")
    # bf16 at cp 2: the fused block with the ring as its attention hook, on both ranks. By
    # default on the block's bf16 operands: no fp32 copies, the ring's blocks through
    # attention_forward_bf16 (no fp32 attention_forward). TRIDENT_CUDA_CP_BF16=0: fp32 copies of
    # the bf16 [q k v] around it (one widening and one narrowing per layer forward, one of each
    # per layer backward) and the ring's fp32 attention; TRIDENT_CUDA_FUSED_BLOCK=0: the
    # composition on fp32 activations, no hook copies.
    for knob, cp16, fused in (("1", "1", True), ("1", "0", True), ("0", "1", False)):
        path4 = t.path(f"ops-cp2-bf16-{knob}{cp16}.json")
        os.environ["TRIDENT_OP_TIMING"] = path4
        os.environ["TRIDENT_CUDA_FUSED_BLOCK"] = knob
        os.environ["TRIDENT_CUDA_CP_BF16"] = cp16
        t.train(2, f"cp2-bf16-{knob}{cp16}",
                sets=DEVICE + ["parallel.cp=2", 'runtime.precision="bf16"'])
        del os.environ["TRIDENT_CUDA_FUSED_BLOCK"], os.environ["TRIDENT_CUDA_CP_BF16"]
        for p in [path4, path4 + ".rank1"]:
            tab = table(p)
            hook = {d: calls(tab, f"block_{d} attention_hook from_bf16") for d in ("forward", "backward")}
            blocks = calls_of(tab, "block_forward")
            on16 = fused and cp16 == "1"
            want = micro * L if fused and not on16 else 0
            att16, att32 = calls_of(tab, "attention_forward bf16"), calls(tab, "attention_forward")
            t.check(hook["forward"] == want and hook["backward"] == want and
                    (blocks > 0) == fused and (att16 > 0) == on16 and (att32 > 0) == (not on16),
                    f"cp 2 bf16, TRIDENT_CUDA_FUSED_BLOCK={knob} TRIDENT_CUDA_CP_BF16={cp16}, "
                    f"{os.path.basename(p)}: the hook's copies {hook} (want {want} each), "
                    f"block_forward rows {blocks} calls, attention_forward bf16 {att16}, fp32 "
                    f"{att32}")
    os.environ.pop("TRIDENT_OP_TIMING", None)
    t.finish()


if __name__ == "__main__":
    main()
