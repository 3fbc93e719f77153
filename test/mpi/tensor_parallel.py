#!/usr/bin/env python3
"""Tensor parallelism, with and without sequence parallelism, against the serial run.

For tp in {2, 4} and sequence_parallel in {false, true} (and tp 2 + SP + full recompute): `trident grad` on the serial
weights and batch gives the serial loss to 1e-6 relative and every serial gradient to
max|d| <= 1e-5 * max|g|; 5 training steps give the serial loss curve to 1e-5 relative;
and rank 0's TP traffic per step equals the closed form below, the same with and without
sequence parallelism (reduce-scatter + all-gather pairs move what allreduces move). The
vocabulary (101) is divisible by neither 2 nor 4: the padded vocab-parallel path runs.

Bytes are ring ("bus") bytes, FORMAT.md: allreduce of S bytes over p ranks counts
2(p-1)/p*S, reduce-scatter and all-gather (p-1)/p*S. Per microbatch of N = mbs*T tokens,
with S = 4*N*C and L layers on the stage, r = (p-1)/p:
  embedding  forward allreduce S (SP: reduce-scatter S, all-gather S in backward)  2rS
  each layer 2 forward + 2 backward allreduces of S (SP: 4 all-gathers, 4 RS)      8rS
  LM head    ln_f input-gradient allreduce S (SP: all-gather + reduce-scatter)     2rS
             row max (N floats) + sum-exp and target logit (2N floats)           24rN
per step: the grad-norm allreduce of one double 16r; SP adds the LayerNorm gradients'
allreduce, 2r * 4 * (4*C*L + 2*C).
"""
import numpy as np

from layout_common import LayoutTest, deck_text

V, T, L, H, C, MBS, GBS = 101, 16, 2, 4, 32, 2, 8


def expected_tp_bytes(p, sp):
    r = (p - 1) / p
    N = MBS * T
    S = 4 * N * C
    m = GBS // MBS
    per_mb = 2 * r * S + 8 * r * S * L + 2 * r * S + 24 * r * N
    per_step = 16 * r + (2 * r * 4 * (4 * C * L + 2 * C) if sp else 0)
    return m * per_mb + per_step


def main():
    t = LayoutTest("mpi.tensor_parallel", deck_text(V, T, L, H, C, MBS, GBS, 5, 1), V, T, GBS, 11)
    ref = t.grad(1, "g1.h5")
    ref_curve, ref_bytes = t.train(1, "serial", columns=("loss", "comm/tp/bytes"))
    t.check(np.all(ref_bytes == 0), "serial: no TP traffic")
    # Full recompute re-runs each block's forward (and its collectives) in the backward.
    t.check_grad("tp2 sp recompute=full",
                 t.grad(2, "g_rc.h5", ["parallel.tp=2", "parallel.sequence_parallel=true",
                                       "parallel.recompute=full"]), ref, 1e-6)
    calls, measured = {}, {}
    for tp in (2, 4):
        for sp in (False, True):
            name = f"tp{tp}{'_sp' if sp else ''}"
            sets = [f"parallel.tp={tp}", f"parallel.sequence_parallel={'true' if sp else 'false'}"]
            t.check_grad(name, t.grad(tp, f"g_{name}.h5", sets), ref, 1e-6)
            got, tp_bytes, tp_calls = t.train(tp, f"train_{name}", sets,
                                              ("loss", "comm/tp/bytes", "comm/tp/calls"))
            t.check_curve(name, got, ref_curve)
            want = expected_tp_bytes(tp, sp)
            t.check(np.allclose(tp_bytes, want, rtol=1e-12, atol=1e-6),
                    f"train {name}: comm/tp/bytes per step {tp_bytes[0]:.1f} = formula {want:.1f}")
            calls[name], measured[name] = tp_calls[0], tp_bytes[0]
    for tp in (2, 4):
        ln_bytes = 2 * (tp - 1) / tp * 4 * (4 * C * L + 2 * C)
        t.check(abs(measured[f"tp{tp}_sp"] - ln_bytes - measured[f"tp{tp}"]) < 1e-6,
                f"tp{tp}: measured activation bytes equal with and without sequence parallelism")
        # Per microbatch SP turns 2 + 4L allreduces of activations into 4 + 8L RS/AG calls.
        m = GBS // MBS
        t.check(calls[f"tp{tp}_sp"] - calls[f"tp{tp}"] == m * (2 + 4 * L) + 1,
                f"tp{tp}: SP makes {m * (2 + 4 * L)} more calls per step (+1 LayerNorm allreduce)")
    t.finish()


if __name__ == "__main__":
    main()
