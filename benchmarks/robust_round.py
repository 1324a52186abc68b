"""Seconds per round with each robust rule and each omniscient attack, against FedAvg's round (issue 52).

    LFED_DATA_DIR=../shared/data python benchmarks/robust_round.py --cohorts 10 100 1000 --repeats 3

MNIST, ``K`` clients all in the round (N = K), the MLP 2NN (784-200-200-10, P = 199,210), one local step of batch
10 (so the round is mostly the server's part: the rule or the attack on the ``[K, P]`` updates). Each variant is one
``lfed.core.round.run_round`` on a fixed cohort: ``mean`` (FedAvg), every rule with ``f = ⌈0.1 K⌉`` and no attack, and
FedAvg's mean under every omniscient attack with 10% of the clients Byzantine. Every repeat times every variant
once, in turn (interleaved), after a warm-up round of each, waiting for a quiet machine before each
(:mod:`harness`); the table gives the median over the repeats, the ratio to FedAvg's median, and the load
averages seen before the timed rounds. Not part of the test suite.
"""

from __future__ import annotations

import math
import os

import harness
import torch

from lfed.core import registry as algorithms
from lfed.core.algorithm import LocalTraining, setup_state
from lfed.core.round import run_round
from lfed.engine import CohortTrainer
from lfed.lightning.datamodule import FederatedDataModule
from lfed.models.zoo import MLP
from lfed.state.spec import ModuleStateStore

RULES = ["median", "trimmed_mean", "krum", "multi_krum", "bulyan", "geometric_median", "centered_clipping", "norm_bound",
         "bucketing", "nnm"]
ATTACKS = ["alie", "ipm", "min_max", "min_sum", "mimic"]


def variants(k: int) -> dict[str, dict]:
    f = math.ceil(0.1 * k)
    out = {"FedAvg (mean)": {}}
    for r in RULES:
        if r == "bulyan" and k < 4 * f + 3:
            continue
        kwargs = {} if r in ("geometric_median", "centered_clipping", "norm_bound") else {"f": f}
        out[r] = {"combination": algorithms.build_component("combination", r, **kwargs)}
    for a in ATTACKS:
        out[f"mean + {a}"] = {"attack": algorithms.build_component("attack", a, fraction=0.1)}
    return out


def main() -> None:
    p = harness.parser(__doc__, repeats=3, description=__doc__.split("\n")[0])
    p.add_argument("--cohorts", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--data_dir", default=os.environ.get("LFED_DATA_DIR", "../shared/data"))
    a = p.parse_args()
    if a.quick:
        a.cohorts, a.repeats = [10], 1
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; MLP 2NN, one local step of batch 10")
    for k in a.cohorts:
        dm = FederatedDataModule(dataset="mnist", num_clients=k, partition="iid", seed=0, data_dir=a.data_dir)
        data = dm.build()
        net = MLP(784, [200, 200], 10)
        w0 = torch.nn.utils.parameters_to_vector(net.parameters()).detach()
        engine = CohortTrainer(net, None, "vmap")
        plan = LocalTraining(client_lr=0.05, batch_size=10, local_steps=1)
        runs = {}
        for name, roles in variants(k).items():
            alg = algorithms.build(algorithms.resolve("fedavg", **roles))
            setup_state(alg, ModuleStateStore(), data.client_sizes, w0.numel(), w0)
            runs[name] = alg
        clients, steps = torch.arange(k), torch.ones(k, dtype=torch.long)
        rounds = dict.fromkeys(runs, 0)  # each variant's round number (0: its warm-up)

        def one(name, w0=w0, data=data, plan=plan, engine=engine, clients=clients, steps=steps, runs=runs, rounds=rounds):
            run_round(runs[name], w0, data, plan, engine, round=rounds[name], clients=clients, steps_done=steps)
            rounds[name] += 1

        # warm-up (graphs, allocations), then every variant once per repeat, in turn
        times = harness.interleave({name: (lambda name=name: one(name)) for name in runs}, repeats=a.repeats, warmup=1)
        loads = harness.all_loads(times.values())
        base = times["FedAvg (mean)"].median
        print(f"\nK = {k} (f = {math.ceil(0.1 * k)}), P = {w0.numel():,}; load before each timed round "
              f"{min(loads):.2f}-{max(loads):.2f}")
        print(f"| round | s (median of {a.repeats}) | × FedAvg's |")
        print("|---|---|---|")
        for name, t in times.items():
            print(f"| {name} | {t.median:.3f} | {t.median / base:.2f} |")


if __name__ == "__main__":
    main()
