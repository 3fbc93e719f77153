"""oracle.pipedream — the asynchronous schedules against PyTorch models of their update rules
(docs/FORMAT.md "Asynchronous pipeline schedules"): `trident step` (K = 10 optimizer steps on
one batch of 4 sequences, microbatches of 1) against torch in float64 from the same float32
weights, at pp = 2, pp = 3, pp = 2 x dp = 2 and pp = 2 x tp = 2 for each schedule, and 2BW
also in 2D tensor parallelism (tp = 4 on a 2 x 2 grid, pp = 1).

pipedream (an untied Llama, no clipping): stage r runs F_k of step t with the version it had
after (t-1) m + max(0, k - min(m, pp - r - 1)) updates and its backward with the same
(weight stashing); every stage applies microbatch k's gradient to its live weights right
after B_k. The reference builds each microbatch's mixed point from the stages' version
histories (pipedream_reference). At pp = 3 stage 0 runs B_1 with version 0 while its live
weights are at version 2, so a backward that used the live weights instead of the stashed
ones would change every gradient after the first.

pipedream-2bw (GPT-2, tied, clipping on): every forward and backward of step t computes with
the weights of step t-1, and the accumulated gradient is applied once to the live weights:

    W(t+1) = AdamW(W(t), clip(grad L(W(t-1))))       with W(0) = W(1) (the loaded weights)

so the loss trident reports for step t is L(W(t-1)); the rule does not depend on the layout.

Pass: the 10 losses (and 2BW's grad norms) within 1e-5 relative of torch's, and the final
weights within 1e-5 of the largest weight per tensor. The test cannot pass by accident: the
neighbouring rules on the same data must differ from trident's losses by more than 100 times
the tolerance (checked): for 2BW the synchronous rule and a two-steps-stale one; for pipedream
the staleness patterns of the other pipeline depths (pp = 1: no staleness).
Cost: 20 s measured before the tp = 2 cases (45 s expected on 2 busy cores; eight `trident
step` runs of 10 steps on 2 to 4 ranks and the torch references).
"""

import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_common as oc  # noqa: E402

NAME = "oracle.pipedream"
torch, np, h5py, tt = oc.setup(NAME)

TOL = 1e-5
K = 10
MODEL = dict(vocab_size=64, seq_len=16, n_layer=6, n_head=2, d_model=32)
BATCH, MBS = 4, 1  # 4 microbatches: more than pp, so 1F1B has a steady state
TRAIN = dict(steps=K, global_batch_size=BATCH, lr=1e-3, min_lr=1e-4, warmup_steps=2,
             weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-5, grad_clip=0.5, seed=4321)


# PipeDream proper: an untied Llama (GPT-2 ties wte across the first and last stage, which
# pipedream refuses at pp > 1), no clipping (no global norm under per-stage updates).
LLAMA = dict(vocab_size=64, seq_len=16, n_layer=6, n_head=2, d_model=32, arch="llama",
             n_kv_head=1, ffn_hidden=40)
TRAIN_PD = dict(TRAIN, grad_clip=0.0)


def reference(w0, inputs, targets, delay):
    """Losses, norms and final weights of K AdamW steps whose gradient is computed with the
    weights `delay` steps old (0: synchronous; 1: PipeDream-2BW), W(t) = W(0) for t < 0."""
    _, cur = tt.load_weights(w0, dtype=torch.float64)
    opt = tt.make_adamw(cur, TRAIN["lr"], TRAIN["beta1"], TRAIN["beta2"], TRAIN["eps"],
                        TRAIN["weight_decay"])
    history = [copy.deepcopy(cur.state_dict())]  # history[-1] = W(t)
    _, probe = tt.load_weights(w0, dtype=torch.float64)
    ti, tg = torch.from_numpy(inputs), torch.from_numpy(targets)
    losses, norms = [], []
    for s in range(1, K + 1):
        probe.load_state_dict(history[max(0, len(history) - 1 - delay)])
        probe.zero_grad(set_to_none=True)
        loss = probe(ti, tg)
        loss.backward()
        for pc, pq in zip(cur.parameters(), probe.parameters()):
            pc.grad = pq.grad.detach().clone()
        params = list(cur.parameters())
        if TRAIN["grad_clip"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, TRAIN["grad_clip"])
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
        lr = tt.lr_at(s, TRAIN["lr"], TRAIN["min_lr"], TRAIN["warmup_steps"], TRAIN["steps"])
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        history.append(copy.deepcopy(cur.state_dict()))
        losses.append(float(loss))
        norms.append(float(norm))
    return losses, norms, cur


