#!/usr/bin/env python3
"""Virtual pipeline stages (parallel.vpp = 2) through the MPI executor against the serial run.

An 8-layer model cut into pp * vpp virtual stages (layer l on virtual stage l / (8/(pp*vpp)),
virtual stage v on pipeline rank v % pp as its chunk v / pp): interleaved-1f1b and looped-bfs
at pp = 2 (recompute off and on) and pp = 4, and interleaved-1f1b at tp = 2 x pp = 2.
`trident grad` gives the serial loss to 1e-6 relative and the serial gradients to
max|d| <= 1e-5 * max|g| (the tied wte summed once over the embedding group), and 5 training
steps give the serial loss curve to 1e-5 relative. The pipeline bytes per step check the
protocol: pipeline rank 0 sends, per microbatch, one activation per chunk (vpp) and one
input gradient per chunk but the first (vpp - 1), each 4*mbs*T*C bytes, plus the two
one-double allreduces over pp (the loss and the grad norm). Evaluation at pp 2 x vpp 2 gives
the serial eval loss, and a checkpoint it writes resumes serially on the serial curve.
"""
import numpy as np

from layout_common import LayoutTest, deck_text

V, T, L, H, C, MBS, GBS = 101, 16, 8, 4, 32, 2, 8
VPP = 2


def main():
    t = LayoutTest("mpi.pipeline_interleaved", deck_text(V, T, L, H, C, MBS, GBS, 5, 1), V, T,
                   GBS, 7)
    ref = t.grad(1, "g1.h5")
    (ref_curve,) = t.train(1, "serial")
    # (name, pp, tp, schedule, recompute, train too)
    cases = [
        ("pp2_vpp2_interleaved_none", 2, 1, "interleaved-1f1b", "none", True),
        ("pp2_vpp2_interleaved_full", 2, 1, "interleaved-1f1b", "full", True),
        ("pp2_vpp2_looped-bfs_none", 2, 1, "looped-bfs", "none", True),
        ("pp2_vpp2_looped-bfs_full", 2, 1, "looped-bfs", "full", False),
        ("pp4_vpp2_interleaved_none", 4, 1, "interleaved-1f1b", "none", True),
        ("pp4_vpp2_looped-bfs_none", 4, 1, "looped-bfs", "none", False),
        ("tp2pp2_vpp2_interleaved_none", 2, 2, "interleaved-1f1b", "none", True),
    ]
    for name, pp, tp, sched, rc, train in cases:
        sets = [f"parallel.pp={pp}", f"parallel.tp={tp}", f"parallel.vpp={VPP}",
                f"parallel.schedule={sched}", f"parallel.recompute={rc}"]
        t.check_grad(name, t.grad(pp * tp, f"g_{name}.h5", sets), ref, 1e-6)
        if not train:
            continue
        got, pp_bytes = t.train(pp * tp, f"train_{name}", sets, ("loss", "comm/pp/bytes"))
        t.check_curve(name, got, ref_curve)
        m = GBS // MBS
        want = m * (2 * VPP - 1) * 4 * MBS * T * C + 2 * (2 * (pp - 1) / pp * 8)
        t.check(np.allclose(pp_bytes, want),
                f"train {name}: comm/pp/bytes {pp_bytes[0]:.0f} = {want:.0f}")
    # Evaluation (forwards only, each microbatch through the chunks in order) at pp 2 x vpp 2.
    ev = ["data.valid=tokens.h5", "train.eval_every=5", "train.eval_batches=2"]
    (ref_eval,) = t.train(1, "serial_eval", ev, ("eval/loss",))
    (got_eval,) = t.train(2, "eval_pp2_vpp2", ev + ["parallel.pp=2", "parallel.vpp=2",
                                                     "parallel.schedule=interleaved-1f1b"],
                          ("eval/loss",))
    rel = float(np.max(np.abs(got_eval - ref_eval) / np.abs(ref_eval)))
    t.check(len(got_eval) == len(ref_eval) == 1 and rel <= 1e-5,
            f"eval pp2_vpp2: eval loss {got_eval} vs serial {ref_eval} ({rel:.2e})")
    # A checkpoint written at pp 2 x vpp 2 resumes serially on the same curve: train 5 steps
    # with checkpoints at 3 and 5, drop the one at 5, resume at 3 on one rank.
    import os
    ck = ["parallel.pp=2", "parallel.vpp=2", "parallel.schedule=interleaved-1f1b",
          "io.checkpoint_every=3", "io.keep_checkpoints=2"]
    t.train(2, "resume_vpp", ck)
    os.remove(t.path("resume_vpp", "checkpoints", "step-00000005.h5"))
    (resumed,) = t.train(1, "resume_vpp", ["io.resume=auto"])
    rel = float(np.max(np.abs(resumed - ref_curve) / np.abs(ref_curve)))
    t.check(len(resumed) == len(ref_curve) and rel <= 1e-5,
            f"resume: a pp2 x vpp2 checkpoint of step 3 continues serially on the serial curve "
            f"({rel:.2e})")
    t.finish()


if __name__ == "__main__":
    main()
