"""APFL (Deng, Kamani, Mahdavi 2020, "Adaptive Personalized Federated Learning", Algorithm 1 and its update of α; docs/algorithms.md §13).

Every client keeps a personal model ``v_k`` and a mixing weight ``α_k ∈ [0, 1]``; its personalized
model is ``v̄_k = α_k v_k + (1 − α_k) w``. At each local step on a batch ``ξ``, from the step's
values of ``w``, ``v_k`` and ``α_k`` (the paper's simultaneous update):

    w   ← w − η ∇F_k(w; ξ)
    v_k ← v_k − η ∇_v F_k(v̄_k; ξ) = v_k − η α_k ∇F_k(v̄_k; ξ)
    α_k ← clip_[0,1](α_k − η_α ⟨v_k − w, ∇F_k(v̄_k; ξ)⟩)

and the server aggregates ``w`` as FedAvg. ``w``'s steps do not depend on ``v`` or ``α`` (they are
FedAvg's local SGD), but ``v`` and ``α`` need ``w`` at every step, so the cohort is replayed step by
step on the round's own batches (``(seed, round, "batches")``): each step is one engine call over
``2K`` rows, ``[w_t; v̄_t]``, the first ``K`` at ``η`` and the others at learning rate 1, which gives
``∇F_k(v̄_t; ξ_t) = v̄_t − (v̄_t − ∇F_k(v̄_t; ξ_t))``. The replayed ``w`` is the clients' final model
(the round's own training of ``w`` is discarded: APFL costs about three FedAvg rounds of
local work and ``T`` engine calls). A straggler stops after its ``s_k`` steps; an inactive client
keeps ``v_k`` and ``α_k``. ``v_k`` starts as the global model at the client's first participation
and ``α_k`` at ``alpha``.

    model:
      algorithm: apfl
      objective: {class_path: lfed.personal.apfl.APFL, init_args: {alpha: 0.25, alpha_lr: 0.1}}
"""

from __future__ import annotations

import torch
from torch import Tensor

from lfed.base.declaration import Declaration, Supports
from lfed.checks import number
from lfed.client.objectives import ClientRule
from lfed.engine import batch_schedule
from lfed.rng import round_generator
from lfed.state.spec import GLOBAL, StateSpec


class APFL(ClientRule):
    """APFL (module docstring).

    Args:
        alpha: Initial mixing weight ``α_k`` of every client, in [0, 1].
        alpha_lr: ``η_α >= 0``, the learning rate of ``α`` (0: ``α`` fixed).
    """

    name = "apfl"
    declares = Declaration(supports=Supports(personalized=True))

    def __init__(self, alpha: float = 0.5, alpha_lr: float = 0.1) -> None:
        super().__init__()
        self.alpha = float(number("alpha", alpha, at_least=0, at_most=1, detail=" (APFL's initial mixing weight)"))
        self.alpha_lr = float(number("alpha_lr", alpha_lr, at_least=0, detail=" (APFL's learning rate of α)"))

    def hparams(self) -> dict:
        return {"alpha": self.alpha, "alpha_lr": self.alpha_lr}

    def state_specs(self) -> list[StateSpec]:
        return [StateSpec("personal", init=GLOBAL), StateSpec("mix", shape=(), init=self.alpha, dtype=torch.float64)]

    def after_local(self, cohort, w_start, w_end, lr, local) -> Tensor:
        K = cohort.clients.numel()
        steps = local.steps_done.detach().cpu().long()
        T = int(steps.max()) if K else 0
        positions, valid = batch_schedule(local.num_examples, T, local.batch_size,
                                          round_generator(local.seed, local.round, "batches"))  # the round's own batches
        both = type(local)(**{**local.__dict__, "index": torch.cat([local.index, local.index]),
                              "num_examples": torch.cat([local.num_examples, local.num_examples]),
                              "host_num_examples": None if local.host_num_examples is None
                              else torch.cat([local.host_num_examples, local.host_num_examples])})
        rates = torch.cat([torch.full((K,), float(lr), dtype=torch.float64), torch.ones(K, dtype=torch.float64)])
        w = w_start.expand(K, -1).clone()
        v = self.rows("personal", cohort.clients, first=w_start)
        a = self.rows("mix", cohort.clients).to(w.dtype)
        for t in range(T):
            moving = (steps > t).to(w.device)
            mix = a[:, None] * v + (1 - a[:, None]) * w  # v̄_t
            pos, ok = positions[:, t : t + 1], valid[:, t : t + 1]
            out = both.train(torch.cat([w, mix]), steps=torch.cat([moving, moving]).long(), lr=rates,
                             schedule=(torch.cat([pos, pos]), torch.cat([ok, ok]))).weights
            g = mix - out[K:]  # ∇F_k(v̄_t; ξ_t)
            v_next = v - lr * a[:, None] * g  # ∇_v F_k(v̄) = α ∇F_k(v̄)
            a_next = (a - self.alpha_lr * ((v - w) * g).sum(1)).clamp(0.0, 1.0)  # ∂F_k(v̄)/∂α = ⟨v − w, ∇F_k(v̄)⟩
            v = torch.where(moving[:, None], v_next, v)
            a = torch.where(moving, a_next, a)
            w = out[:K]
        self.write_rows("personal", cohort.clients, v, mask=cohort.active)
        self.write_rows("mix", cohort.clients, a, mask=cohort.active)
        return w

    def personal_rows(self, clients: Tensor, w: Tensor, local) -> Tensor:
        v = self.rows("personal", clients, first=w)
        a = self.rows("mix", clients).to(v.dtype)[:, None]
        return a * v + (1 - a) * w
