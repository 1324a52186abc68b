"""FedDyn (Acar et al. 2021, *Federated Learning Based on Dynamic Regularization*; docs/algorithms.md §2 feddyn).

The worked example of adding an algorithm to lfed in one file (``docs/extending.md``): one
component that is both the client rule and the server combination, with its state declared.

* Client k keeps ``h_k`` (zero at start). Local objective ``f_k(w) - <h_k, w> + (α/2)||w - w_start||²``,
  so the step is ``w ← w - eta_l (g_k(w) - h_k + α (w - w_start))``: the
  :class:`~lfed.engine.StepRule` with ``decay = α`` and ``shift = -h_k - α w_start``.
* After the round, for each client whose work counts: ``h_k ← h_k - α Δ_k``.
* The server keeps ``h`` (zero at start): ``h ← h - (α/N) Σ_{k counting} Δ_k``, then
  ``Δ = mean_{k counting} Δ_k - h / α`` (uniform mean, ``N`` all clients), applied by the server
  optimizer like any ``Δ`` (SGD with lr 1 gives the paper's ``w ← mean_k w_k - h/α``).

Registered as the preset ``feddyn`` by one line in :data:`lfed.core.registry.PRESETS`.
"""

from __future__ import annotations

from torch import Tensor

from lfed.base.component import Cohort
from lfed.base.declaration import Declaration, Releases
from lfed.checks import number
from lfed.client.objectives import ClientRule
from lfed.engine import StepRule
from lfed.server.combination import ServerCombination
from lfed.state.spec import StateSpec

__all__ = ["FedDyn"]


class FedDyn(ClientRule, ServerCombination):
    """FedDyn's client rule and server combination (docs/algorithms.md §2 feddyn).

    Args:
        alpha: Regularisation coefficient α > 0 (the paper uses 0.1, 0.01, 0.001).
    """

    name = "feddyn"
    declares = Declaration(releases=Releases(values=(
        "FedDyn's server state h sums the clients' raw updates, unclipped and un-noised, and moves every "
        "later global model",)))

    def __init__(self, alpha: float = 0.01) -> None:
        super().__init__()
        self.alpha = number("alpha", alpha, above=0, detail=" (FedDyn's coefficient)")

    def hparams(self) -> dict:
        return {"alpha": self.alpha}

    def state_specs(self) -> list[StateSpec]:
        return [StateSpec("h_client"), StateSpec("h", per_client=False)]

    def server_combination(self) -> ServerCombination:
        return self

    # ---------------------------------------------------------------- client side
    def step_rule(self, cohort: Cohort, w_start: Tensor, lr: float) -> StepRule:
        return StepRule(decay=self.alpha, shift=-self.rows("h_client", cohort.clients) - self.alpha * w_start)

    def after_local(self, cohort: Cohort, w_start: Tensor, w_end: Tensor, lr: float, local) -> None:
        h_k = self.rows("h_client", cohort.clients)
        self.write_rows("h_client", cohort.clients, h_k - self.alpha * (w_end - w_start), mask=cohort.counting)

    # ---------------------------------------------------------------- server side
    def combine(self, updates: Tensor, weights: Tensor, cohort: Cohort) -> tuple[Tensor, None]:
        counted = updates[cohort.counting]
        h = self.state("h") - (self.alpha / cohort.num_clients) * counted.sum(0)
        self.set_state("h", h)
        return counted.mean(0) - h / self.alpha, None
