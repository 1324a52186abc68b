"""A one-run privacy audit of DP-FedAvg (lfed.privacy.audit; Steinke, Nasr, Jagielski 2023) on the MNIST DP job.

    LFED_DATA_DIR=../shared/data python benchmarks/studies/dp_audit.py --epsilon 4
    LFED_DATA_DIR=../shared/data python benchmarks/studies/dp_audit.py --epsilon 1 --leak no_noise
    LFED_DATA_DIR=../shared/data python benchmarks/studies/dp_audit.py --epsilon 4 --no_canaries   # the same run, unaudited

The job of ``configs/dp_mnist.yaml`` (MNIST, 1,000 IID clients with 10% held out, Poisson q = 0.1, MLP 784-200-200-10,
one local epoch of batch 10, client lr 0.1, C = 0.5, 200 rounds) with ``z`` calibrated for ``--epsilon`` at
``--delta`` (default 1e-6: the bound's δ term is 2mδ, so δ must be far below 1/m; the config's 1/N^1.1 = 5e-4 would
make any audit with 1,000 canaries vacuous), and ``--canaries`` canary clients (:class:`CanaryDPFedAvg`). Prints the
claimed ε, ε_lower at 95%, its guesses, the canaries, the test accuracy, the seconds and the load average before
and after, as a row of RESULTS.md's table and as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import harness  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch import Trainer  # noqa: E402

from lfed import FederatedDataModule, FederatedModule  # noqa: E402
from lfed.models.zoo import MLP  # noqa: E402
from lfed.privacy import DPFedAvg  # noqa: E402
from lfed.privacy.audit import CanaryDPFedAvg  # noqa: E402


def main() -> None:
    p = harness.parser(__doc__, quick=False, description=__doc__.splitlines()[0])
    p.add_argument("--epsilon", type=float, required=True, help="the budget z is calibrated for")
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--leak", choices=["no_noise", "no_clip"], default=None, help="a planted leak")
    p.add_argument("--canaries", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--dataset", choices=["mnist", "digits"], default="mnist")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no_canaries", action="store_true", help="the same DP run without canaries (the audit's cost)")
    p.add_argument("--data_dir", default=os.environ.get("LFED_DATA_DIR"),
                   help="where MNIST is (default: $LFED_DATA_DIR, else lfed's default folders)")
    a = p.parse_args()

    torch.manual_seed(a.seed)
    mnist = a.dataset == "mnist"
    data = FederatedDataModule(dataset=a.dataset, data_dir=a.data_dir, num_clients=1000 if mnist else 100,
                               partition="iid", holdout_fraction=0.1, seed=a.seed)
    dp_settings = dict(noise_multiplier=None, target_epsilon=a.epsilon, delta=a.delta, clip=0.5)
    if a.no_canaries:
        dp = DPFedAvg(**dp_settings)
    else:
        dp = CanaryDPFedAvg(canaries=a.canaries, leak=a.leak, canary_seed=a.seed, **dp_settings)
    net = MLP(784 if mnist else 64, [200, 200], 10)
    module = FederatedModule(net, algorithm="dp_fedavg", combination=dp, fraction=0.1,
                             training=dict(client_lr=0.1, batch_size=10, local_epochs=1), seed=a.seed)
    load_before = harness.loadavg()
    trainer = Trainer(max_steps=a.rounds, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                      check_val_every_n_epoch=None, val_check_interval=a.rounds)
    with harness.stopwatch() as fit:
        trainer.fit(module, datamodule=data)
    with harness.stopwatch() as audit:
        result = None if a.no_canaries else dp.audit()
    seconds, audit_seconds = fit.seconds, audit.seconds
    load_after = harness.loadavg()
    out = {"dataset": a.dataset, "rounds": a.rounds, "target_epsilon": a.epsilon, "delta": a.delta, "leak": a.leak,
           "noise_multiplier": dp.noise_multiplier, "epsilon": dp.accountant.epsilon(dp.delta),
           "test_acc": float(trainer.callback_metrics["test/acc"]), "fit_seconds": round(seconds, 1),
           "score_seconds": round(audit_seconds, 1), "load_before": load_before, "load_after": load_after}
    if result is not None:
        out.update(epsilon_lower=result.epsilon_lower, canaries=result.m, included=result.included, k=result.k,
                   guesses=result.r, correct=result.v, per_k={k: list(v) for k, v in result.per_k.items()},
                   canary_rounds_mean=float(dp.canary_rounds[dp.included].double().mean()))
    print(json.dumps(out))
    if result is not None:
        print(f"| {out['epsilon']:.3g} | {a.leak or '-'} | {dp.noise_multiplier:.3g} | {result.epsilon_lower:.3g} | "
              f"{result.v}/{result.r} (k = {result.k}) | {result.m} ({result.included} in) | {out['test_acc']:.4f} | "
              f"{seconds:.0f} | {load_before:.2f} / {load_after:.2f} |")


if __name__ == "__main__":
    main()