def stage_of(name, pp, n_layer):
    """The pipeline stage that owns a Llama parameter (n_layer / pp layers per stage)."""
    if name.startswith("model.embed_tokens"):
        return 0
    if name.startswith("model.layers."):
        return int(name.split(".")[2]) // (n_layer // pp)
    return pp - 1  # model.norm, lm_head


def pipedream_reference(w0, inputs, targets, pp, dp=1):
    """PipeDream with weight stashing, stage by stage: microbatch j = (s-1) m + k of step s is
    the j-th update of every stage; stage r computes its forward and backward with the version
    it had when its 1F1B list reached F_k: (s-1) m + max(0, k - min(m, pp - r - 1)) updates.
    The gradient of microbatch j is therefore that of the loss at the mixed point (each stage's
    stashed version), which every stage then applies to its live weights."""
    m = BATCH // (MBS * dp)
    local = BATCH // dp  # DP replica d holds sequences [d local, (d+1) local)
    _, cur = tt.load_weights(w0, dtype=torch.float64)
    _, probe = tt.load_weights(w0, dtype=torch.float64)
    opt = tt.make_adamw(cur, TRAIN_PD["lr"], TRAIN_PD["beta1"], TRAIN_PD["beta2"],
                        TRAIN_PD["eps"], TRAIN_PD["weight_decay"])
    snap = lambda: {n: p.detach().clone() for n, p in cur.named_parameters()}  # noqa: E731
    history = [snap()]  # history[u]: the weights after u updates
    ti, tg = torch.from_numpy(inputs), torch.from_numpy(targets)
    losses = []
    for s in range(1, K + 1):
        lr = tt.lr_at(s, TRAIN_PD["lr"], TRAIN_PD["min_lr"], TRAIN_PD["warmup_steps"],
                      TRAIN_PD["steps"])
        step_losses = []
        for k in range(m):
            with torch.no_grad():
                for n, p in probe.named_parameters():
                    r = stage_of(n, pp, LLAMA["n_layer"])
                    p.copy_(history[(s - 1) * m + max(0, k - min(m, pp - r - 1))][n])
            probe.zero_grad(set_to_none=True)
            rows = [d * local + k * MBS + i for d in range(dp) for i in range(MBS)]
            loss = probe(ti[rows], tg[rows])  # the mean over the DP replicas' microbatch k
            loss.backward()
            for pc, pq in zip(cur.parameters(), probe.parameters()):
                pc.grad = pq.grad.detach().clone()
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            history.append(snap())
            step_losses.append(float(loss))
        losses.append(sum(step_losses) / m)
    return losses, cur


