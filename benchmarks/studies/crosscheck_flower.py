"""Cross-check lfed's server optimizers against Flower's strategies (SPEC §4.1).

Feeds the same sequence of combined updates Δ_r to

* Flower's own strategy classes (``flwr.server.strategy.FedAvg``, ``FedAvgM``,
  ``FedAdam``, ``FedYogi``, ``FedAdagrad``), driven through their real
  ``aggregate_fit`` with one client per round whose returned weights are
  ``w_r + Δ_r`` (``num_examples=1``, so Flower's weighted mean is that client's
  weights exactly), and
* lfed's optimizers (``torch.optim.SGD`` for FedAvg/FedAvgM, and
  ``lfed.server.optimizers.FedAdam``/``FedYogi``/``FedAdagrad``) driven the lfed
  way: ``p.grad = -Δ_r``, ``optimizer.step()``,

and prints, per round, the largest absolute difference between the two global
models. Both sides see the identical pseudo-gradient: Δ_r is recomputed as
Flower computes it, ``(w_r + Δ_r) - w_r`` from Flower's current weights.

Two lfed columns per strategy:

* ``spec``: lfed as configured by SPEC §4.1 (``v`` starts at ``τ²``, no bias
  correction);
* ``flwr-conv``: lfed set to Flower's conventions where lfed can express them
  (``initial_accumulator_value=0``; for FedAdam also the learning rate of round
  ``r`` set to Flower's ``eta * sqrt(1 - β2^(r+1)) / (1 - β1^(r+1))``). A zero
  (round-off) difference there shows that the ``spec`` differences come only
  from those conventions.

Run (Flower in its own environment; torch and lfed on the path)::

    python -m venv /tmp/flwrvenv && /tmp/flwrvenv/bin/pip install flwr numpy
    PYTHONPATH=/path/to/lfed:/path/to/venv-with-torch/site-packages \\
        /tmp/flwrvenv/bin/python benchmarks/studies/crosscheck_flower.py

or ``pip install -e .[bench]`` and ``python benchmarks/studies/crosscheck_flower.py``.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Callable

import numpy as np
import torch

from lfed.server.optimizers import FedAdagrad, FedAdam, FedYogi

try:
    import flwr
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import strategy as flwr_strategy
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit("flwr is not installed: pip install flwr (or lfed[bench]) to run this cross-check")

SHAPES = [(3, 4), (4,), (2,)]


def make_deltas(rounds: int, scale: float, seed: int) -> list[list[np.ndarray]]:
    """Pseudo-gradients with a persistent drift plus noise, so signs persist and flip."""
    rng = np.random.default_rng(seed)
    drift = [rng.normal(0.0, scale, s) for s in SHAPES]
    return [[d + rng.normal(0.0, scale, s) for d, s in zip(drift, SHAPES)] for _ in range(rounds)]


def run_flower(strategy, w0: list[np.ndarray], deltas: list[list[np.ndarray]]):
    """Drive a Flower strategy; return its weights after each round and the Δ it saw."""
    current = [x.copy() for x in w0]
    history, seen = [], []
    for r, delta in enumerate(deltas, start=1):
        client = [c + d for c, d in zip(current, delta)]
        seen.append([c - w for c, w in zip(client, current)])  # Δ as Flower computes it
        fit_res = FitRes(
            status=Status(code=Code.OK, message=""),
            parameters=ndarrays_to_parameters(client),
            num_examples=1,
            metrics={},
        )
        params, _ = strategy.aggregate_fit(r, [(None, fit_res)], [])
        current = parameters_to_ndarrays(params)
        history.append([x.copy() for x in current])
    return history, seen


def run_lfed(
    make_opt: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
    w0: list[np.ndarray],
    deltas: list[list[np.ndarray]],
    lr_schedule: Callable[[int], float] | None = None,
) -> list[list[np.ndarray]]:
    """Drive an lfed server optimizer the lfed way: p.grad = -Δ, step()."""
    params = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in w0]
    opt = make_opt(params)
    history = []
    for r, delta in enumerate(deltas, start=1):
        if lr_schedule is not None:
            for group in opt.param_groups:
                group["lr"] = lr_schedule(r)
        for p, d in zip(params, delta):
            p.grad = -torch.from_numpy(d)
        opt.step()
        history.append([p.detach().numpy().copy() for p in params])
    return history


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--scale", type=float, default=0.02, help="std of the pseudo-gradient entries")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eta", type=float, default=0.1, help="server learning rate")
    parser.add_argument("--tau", type=float, default=0.01)
    parser.add_argument("--beta1", type=float, default=0.9)
    parser.add_argument("--beta2", type=float, default=0.99)
    parser.add_argument("--momentum", type=float, default=0.9)
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.ERROR)

    rng = np.random.default_rng(args.seed + 1)
    w0 = [rng.normal(0.0, 1.0, s) for s in SHAPES]
    deltas = make_deltas(args.rounds, args.scale, args.seed)
    init = ndarrays_to_parameters(w0)
    eta, tau, b1, b2 = args.eta, args.tau, args.beta1, args.beta2

    def flower_adam_lr(r: int) -> float:
        # flwr/server/strategy/fedadam.py, aggregate_fit: eta_norm with exponent server_round + 1
        return eta * math.sqrt(1 - b2 ** (r + 1)) / (1 - b1 ** (r + 1))

    cases = [
        (
            "FedAvg",
            flwr_strategy.FedAvg(initial_parameters=init),
            lambda ps: torch.optim.SGD(ps, lr=1.0),
            None,
        ),
        (
            "FedAvgM",
            flwr_strategy.FedAvgM(
                initial_parameters=init, server_learning_rate=eta, server_momentum=args.momentum
            ),
            lambda ps: torch.optim.SGD(ps, lr=eta, momentum=args.momentum),
            None,
        ),
        (
            "FedAdam",
            flwr_strategy.FedAdam(initial_parameters=init, eta=eta, beta_1=b1, beta_2=b2, tau=tau),
            lambda ps: FedAdam(ps, lr=eta, betas=(b1, b2), tau=tau),
            (
                lambda ps: FedAdam(ps, lr=eta, betas=(b1, b2), tau=tau, initial_accumulator_value=0.0),
                flower_adam_lr,
            ),
        ),
        (
            "FedYogi",
            flwr_strategy.FedYogi(initial_parameters=init, eta=eta, beta_1=b1, beta_2=b2, tau=tau),
            lambda ps: FedYogi(ps, lr=eta, betas=(b1, b2), tau=tau),
            (
                lambda ps: FedYogi(ps, lr=eta, betas=(b1, b2), tau=tau, initial_accumulator_value=0.0),
                None,
            ),
        ),
        (
            "FedAdagrad",
            # Flower fixes beta_1 = 0 for FedAdagrad; lfed's default beta1 is 0 too.
            flwr_strategy.FedAdagrad(initial_parameters=init, eta=eta, tau=tau),
            lambda ps: FedAdagrad(ps, lr=eta, beta1=0.0, tau=tau),
            (
                lambda ps: FedAdagrad(ps, lr=eta, beta1=0.0, tau=tau, initial_accumulator_value=0.0),
                None,
            ),
        ),
    ]

    print(f"flwr {flwr.__version__}, torch {torch.__version__}, numpy {np.__version__}")
    print(
        f"P = {sum(math.prod(s) for s in SHAPES)} parameters, {args.rounds} rounds, "
        f"|Δ| entries ~ {args.scale}, eta = {eta}, tau = {tau}, betas = ({b1}, {b2}), "
        f"momentum = {args.momentum}, float64"
    )
    for name, strat, make_spec, conv in cases:
        flw, seen = run_flower(strat, w0, deltas)
        spec = run_lfed(make_spec, w0, seen)
        conv_hist = run_lfed(conv[0], w0, seen, conv[1]) if conv is not None else None
        print(f"\n{name}")
        header = f"  {'round':>5}  {'max|w_flwr - w0|':>17}  {'max|diff| spec':>15}"
        if conv_hist is not None:
            header += f"  {'max|diff| flwr-conv':>20}"
        print(header)
        for r in range(args.rounds):
            line = f"  {r + 1:>5}  {max_diff(flw[r], w0):>17.3e}  {max_diff(flw[r], spec[r]):>15.3e}"
            if conv_hist is not None:
                line += f"  {max_diff(flw[r], conv_hist[r]):>20.3e}"
            print(line)


if __name__ == "__main__":
    main()
