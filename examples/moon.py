"""MOON (Li, He, Song 2021, "Model-Contrastive Federated Learning", Eq. 3-4) as a user's own
component, outside lfed.

Each client's local loss adds ``μ ℓ_con`` to the supervised loss, with

    ℓ_con = −log( exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) )

where ``z`` is the representation (the output of ``layer``) of the model being trained, ``z_glob``
that of the round's global model and ``z_prev`` that of the client's model at the end of its
previous round (the global model at its first participation), on the same examples, and ``sim``
the cosine similarity. The loss term reads ``z`` from the forward pass the loss already makes
(``model.features``) and runs the same net with the other two parameter rows
(``model.represent``): no second copy of the net.

    model:
      objective: {class_path: moon.MOON, init_args: {mu: 1.0, temperature: 0.5, layer: net.3}}
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lfed import GLOBAL, LossTerm, StateSpec
from lfed.client import ClientRule


class MOON(ClientRule):
    name = "moon"

    def __init__(self, mu: float = 1.0, temperature: float = 0.5, layer: str = "net.3") -> None:
        super().__init__()
        if not mu >= 0 or not temperature > 0:
            raise ValueError(f"mu: must be >= 0 and temperature: > 0, got mu={mu}, temperature={temperature}")
        self.mu, self.temperature, self.layer = float(mu), float(temperature), layer

    def hparams(self) -> dict:
        return {"mu": self.mu, "temperature": self.temperature, "layer": self.layer}

    def state_specs(self) -> list[StateSpec]:
        return [StateSpec("previous", init=GLOBAL)]

    def loss_term(self, cohort, w_start):
        K = cohort.clients.numel()
        rows = {"global": w_start.expand(K, -1), "previous": self.rows("previous", cohort.clients, first=w_start)}
        mu, tau = self.mu, self.temperature

        def contrastive(params, out, x, y, aux, model):
            z = model.features
            z_glob = model.represent(aux["global"], x).detach()
            z_prev = model.represent(aux["previous"], x).detach()
            pos = F.cosine_similarity(z, z_glob, dim=-1) / tau
            neg = F.cosine_similarity(z, z_prev, dim=-1) / tau
            return mu * (torch.logaddexp(pos, neg) - pos)  # [B]: μ ℓ_con of each example

        return LossTerm(contrastive, rows, layer=self.layer)

    def after_local(self, cohort, w_start, w_end, lr, local) -> None:
        self.write_rows("previous", cohort.clients, w_end, mask=cohort.active)
