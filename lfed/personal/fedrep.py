"""FedRep (Collins, Hassani, Mokhtari, Shakkottai 2021, "Exploiting Shared Representations for Personalized
Federated Learning", Algorithm 1; docs/algorithms.md §13).

The same split as FedPer (a shared body ``φ``, a local head ``h_k``), trained in two phases each
round: first the head with the body frozen, ``h ← h − η ∇_h F_k(φ^r, h)``, for the round's own local
budget (``local_epochs`` / ``local_steps``: ``τ_h``; stragglers do fewer, as in any round); then the
body with the client's new head frozen, ``φ ← φ − η ∇_φ F_k(φ, h_k)``, for ``τ_φ = body_epochs``
epochs (or ``body_steps`` steps) for each client that did any work. The server aggregates the body
updates only. Both phases are one engine call each over the cohort (the head phase is the round's
own training with the body's gradient masked: ``StepRule(grad_mask=...)``; the body phase is
:meth:`lfed.base.component.LocalWork.train` from the head phase's weights, batches from
``(seed, round, "body")``).

    model:
      algorithm: fedrep
      local_epochs: 10                                     # τ_h (the paper's default)
      objective: {class_path: lfed.personal.fedrep.FedRep, init_args: {body_epochs: 1}}
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lfed.checks import integer
from lfed.engine import StepRule, steps_per_epoch
from lfed.personal.local_part import LocalPartRule


class FedRep(LocalPartRule):
    """FedRep (module docstring).

    Args:
        local: The head's parameter-name globs (None: the last layer).
        body_epochs: ``τ_φ`` epochs of the body phase (``body_epochs · ceil(n_k / B)`` steps); 1 when neither is given.
        body_steps: ``τ_φ`` as steps instead (then leave ``body_epochs`` None).
    """

    name = "fedrep"

    def __init__(self, local: str | Sequence[str] | None = None, body_epochs: int | None = None,
                 body_steps: int | None = None) -> None:
        super().__init__(local)
        if body_epochs is not None and body_steps is not None:
            raise ValueError(f"body_epochs/body_steps: give one of them, got body_epochs={body_epochs}, body_steps={body_steps}")
        if body_steps is None and body_epochs is None:
            body_epochs = 1
        if body_epochs is not None:
            integer("body_epochs", body_epochs, at_least=1, detail=" (FedRep's body epochs τ_φ)")
        if body_steps is not None:
            integer("body_steps", body_steps, at_least=1, detail=" (FedRep's body steps τ_φ)")
        self.body_epochs, self.body_steps = body_epochs, body_steps

    def hparams(self) -> dict:
        return {"body_epochs": self.body_epochs, "body_steps": self.body_steps}

    def _mask(self, local: bool, like: Tensor) -> Tensor:
        """``[P]``: 1 at the local (head) coordinates when ``local``, else at the shared (body) ones."""
        m = self._sharing().local_mask.to(device=like.device)
        return (m if local else ~m).to(like.dtype)

    def step_rule(self, cohort, w_start: Tensor, lr: float) -> StepRule:
        return StepRule(grad_mask=self._mask(True, w_start))  # the head phase: the body frozen

    def after_local(self, cohort, w_start, w_end, lr, local) -> Tensor:
        n_k = cohort.num_examples
        steps = (torch.full_like(n_k, self.body_steps) if self.body_steps is not None
                 else self.body_epochs * steps_per_epoch(n_k, local.batch_size))
        steps = torch.where(cohort.active, steps, torch.zeros_like(steps))
        rule = StepRule(grad_mask=self._mask(False, w_end))  # the body phase: the new head frozen
        final = local.train(w_end, rule, steps=steps, stream="body").weights
        super().after_local(cohort, w_start, final, lr, local)
        return final
