#!/usr/bin/env python3
"""Parallel layouts against the serial run, through the command line and HDF5 files.

`trident grad` at tp=2, tp=4, dp=2 and tp=2 x dp=2 gives the serial loss (1e-5 relative)
and gradients (max|d| <= 1e-5 * max|g| per tensor); 10 training steps at tp=2 and at dp=2
(clipping active) give the serial loss curve to 1e-5 relative. The vocabulary (101) is not
a multiple of tp, so the padded vocab-parallel embedding and cross-entropy are exercised.
"""
import h5py
import numpy as np

from layout_common import LayoutTest, deck_text

V, T, L, H, C, MBS, GBS = 101, 16, 2, 4, 32, 2, 8


def main():
    t = LayoutTest("mpi.layouts", deck_text(V, T, L, H, C, MBS, GBS, 10, 2), V, T, GBS, 7)
    ref = t.grad(1, "g1.h5")
    for name, np_, sets in (("tp2", 2, ["parallel.tp=2"]), ("tp4", 4, ["parallel.tp=4"]),
                            ("dp2", 2, []), ("tp2dp2", 4, ["parallel.tp=2"])):
        t.check_grad(name, t.grad(np_, f"g_{name}.h5", sets), ref, 1e-5)

    cols = ("loss", "grad_norm", "comm/tp/bytes", "comm/dp/bytes", "comm/pp/bytes")
    ref_curve, ref_norm, *ref_comm = t.train(1, "serial", columns=cols)
    t.check(all(np.all(v == 0) for v in ref_comm), "serial run: no communication counted")
    t.check(np.all(ref_norm > 0.5), "clipping is active in the reference run")
    for name, np_, sets in (("tp2", 2, ["parallel.tp=2"]), ("dp2", 2, [])):
        got, _, tp_b, dp_b, _ = t.train(np_, f"train_{name}", sets, cols)
        # dp=2: one allreduce of every gradient (float32) and of the loss (float64) per step;
        # ring bytes 2(p-1)/p * S are S at p = 2.
        if name == "dp2":
            with h5py.File(t.path("w.h5"), "r") as w:
                n_params = sum(w["model"][k].size for k in w["model"])
            t.check(np.all(dp_b == 4 * n_params + 8),
                    f"dp2: comm/dp/bytes per step = 4 * {n_params} + 8 (got {dp_b[0]:.0f})")
        if name == "tp2":
            t.check(np.all(tp_b > 0) and np.all(dp_b == 0), "tp2: traffic on tp only")
        t.check_curve(name, got, ref_curve)
    t.finish()


if __name__ == "__main__":
    main()
