"""Ditto (Li, Hu, Beirami, Smith 2021, "Ditto: Fair and Robust Federated Learning Through Personalization",
Eq. 2 and Algorithm 1; docs/algorithms.md §13).

The global model ``w`` trains as FedAvg's. Every client that takes part also trains its personal
model ``v_k`` for as many steps ``s_k`` on ``F_k(v) + (λ/2)||v − w^r||²``:
``v_k ← v_k − η(∇F_k(v_k) + λ(v_k − w^r))``, ``w^r`` the model it received this round. ``v_k``
starts as the global model at the client's first participation (``StateSpec(init=GLOBAL)``),
and the cohort's personal training is one engine call split over the ranks like the round's own
(:meth:`lfed.base.component.LocalWork.train`, batches from ``(seed, round, "personal")``). The
personalized model of client ``k`` is ``v_k`` (the global model for a client that never took part).

    model:
      algorithm: ditto                     # or objective: {class_path: lfed.personal.ditto.Ditto, init_args: {lam: 0.1}}
"""

from __future__ import annotations

from torch import Tensor

from lfed.base.declaration import Declaration, Supports
from lfed.checks import number
from lfed.client.objectives import ClientRule
from lfed.engine import StepRule
from lfed.state.spec import GLOBAL, StateSpec


class Ditto(ClientRule):
    """Ditto (module docstring).

    Args:
        lam: ``λ >= 0``, the pull of each personal model towards the global one (0: local training alone).
    """

    name = "ditto"
    declares = Declaration(supports=Supports(personalized=True))

    def __init__(self, lam: float = 0.1) -> None:
        super().__init__()
        self.lam = float(number("lam", lam, at_least=0, detail=" (Ditto's coefficient λ)"))

    def hparams(self) -> dict:
        return {"lam": self.lam}

    def state_specs(self) -> list[StateSpec]:
        return [StateSpec("personal", init=GLOBAL)]

    def after_local(self, cohort, w_start, w_end, lr, local) -> None:
        v = self.rows("personal", cohort.clients, first=w_start)  # w^r for a client's first round
        rule = StepRule(decay=self.lam, shift=-self.lam * w_start)  # ∇F_k(v) + λ(v − w^r)
        trained = local.train(v, rule, stream="personal")
        self.write_rows("personal", cohort.clients, trained.weights, mask=cohort.active)

    def personal_rows(self, clients: Tensor, w: Tensor, local) -> Tensor:
        return self.rows("personal", clients, first=w)
