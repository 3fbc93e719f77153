#!/usr/bin/env python3
"""Uneven pipeline splits (parallel.pipeline_layers) against the serial run.

A 7-layer model (7 divides no pp * vpp used here) cut into virtual stages of unequal layer
counts: pp 3 [1, 3, 3] (1f1b), pp 4 [1, 2, 2, 2] (zb-h1), pp 2 x vpp 2 [3, 1, 1, 2]
(interleaved-1f1b: rank 0's chunks hold 3 and 1 layers), pp 3 x vpp 2 [1, 1, 2, 1, 1, 1]
(looped-bfs, full recompute), tp 2 x pp 3 with "auto", tp 2 x pp 2 x vpp 2
with a list. `trident grad` gives the serial loss to 1e-6 relative and the serial gradients
to max|d| <= 1e-5 * max|g|; 4 training steps give the serial curve to 1e-5 relative. A
checkpoint written at pp 3 [1, 3, 3] resumes at pp 2 x vpp 2 [3, 1, 1, 2] and at pp 4
with no split named (7 layers: the balanced split) on the serial curve (checkpoints are
keyed by global layer, not by stage). `trident schedule --deck` simulates the stages with
the cost model of FORMAT.md ("Uneven pipeline splits"), recomputed here, and its bubble is
the start-up line's "expected bubble" of the same run.
"""
import json
import os
import re
import shutil
import subprocess

from layout_common import TRIDENT, LayoutTest, deck_text

V, T, L, H, C, MBS, GBS = 67, 8, 7, 4, 16, 1, 4


def layers(*n):
    return "parallel.pipeline_layers=[" + ",".join(str(x) for x in n) + "]"


def check_schedule_costs(t, split, startup):
    """`trident schedule --deck` at pp 3 with `split`: each stage's weight is FORMAT.md's cost
    model (a block 24 d^2 + 4 T d, the head 2 d V + 5 V, the embedding 2 d, relative to the
    heaviest stage), and its bubble the training run's start-up line's."""
    p = subprocess.run([TRIDENT, "schedule", "--schedule", "1f1b", "--pp", "3", "--microbatches",
                        str(GBS // MBS), "--deck", "deck.toml", "--set", layers(*split)],
                       cwd=t.out, capture_output=True, text=True, timeout=60)
    t.check(p.returncode == 0, f"trident schedule --deck: exit {p.returncode} {p.stderr}")
    if p.returncode != 0:
        return
    sim = json.loads(p.stdout.strip().splitlines()[-1])
    block = 24 * C * C + 4 * T * C
    cost = [n + (2 * C / block if v == 0 else 0) + ((2 * C * V + 5 * V) / block if v == 2 else 0)
            for v, n in enumerate(split)]
    want = [c / max(cost) for c in cost]
    t.check(all(abs(a - b) <= 1e-5 for a, b in zip(sim["stage_weight"], want)),  # 6 digits
            f"schedule --deck: stage weights {sim['stage_weight']} = the cost model's {want}")
    m = re.search(r"expected bubble ([0-9.]+)", startup)
    t.check(m is not None and abs(float(m.group(1)) - sim["bubble_fraction"]) <= 5e-4,
            f"schedule --deck: bubble {sim['bubble_fraction']:.4f} = the start-up line's "
            f"{m.group(1) if m else None}")
    uniform = subprocess.run([TRIDENT, "schedule", "--schedule", "1f1b", "--pp", "3",
                              "--microbatches", str(GBS // MBS)], capture_output=True, text=True,
                             timeout=60)
    t.check(json.loads(uniform.stdout.strip().splitlines()[-1])["bubble_fraction"]
            < sim["bubble_fraction"], "schedule --deck: unequal stages idle more than uniform ones")


def main():
    t = LayoutTest("mpi.pipeline_uneven", deck_text(V, T, L, H, C, MBS, GBS, 4, 1), V, T, GBS, 11)
    ref = t.grad(1, "g1.h5")
    (ref_curve,) = t.train(1, "serial")
    # (name, ranks, sets, train too)
    cases = [
        ("pp3_1-3-3", 3, ["parallel.pp=3", layers(1, 3, 3), "io.checkpoint_every=2",
                          "io.keep_checkpoints=2"], True),
        ("pp4_1-2-2-2_zb", 4, ["parallel.pp=4", "parallel.schedule=zb-h1", layers(1, 2, 2, 2)],
         False),
        ("pp2_vpp2_3-1-1-2", 2, ["parallel.pp=2", "parallel.vpp=2",
                                 "parallel.schedule=interleaved-1f1b", layers(3, 1, 1, 2)], True),
        ("pp3_vpp2_1-1-2-1-1-1", 3, ["parallel.pp=3", "parallel.vpp=2",
                                     "parallel.schedule=looped-bfs", "parallel.recompute=full",
                                     layers(1, 1, 2, 1, 1, 1)], False),
        ("tp2_pp3_auto", 6, ["parallel.pp=3", "parallel.tp=2", "parallel.pipeline_layers=auto"],
         False),
        ("tp2_pp2_vpp2_2-2-2-1", 4, ["parallel.pp=2", "parallel.tp=2", "parallel.vpp=2",
                                     "parallel.schedule=interleaved-1f1b", layers(2, 2, 2, 1)],
         False),
    ]
    for name, ranks, sets, train in cases:
        t.check_grad(name, t.grad(ranks, f"g_{name}.h5", sets), ref, 1e-6)
        if train:
            (got,) = t.train(ranks, f"train_{name}", sets)
            t.check_curve(name, got, ref_curve)
            if name == "pp3_1-3-3":
                check_schedule_costs(t, [1, 3, 3], t.last_stdout)
    # Checkpoints are layout-independent: written at pp 3 [1, 3, 3] (steps 2 and 4, by the
    # training above), the one of step 2 resumes at pp 2 x vpp 2 [3, 1, 1, 2] and at pp 4
    # (7 layers: the balanced split).
    for name, ranks, sets in [
            ("pp2_vpp2", 2, ["parallel.pp=2", "parallel.vpp=2",
                             "parallel.schedule=interleaved-1f1b", layers(3, 1, 1, 2)]),
            ("pp4_even", 4, ["parallel.pp=4"])]:
        out = f"resume_{name}"
        shutil.copytree(t.path("train_pp3_1-3-3"), t.path(out))
        os.remove(t.path(out, "checkpoints", "step-00000004.h5"))
        (resumed,) = t.train(ranks, out, sets + ["io.resume=auto"])
        t.check("step-00000002.h5 at step 2" in t.last_stdout,
                f"resume at {name}: started from the step-2 checkpoint")
        t.check_curve(f"resume at {name} from a pp3 [1, 3, 3] checkpoint of step 2", resumed,
                      ref_curve)
    t.finish()


if __name__ == "__main__":
    main()
