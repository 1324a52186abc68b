"""Ditto (Li, Hu, Beirami, Smith 2021, "Ditto: Fair and Robust Federated Learning Through
Personalization", Eq. 2 and Algorithm 1) as a user's own component, outside lfed.

Every client keeps a personal model ``v_k``; each round, besides the global model's local
training (FedAvg's, which the round does as usual), it trains ``v_k`` for as many steps on
``F_k(v) + (λ/2)||v − w^t||²``: ``v_k ← v_k − η(∇F_k(v_k) + λ(v_k − w^t))``. A client's personal
model starts as the global model at its first participation (``StateSpec(init=GLOBAL)``), and
the second training of the cohort runs as one engine call split over the ranks like the round's
own (``LocalWork.train``).

    model:
      objective: {class_path: ditto.Ditto, init_args: {lam: 0.1}}
"""

from __future__ import annotations

from lfed.client.objectives import ClientRule
from lfed.engine import StepRule
from lfed.state import GLOBAL, StateSpec


class Ditto(ClientRule):
    name = "ditto"

    def __init__(self, lam: float = 0.1) -> None:
        super().__init__()
        if not lam >= 0:
            raise ValueError(f"lam: Ditto's coefficient λ must be >= 0, got {lam}")
        self.lam = float(lam)

    def hparams(self) -> dict:
        return {"lam": self.lam}

    def state_specs(self) -> list[StateSpec]:
        return [StateSpec("personal", init=GLOBAL)]

    def after_local(self, cohort, w_start, w_end, lr, local) -> None:
        v = self.rows("personal", cohort.clients, first=w_start)  # w^t for a client's first round
        rule = StepRule(decay=self.lam, shift=-self.lam * w_start)  # ∇F_k(v) + λ(v − w^t)
        trained = local.train(v, rule, stream="personal")
        self.write_rows("personal", cohort.clients, trained.weights, mask=cohort.active)
