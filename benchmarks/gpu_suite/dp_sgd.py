"""10. Example-level DP-SGD in the cohort against Opacus's loop (issue 54)."""

from __future__ import annotations

import harness
import torch

from .common import _f, peak_memory


def run(suite, r: dict) -> None:
    """Example-level DP-SGD: one ``CohortTrainer.train`` call of K clients (per-example gradients vmapped inside the
    cohort's vmap) against Opacus's ``GradSampleModule`` + ``DPOptimizer`` client after client on the same Poisson
    batches (benchmarks/dp_sgd_opacus.py: 60 examples, 6 steps of expected batch 10 per client); medians of
    ``repeats`` after a warm-up, interleaved. Checked first: without noise, client 0's weights equal Opacus's."""
    try:
        import opacus  # noqa: F401
    except ImportError:
        r["skipped"] = "opacus is not installed"
        return
    import dp_sgd_opacus as dps

    from lfed.models.zoo import MLP

    cfg, dev = suite.s.dp_sgd, suite.device
    torch.manual_seed(0)
    net = MLP(cfg["features"], cfg["hidden"], 10)
    r["job"] = (f"MLP {cfg['features']}-{'-'.join(map(str, cfg['hidden']))}-10, K clients of {dps.N_EXAMPLES} "
                f"examples, {dps.STEPS} DP-SGD steps of expected batch {dps.BATCH} (C = {dps.CLIP}, sigma = {dps.SIGMA}); "
                f"lfed: one CohortTrainer.train call; Opacus: client after client; medians of {cfg['repeats']}")
    g = torch.Generator().manual_seed(0)
    k0 = cfg["clients"][0]
    X = torch.randn(k0 * dps.N_EXAMPLES, cfg["features"], generator=g).to(dev)
    Y = torch.randint(0, 10, (k0 * dps.N_EXAMPLES,), generator=g).to(dev)
    _, ours = dps.lfed_round(net, X, Y, k0, noise=0.0, weights=True)
    _, theirs = dps.opacus_round(net, X, Y, k0, noise=0.0, weights=True)
    r["max_diff_vs_opacus_noise0"] = float((ours[0] - theirs).abs().max())
    r["cases"] = []
    for K in cfg["clients"]:
        X = torch.randn(K * dps.N_EXAMPLES, cfg["features"], generator=g).to(dev)
        Y = torch.randint(0, 10, (K * dps.N_EXAMPLES,), generator=g).to(dev)
        dps.lfed_round(net, X, Y, K)  # warm-up
        dps.opacus_round(net, X, Y, min(K, 2))
        # each call times itself (synchronized, its set-up outside the clock); interleaved, no waiting for a quiet CPU
        rounds = {"lfed": lambda X=X, Y=Y, K=K: dps.lfed_round(net, X, Y, K), "opacus": lambda X=X, Y=Y, K=K: dps.opacus_round(net, X, Y, K)}
        times = harness.interleave(rounds, repeats=cfg["repeats"], figure=float, quiet=False)
        med = {n: t.median for n, t in times.items()}
        r["cases"].append({"clients": K, "lfed_s": med["lfed"], "opacus_s": med["opacus"],
                           "opacus_over_lfed": med["opacus"] / med["lfed"]})
    r.update(peak_memory(dev))


def markdown(dps: dict) -> list[str]:
    """This section's part of gpu_suite.md."""
    L: list[str] = []
    if dps.get("cases"):
        L += ["## Example-level DP-SGD: the vmapped cohort against an Opacus loop (issue 54)", "", dps.get("job", ""), "",
              f"Without noise, client 0's weights against Opacus's: max difference {_f(dps.get('max_diff_vs_opacus_noise0'), 3)}.",
              "", "| clients | lfed s | Opacus s | Opacus / lfed |", "| --- | --- | --- | --- |"]
        L += [f"| {c['clients']} | {_f(c['lfed_s'])} | {_f(c['opacus_s'])} | {_f(c['opacus_over_lfed'], 3)} |"
              for c in dps["cases"]]
        L.append("")
    return L
