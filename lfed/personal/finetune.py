"""FedAvg-FT: FedAvg's global model, fine-tuned by each client on its own data before it is evaluated (docs/algorithms.md §13).

The baseline every personalization paper reports (e.g. Wang et al. 2019, "Federated Evaluation of
On-device Personalization"; Yu, Bagdasaryan, Shmatikov 2020, "Salvaging Federated Learning by Local
Adaptation"): training is FedAvg's; at every evaluation each evaluated client runs ``T_ft`` steps of
plain SGD at ``eta_ft`` from the global model on its training data,
``v_k ← v_k − eta_ft ∇F_k(v_k; batch)``, ``v_k⁰ = w``, and its personalized model is the result.
No state. The fine-tuning of the evaluated clients is one engine call per evaluation chunk
(:meth:`lfed.base.component.LocalWork.train`), with batches drawn from ``(seed, rounds done, "finetune")``.

    model:
      objective: {class_path: lfed.personal.finetune.FedAvgFT, init_args: {epochs: 1}}
"""

from __future__ import annotations

import torch
from torch import Tensor

from lfed.base.declaration import Declaration, Supports
from lfed.checks import integer, number
from lfed.client.objectives import ClientRule
from lfed.engine import StepRule, steps_per_epoch


class FedAvgFT(ClientRule):
    """FedAvg-FT (module docstring).

    Args:
        epochs: ``E_ft`` local epochs of fine-tuning (``E_ft · ceil(n_k / B)`` steps, ``B`` the run's batch size).
        steps: ``T_ft`` steps instead (then leave ``epochs`` None).
        lr: ``eta_ft`` (None: the run's ``client_lr``). Choose it on the clients' validation splits: one client's
            steps have no cohort average to damp them, and a client lr FedAvg trains well with can be past the
            stability limit ``2 / λ_max`` of one client's loss (LEAF FEMNIST, issue 39: RESULTS.md).
    """

    name = "fedavg_ft"
    declares = Declaration(supports=Supports(personalized=True))

    def __init__(self, epochs: int | None = 1, steps: int | None = None, lr: float | None = None) -> None:
        super().__init__()
        if (epochs is None) == (steps is None):
            raise ValueError(f"epochs/steps: give exactly one of the fine-tuning's epochs or steps, got epochs={epochs}, "
                             f"steps={steps}")
        if epochs is not None:
            integer("epochs", epochs, at_least=1, detail=" (FedAvg-FT's fine-tuning epochs)")
        if steps is not None:
            integer("steps", steps, at_least=1, detail=" (FedAvg-FT's fine-tuning steps)")
        if lr is not None:
            number("lr", lr, above=0, detail=" (FedAvg-FT's fine-tuning learning rate; None: client_lr)")
        self.epochs, self.steps, self.lr = epochs, steps, None if lr is None else float(lr)

    def hparams(self) -> dict:
        return {"epochs": self.epochs, "steps": self.steps, "lr": self.lr}

    def fine_tune_steps(self, num_examples: Tensor, batch_size: int | None) -> Tensor:
        """``[K]`` fine-tuning steps of clients of sizes ``num_examples``."""
        if self.steps is not None:
            return torch.full_like(num_examples, self.steps)
        return self.epochs * steps_per_epoch(num_examples, batch_size)

    def personal_rows(self, clients: Tensor, w: Tensor, local) -> Tensor:
        steps = self.fine_tune_steps(local.num_examples, local.batch_size)
        return local.train(w, StepRule(), steps=steps, lr=self.lr, stream="finetune").weights
