#!/usr/bin/env python3
"""ZB-V (parallel.schedule = "zb-v": two chunks per rank in a V, B and W split) against the
serial run.

GPT-2 (tied wte: under the V placement rank 0 holds both the embedding and the head, so the
tied gradient is summed within one rank) at pp 2, pp 4, tp 2 x pp 2 with sequence
parallelism, dp 2 x pp 2 with ZeRO-1, an uneven split, full and selective recompute; Llama (untied) at pp 2 and
tp 2 x pp 2. `trident grad` gives the serial loss to 1e-6 relative and every serial gradient
to max|d| <= 1e-5 * max|g|; 4 training steps give the serial curve to 1e-5 relative. A
checkpoint written under zb-v resumes under 1f1b (checkpoints are keyed by global layer, not
by placement). parallel.vpp other than 2 is refused with one line naming parallel.vpp.
"""
import os
import shutil
import subprocess

from layout_common import TRIDENT, LayoutTest, deck_text

V, T, L, H, C, MBS, GBS = 67, 8, 8, 4, 16, 1, 8
ZBV = ["parallel.schedule=zb-v", "parallel.vpp=2"]


def main():
    t = LayoutTest("mpi.pipeline_zbv", deck_text(V, T, L, H, C, MBS, GBS, 4, 1), V, T, GBS, 13)
    ref = t.grad(1, "g1.h5")
    (ref_curve,) = t.train(1, "serial")
    # (name, ranks, sets, train too)
    cases = [
        ("pp2", 2, ["parallel.pp=2", "io.checkpoint_every=2", "io.keep_checkpoints=2"], True),
        ("pp4", 4, ["parallel.pp=4"], False),
        ("tp2_pp2_sp", 4, ["parallel.pp=2", "parallel.tp=2", "parallel.sequence_parallel=true"],
         False),
        ("dp2_pp2_zero1", 4, ["parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=1",
                              "parallel.grad_bucket_mb=0.001"], True),
        ("pp2_3-2-2-1", 2, ["parallel.pp=2", "parallel.pipeline_layers=[3,2,2,1]"], False),
        ("pp2_full_recompute", 2, ["parallel.pp=2", "parallel.recompute=full"], False),
        ("pp2_selective_recompute", 2, ["parallel.pp=2", "parallel.recompute=selective"], False),
    ]
    for name, ranks, sets, train in cases:
        t.check_grad(name, t.grad(ranks, f"g_{name}.h5", ZBV + sets), ref, 1e-6)
        if train:
            (got,) = t.train(ranks, f"train_{name}", ZBV + sets)
            t.check_curve(name, got, ref_curve)
    # The step-2 checkpoint of the zb-v run resumes under 1f1b at pp 2 on the serial curve.
    out = "resume_1f1b"
    shutil.copytree(t.path("train_pp2"), t.path(out))
    os.remove(t.path(out, "checkpoints", "step-00000004.h5"))
    (resumed,) = t.train(2, out, ["parallel.pp=2", "io.resume=auto"])
    t.check("step-00000002.h5 at step 2" in t.last_stdout,
            "resume under 1f1b: started from zb-v's step-2 checkpoint")
    t.check_curve("resume under 1f1b from a zb-v checkpoint of step 2", resumed, ref_curve)
    # One clear line naming the key for a vpp zb-v cannot place.
    p = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", TRIDENT, "grad", "deck.toml",
                        "--weights", "w.h5", "--batch", "batch.h5", "--out", "bad.h5",
                        "--set", "parallel.pp=2", "--set", "parallel.schedule=zb-v"],
                       cwd=t.out, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("trident: error:")]
    t.check(p.returncode != 0 and len(lines) == 1 and "parallel.vpp" in lines[0]
            and "zb-v" in lines[0], f"zb-v at vpp 1 refused in one line: {lines}")
    t.finish()

    # Llama (untied embedding and head, both on rank 0 under the V).
    deck = deck_text(V, T, 4, H, C, MBS, GBS, 4, 1).replace(
        "[model]\n", "[model]\narch = \"llama\"\nn_kv_head = 2\nffn_hidden = 40\n")
    t = LayoutTest("mpi.pipeline_zbv_llama", deck, V, T, GBS, 17)
    ref = t.grad(1, "g1.h5")
    for name, ranks, sets in [("llama_pp2", 2, ["parallel.pp=2"]),
                              ("llama_tp2_pp2", 4, ["parallel.pp=2", "parallel.tp=2"])]:
        t.check_grad(name, t.grad(ranks, f"g_{name}.h5", ZBV + sets), ref, 1e-6)
    t.finish()


if __name__ == "__main__":
    main()
