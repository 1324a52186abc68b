"""Distributed DP (Skellam over secure aggregation) against central DP-FedAvg at matched ε on RESULTS.md's MNIST job.

    LFED_DATA_DIR=../shared/data python benchmarks/studies/ddp_utility.py --epsilons 8 2 --seeds 0 1

The job of ``configs/paper/dp/mnist_utility.yaml`` (MNIST, 6,000 IID clients with the server's 10% validation split,
a cohort of 120, 3 local steps of batch 3 at lr 0.3, MLP 784-100-10, 100 rounds, δ = 1/N) with one fixed clip ``C``
for both mechanisms (adaptive clipping is DP-FedAvg's only):

* **central**: DP-FedAvg, Poisson sampling at q = 0.02, ``z`` calibrated for ε after the 100 rounds (dp-accounting's
  RDP of the subsampled Gaussian: amplification by sampling);
* **distributed**: :class:`lfed.privacy.DistributedDP`, a uniform cohort of 120, every round accounted at q = 1 (the
  server sees the cohort), ``z`` calibrated here for ε with its own accountant (the Skellam RDP at the scale ``bits``
  gives, the rounded sensitivity, ``d = 2^17`` after padding) by bisection to 0.1%.

``distributed_same_z`` runs distributed DP at the ``z`` central DP-FedAvg calibrates for ε (so its own ε is larger):
the same noise on the mean, to separate the mechanism's rounding and modular arithmetic from its accounting.

For each (mechanism, ε, seed): ``z``, the ε the run's accountant reports at the end, the test accuracy over the last
10% of rounds, seconds and loads. The ``z`` at equal ε shows the price of no amplification; the accuracy, its effect.
"""

from __future__ import annotations

import json
import math
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
from lfed.privacy.accountant import calibrate_noise  # noqa: E402
from lfed.privacy.distributed_dp import DistributedDP, rounded_l2_bound, skellam_epsilon  # noqa: E402

N, ROUNDS, COHORT, P = 6000, 100, 120, 79510


def ddp_epsilon(z: float, clip: float, bits: int, delta: float) -> float:
    """ε after the run's rounds of distributed DP at multiplier ``z`` (every client's share arriving)."""
    d = 1 << (P - 1).bit_length()
    probe = DistributedDP(noise_multiplier=z, clip=clip, bits=bits, delta=delta)
    s = probe.derive_scale(COHORT, d)
    l2 = rounded_l2_bound(clip * s, d, probe.beta)
    l1 = min(math.sqrt(d) * l2, l2 * l2)
    return skellam_epsilon({((z * clip * s) ** 2, l2, l1): ROUNDS}, delta)


def calibrate_ddp(target: float, clip: float, bits: int, delta: float) -> float:
    lo, hi = 0.0, 1.0
    while ddp_epsilon(hi, clip, bits, delta) > target:
        lo, hi = hi, hi * 2
    while hi - lo > 1e-3 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ddp_epsilon(mid, clip, bits, delta) > target else (lo, mid)
    return hi


def run(mechanism: str, epsilon: float, seed: int, clip: float, bits: int, data_dir: str | None) -> dict:
    delta = 1.0 / N
    torch.manual_seed(seed)
    data = FederatedDataModule(dataset="mnist", data_dir=data_dir, num_clients=N, partition="iid", holdout_fraction=0.0,
                               validation_fraction=0.1, seed=seed)
    if mechanism == "central":
        combination = DPFedAvg(noise_multiplier=None, target_epsilon=epsilon, delta=delta, clip=clip)
        setting = dict(algorithm="dp_fedavg")
    else:  # distributed: z for ε with its own accountant; distributed_same_z: central DP-FedAvg's z (its ε then follows)
        z = (calibrate_ddp(epsilon, clip, bits, delta) if mechanism == "distributed" else
             calibrate_noise(epsilon, delta, [COHORT / N] * ROUNDS))
        combination = DistributedDP(noise_multiplier=z, clip=clip, bits=bits, delta=delta, masks=False)
        setting = dict(algorithm="fedavg", weighting="uniform", sampler="uniform")
    module = FederatedModule(MLP(784, [100], 10), combination=combination, fraction=COHORT / N,
                             training=dict(client_lr=0.3, batch_size=3, local_steps=3), seed=seed, **setting)
    load_before = harness.loadavg()
    with harness.stopwatch() as sw:
        trainer = Trainer(max_steps=ROUNDS, accelerator="cpu", logger=False, enable_progress_bar=False,
                          enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                          check_val_every_n_epoch=None, val_check_interval=min(5, ROUNDS))
        trainer.fit(module, datamodule=data)
    seconds = sw.seconds
    acc = module.runs[0].last_rounds_accuracy(0.1, "test")  # final/test_acc_last10pct (evaluations every 5 rounds)
    return {"mechanism": mechanism, "target_epsilon": epsilon, "seed": seed, "clip": clip,
            "noise_multiplier": float(combination.noise_multiplier),
            "epsilon": float(combination.accountant.epsilon(combination.delta)),
            "test_acc_last10pct": acc, "seconds": round(seconds, 1),
            "load_before": load_before, "load_after": harness.loadavg()}


def main() -> None:
    global ROUNDS
    p = harness.parser(__doc__, quick=False, description=__doc__.splitlines()[0])
    p.add_argument("--epsilons", type=float, nargs="+", default=[8.0, 2.0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--clip", type=float, default=1.5, help="C for both (the adaptive clip's end value in RESULTS.md: 1.4-1.7)")
    p.add_argument("--bits", type=int, default=20)
    p.add_argument("--mechanisms", nargs="+", default=["central", "distributed"],
                   help="central, distributed, distributed_same_z (distributed DP at central's z for the ε: its ε follows)")
    p.add_argument("--data_dir", default=os.environ.get("LFED_DATA_DIR"))
    p.add_argument("--rounds", type=int, default=ROUNDS, help="(a quick check of the script; the study is 100)")
    a = p.parse_args()
    ROUNDS = a.rounds
    for eps in a.epsilons:
        for seed in a.seeds:
            for mech in a.mechanisms:
                print(json.dumps(run(mech, eps, seed, a.clip, a.bits, a.data_dir)), flush=True)


if __name__ == "__main__":
    main()