def check_pipedream(work, fails):
    """`schedule = "pipedream"` at pp = 2, 3 and 2 x dp 2 on an untied Llama against
    pipedream_reference; each layout must also differ from the other staleness patterns and
    from per-microbatch updates without staleness (pp = 1)."""
    deck = os.path.join(work, "deck-pipedream.toml")
    tt.write_deck(deck, {"model": LLAMA, "parallel": {"micro_batch_size": MBS,
                                                      "schedule": "pipedream"},
                         "train": TRAIN_PD, "io": {"out_dir": os.path.join(work, "run-pd")},
                         "runtime": {"threads": 1}})
    init = os.path.join(work, "init-pd.h5")
    oc.run_trident(NAME, ["init", deck, "--out", init], work)
    _, model = tt.load_weights(init, dtype=torch.float32)
    gen = torch.Generator().manual_seed(98)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * (0.05 if p.dim() == 1 else 0.005))
    w0 = os.path.join(work, "weights-pd.h5")
    tt.save_weights(model, w0)
    rng = np.random.default_rng(6)
    inputs = rng.integers(0, LLAMA["vocab_size"], size=(BATCH, LLAMA["seq_len"]))
    targets = rng.integers(0, LLAMA["vocab_size"], size=(BATCH, LLAMA["seq_len"]))
    bpath = os.path.join(work, "batch-pd.h5")
    tt.write_batch(bpath, inputs, targets)
    refs = {pp: pipedream_reference(w0, inputs, targets, pp) for pp in (1, 2, 3)}
    refs_dp2 = pipedream_reference(w0, inputs, targets, 2, dp=2)
    for pp, dp, tp in ((2, 1, 1), (3, 1, 1), (2, 2, 1), (2, 1, 2)):
        print(f"\n=== pipedream, pp = {pp}, dp = {dp}, tp = {tp}, {BATCH // (MBS * dp)} "
              "microbatches (Llama, untied) ===")
        out = os.path.join(work, f"pipedream_pp{pp}_dp{dp}_tp{tp}.h5")
        log = oc.run_trident(NAME, ["step", deck, "--weights", w0, "--batch", bpath, "--steps", K,
                                    "--out", out, "--set", f"parallel.pp={pp}",
                                    "--set", f"parallel.dp={dp}", "--set", f"parallel.tp={tp}"],
                             work, mpi_ranks=pp * dp * tp)
        fails.check("asynchronous" in log and "weight stashing" in log,
                    f"pipedream pp={pp}: the start-up report does not say the run is asynchronous")
        with h5py.File(out, "r") as f:
            losses = np.asarray(f.attrs.get("losses", []), dtype=np.float64).reshape(-1)
        ref_losses, ref = refs[pp] if dp == 1 else refs_dp2
        fails.check(len(losses) == K, f"pipedream pp={pp}: {len(losses)} losses, expected {K}")
        print(f"{'step':>4} {'loss':>14} {'torch':>14} {'rel':>9} {'torch pp=1':>14}")
        for s in range(min(K, len(losses))):
            rl = abs(losses[s] - ref_losses[s]) / abs(ref_losses[s])
            print(f"{s + 1:>4} {losses[s]:14.9f} {ref_losses[s]:14.9f} {rl:9.2e} "
                  f"{refs[1][0][s]:14.9f}")
            fails.check(rl <= TOL, f"pipedream pp={pp} step {s + 1}: loss {losses[s]:.10g} vs "
                        f"torch {ref_losses[s]:.10g} (relative {rl:.2e} > {TOL:g})")
        for other in (1, 2, 3):
            if (other == pp and dp == 1) or (other == pp and tp > 1) or not len(losses):
                continue
            gap = max(abs(a - b) / abs(b) for a, b in zip(losses, refs[other][0]))
            print(f"  largest relative gap to the pp={other} staleness: {gap:.2e}")
            fails.check(gap > 100 * TOL, f"pipedream pp={pp}: within {gap:.2e} of the pp={other} "
                        "rule's losses: the test cannot tell the staleness patterns apart")
        _, got_model = tt.load_weights(out, dtype=torch.float64)
        got = {n: p.detach().numpy() for n, p in got_model.named_parameters()}
        want = {n: p.detach().numpy() for n, p in ref.named_parameters()}
        worst = oc.compare_tensors(np, got, want, TOL, fails, f"pipedream pp={pp} weights")
        print(f"  final weights: worst max|d|/max|w_ref| = {worst:.2e}")


