"""Example-level DP-SGD over a cohort: lfed's vmapped cohort against an Opacus loop over the same clients (issue 54).

    python benchmarks/dp_sgd_opacus.py --clients 10 100 --repeats 3
    python benchmarks/dp_sgd_opacus.py --clients 10 100 --repeats 3 --features 64 --hidden 100   # digits' MLP

Each of K clients holds 60 MNIST-sized examples (784 features, 10 classes; random data: the cost does not depend on
the values) and takes 6 DP-SGD steps of expected batch 10 on the MLP 784-200-200-10 (199,210 parameters), C = 1,
σ = 1. lfed: one ``CohortTrainer.train`` call with example-level DP (per-example gradients vmapped inside the
cohort's vmap). Opacus: for each client in turn, ``GradSampleModule`` + ``DPOptimizer`` on the same Poisson batches
(the way a simulator runs Opacus client by client). Timed runs wait for load < 1.0 (:mod:`harness`), alternate
lfed and Opacus, and print each run's seconds and load; the table row gives medians and the ratio.
"""

from __future__ import annotations

import copy
import json

import harness
import torch
from torch import nn

from lfed.engine import CohortTrainer, StepRule
from lfed.engine.example_dp import ExampleNoise, poisson_schedule
from lfed.models.zoo import MLP
from lfed.rng import round_generator

N_EXAMPLES, STEPS, BATCH, CLIP, SIGMA, LR = 60, 6, 10, 1.0, 1.0, 0.1


def _sync(device: torch.device):
    """The harness's ``sync`` for ``device`` (None on the CPU)."""
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None


def lfed_round(net, X, Y, K, noise: float = SIGMA, weights: bool = False):
    """Seconds of one ``CohortTrainer.train`` call of K clients with example-level DP (on ``X``'s device); with
    ``weights``, also the trained ``[K, P]`` weights."""
    device = X.device
    engine = CohortTrainer(net.to(device), backend="vmap")
    w = engine.layout.module_vector(net)
    dp = ExampleNoise(CLIP, noise, float(BATCH), [round_generator(0, 0, f"dp-sgd/{k}") for k in range(K)])
    index = torch.arange(K * N_EXAMPLES, device=device).view(K, N_EXAMPLES)
    with harness.stopwatch(_sync(device)) as sw:
        out = engine.train(w, X, Y, index, torch.full((K,), N_EXAMPLES), torch.full((K,), STEPS), StepRule(example_dp=dp),
                           LR, BATCH, round_generator(0, 0, "batches"))
    return (sw.seconds, out.weights) if weights else sw.seconds


def opacus_round(net, X, Y, K, noise: float = SIGMA, weights: bool = False):
    """Seconds of Opacus's DP-SGD client after client on the same Poisson batches (on ``X``'s device); with
    ``weights``, also client 0's trained weights."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    device = X.device
    positions, valid = poisson_schedule(torch.full((K,), N_EXAMPLES), STEPS, BATCH, round_generator(0, 0, "batches"))
    positions, valid = positions.to(device), valid.to(device)
    first = None
    with harness.stopwatch(_sync(device)) as sw:
        for k in range(K):
            model = GradSampleModule(copy.deepcopy(net).to(device), loss_reduction="mean")
            opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=LR), noise_multiplier=noise, max_grad_norm=CLIP,
                              expected_batch_size=BATCH, loss_reduction="mean")
            for t in range(STEPS):
                ids = k * N_EXAMPLES + positions[k, t][valid[k, t]]
                opt.zero_grad()
                nn.functional.cross_entropy(model(X[ids]), Y[ids]).backward()
                opt.step()
            if k == 0 and weights:
                first = torch.cat([p.detach().reshape(-1) for p in model._module.parameters()])
    return (sw.seconds, first) if weights else sw.seconds


def main() -> None:
    p = harness.parser(__doc__, repeats=3, description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    p.add_argument("--features", type=int, default=784)
    p.add_argument("--hidden", type=int, nargs="+", default=[200, 200])
    a = p.parse_args()
    if a.quick:
        a.clients, a.features, a.hidden, a.repeats = [2], 16, [16], 1
    torch.manual_seed(0)
    net = MLP(a.features, a.hidden, 10)
    print(f"MLP {a.features}-{'-'.join(map(str, a.hidden))}-10, {sum(p.numel() for p in net.parameters()):,} parameters")
    for K in a.clients:
        X, Y = torch.randn(K * N_EXAMPLES, a.features), torch.randint(0, 10, (K * N_EXAMPLES,))
        lfed_round(net, X, Y, K)  # warm-up (allocations, first vmap)
        opacus_round(net, X, Y, min(K, 2))

        def log(name, r, seconds, load, _, K=K) -> None:
            print(json.dumps({"K": K, "who": name, "seconds": round(seconds, 3), "load": load}), flush=True)

        # each round measures itself (its own set-up outside the clock); alternated, each started on a quiet machine
        rounds = {"lfed": lambda X=X, Y=Y, K=K: lfed_round(net, X, Y, K), "opacus": lambda X=X, Y=Y, K=K: opacus_round(net, X, Y, K)}
        runs = harness.interleave(rounds, repeats=a.repeats, figure=float, log=log)
        med = {n: t.median for n, t in runs.items()}
        print(f"| {K} | {med['lfed']:.2f} | {med['opacus']:.2f} | {med['opacus'] / med['lfed']:.2f}x | "
              f"{harness.load_range(harness.all_loads(runs.values()))} |", flush=True)


if __name__ == "__main__":
    main()
