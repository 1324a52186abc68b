"""q-FedAvg (Li, Sanjabi, Beirami, Smith 2020, "Fair Resource Allocation in Federated Learning",
Algorithm 2) as a user's own server combination, outside lfed.

With each cohort client's loss under the round's model ``F_k(w^t)`` (the round computes it when a
component declares ``Needs(start_loss=True)``: :attr:`lfed.base.component.Cohort.start_loss`) and its update
``u_k = w̄_k − w^t``, so ``Δw_k = L(w^t − w̄_k) = −L u_k``:

    Δ_k = F_k^q Δw_k,   h_k = q F_k^{q−1} ||Δw_k||² + L F_k^q,   w^{t+1} = w^t − Σ_k Δ_k / Σ_k h_k

over the clients whose work counts. ``L`` is the Lipschitz estimate; left unset it is the paper's
``L = 1/η``, from the round's client learning rate (``cohort.plan.client_lr``).
q = 0 is FedAvg with uniform weights and a step of ``Σ u_k / K``.

    model:
      combination: {class_path: qffl.QFedAvg, init_args: {q: 1.0, lipschitz: 20.0}}
"""

from __future__ import annotations

from lfed import Declaration, Needs
from lfed.server import ServerCombination


class QFedAvg(ServerCombination):
    name = "qffl"
    declares = Declaration(needs=Needs(start_loss=True))

    def __init__(self, q: float = 1.0, lipschitz: float | None = None) -> None:
        super().__init__()
        if not q >= 0 or not (lipschitz is None or lipschitz > 0):
            raise ValueError(f"q: must be >= 0 and lipschitz: > 0 or None (1/client_lr), got q={q}, lipschitz={lipschitz}")
        self.q, self.lipschitz = float(q), None if lipschitz is None else float(lipschitz)

    def hparams(self) -> dict:
        return {"q": self.q, "lipschitz": self.lipschitz}

    def combine(self, updates, weights, cohort):
        counted = cohort.counting
        u = updates[counted]
        F = cohort.start_loss[counted].to(u.dtype)
        L = self.lipschitz if self.lipschitz is not None else 1.0 / cohort.plan.client_lr
        dw = -L * u  # Δw_k = L(w^t − w̄_k)
        Fq = F.pow(self.q)
        h = self.q * F.pow(self.q - 1) * dw.square().sum(1) + L * Fq if self.q > 0 else L * Fq
        return -(Fq[:, None] * dw).sum(0) / h.sum(), None