def main():
    fails = oc.Failures(NAME)
    work = oc.out_dir(NAME)
    check_pipedream(work, fails)
    deck = os.path.join(work, "deck.toml")
    tt.write_deck(deck, {"model": MODEL, "parallel": {"micro_batch_size": MBS},
                         "train": TRAIN, "io": {"out_dir": os.path.join(work, "run")},
                         "runtime": {"threads": 1}})
    init = os.path.join(work, "init.h5")
    oc.run_trident(NAME, ["init", deck, "--out", init], work)
    _, model = tt.load_weights(init, dtype=torch.float32)
    gen = torch.Generator().manual_seed(99)
    with torch.no_grad():  # no bias at zero, no LayerNorm at one
        for _, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * (0.05 if p.dim() == 1 else 0.005))
    w0 = os.path.join(work, "weights.h5")
    tt.save_weights(model, w0)
    rng = np.random.default_rng(5)
    inputs = rng.integers(0, MODEL["vocab_size"], size=(BATCH, MODEL["seq_len"]))
    targets = rng.integers(0, MODEL["vocab_size"], size=(BATCH, MODEL["seq_len"]))
    bpath = os.path.join(work, "batch.h5")
    tt.write_batch(bpath, inputs, targets)

    ref_losses, ref_norms, ref = reference(w0, inputs, targets, delay=1)
    sync_losses, _, _ = reference(w0, inputs, targets, delay=0)
    stale_losses, _, _ = reference(w0, inputs, targets, delay=2)
    want = {n: p.detach().numpy() for n, p in ref.named_parameters()}

    # The rule depends on neither pp nor the TP layout, so 2D TP (tp 4 on a 2 x 2 grid,
    # microbatches of 2) at pp = 1 is checked against the same reference.
    tp2d = ["--set", "parallel.tp_mode=2d", "--set", "parallel.micro_batch_size=2"]
    for pp, dp, tp, extra in ((2, 1, 1, []), (3, 1, 1, []), (2, 2, 1, []), (2, 1, 2, []),
                              (1, 1, 4, tp2d)):
        mbs = 2 if extra else MBS
        print(f"\n=== pipedream-2bw, pp = {pp}, dp = {dp}, tp = {tp}{' (2d)' if extra else ''}, "
              f"{BATCH // (mbs * dp)} microbatches ===")
        out = os.path.join(work, f"stepped_pp{pp}_dp{dp}_tp{tp}{'_2d' if extra else ''}.h5")
        log = oc.run_trident(NAME, ["step", deck, "--weights", w0, "--batch", bpath, "--steps", K,
                                    "--out", out, "--set", f"parallel.pp={pp}",
                                    "--set", f"parallel.dp={dp}", "--set", f"parallel.tp={tp}",
                                    "--set", "parallel.schedule=pipedream-2bw", *extra], work,
                             mpi_ranks=pp * dp * tp)
        fails.check("asynchronous" in log and "not equivalent to the serial run" in log,
                    f"pp={pp}: the start-up report does not say the run is asynchronous")
        with h5py.File(out, "r") as f:
            losses = np.asarray(f.attrs.get("losses", []), dtype=np.float64).reshape(-1)
            norms = np.asarray(f.attrs.get("grad_norms", []), dtype=np.float64).reshape(-1)
        fails.check(len(losses) == K and len(norms) == K,
                    f"pp={pp}: {len(losses)} losses and {len(norms)} norms, expected {K}")
        print(f"{'step':>4} {'loss':>14} {'torch 2BW':>14} {'rel':>9} {'torch sync':>14} "
              f"{'norm':>12} {'torch':>12} {'rel':>9}")
        for s in range(min(K, len(losses), len(norms))):
            rl = abs(losses[s] - ref_losses[s]) / abs(ref_losses[s])
            rn = abs(norms[s] - ref_norms[s]) / abs(ref_norms[s])
            print(f"{s + 1:>4} {losses[s]:14.9f} {ref_losses[s]:14.9f} {rl:9.2e} "
                  f"{sync_losses[s]:14.9f} {norms[s]:12.6e} {ref_norms[s]:12.6e} {rn:9.2e}")
            fails.check(rl <= TOL, f"pp={pp} step {s + 1}: loss {losses[s]:.10g} vs torch "
                        f"{ref_losses[s]:.10g} (relative {rl:.2e} > {TOL:g})")
            fails.check(rn <= TOL, f"pp={pp} step {s + 1}: grad norm {norms[s]:.10g} vs torch "
                        f"{ref_norms[s]:.10g} (relative {rn:.2e} > {TOL:g})")
        # The rule is what is measured: the neighbouring rules must be told apart.
        for what, other in (("synchronous", sync_losses), ("two-steps-stale", stale_losses)):
            gap = max(abs(a - b) / abs(b) for a, b in zip(losses, other)) if len(losses) else 0
            print(f"  largest relative gap to the {what} rule: {gap:.2e}")
            fails.check(gap > 100 * TOL, f"pp={pp}: trident's losses are within {gap:.2e} of the "
                        f"{what} rule's: the test cannot tell the rules apart")
        _, got_model = tt.load_weights(out, dtype=torch.float64)
        got = {n: p.detach().numpy() for n, p in got_model.named_parameters()}
        worst = oc.compare_tensors(np, got, want, TOL, fails, f"pp={pp} weights")
        print(f"  final weights: worst max|d|/max|w_ref| = {worst:.2e}")
    return fails.report()


if __name__ == "__main__":
    sys.exit(main())
