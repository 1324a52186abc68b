"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar 2020, "Personalized Federated Learning with Theoretical Guarantees:
A Model-Agnostic Meta-Learning Approach", NeurIPS; Algorithm 1 and its FO and HF variants; docs/algorithms.md §13).

The global model minimizes the MAML objective ``(1/n) Σ_k F_k(w)``, ``F_k(w) = f_k(w − α ∇f_k(w))``: the
loss of client ``k`` after one gradient step of size ``α`` on its own data. Each local step ``t`` of client
``k`` (Algorithm 1, lines 6-9) draws independent batches ``D_t``, ``D'_t`` (and ``D''_t``) and does

    w̃ = w − α ∇f_k(w; D_t)                                              (the inner, "personal" step)
    FO:  w ← w − β ∇f_k(w̃; D'_t)                                        (the Hessian term dropped)
    HF:  w ← w − β (∇f_k(w̃; D'_t) − α d_t),
         d_t = [∇f_k(w + δ g; D''_t) − ∇f_k(w − δ g; D''_t)] / (2δ),  g = ∇f_k(w̃; D'_t)

``d_t`` is the finite-difference estimate of the Hessian-vector product ``∇²f_k(w; D''_t) g`` (δ
``delta``). ``β`` is the run's ``client_lr`` and ``α`` this rule's ``alpha``. The server averages the clients'
models as FedAvg. The personalized model of client ``k`` is the global model after ``eval_steps`` (default
1) steps of SGD at ``α`` on its training data (the paper's evaluation: "one step of stochastic gradient
descent"), batches of the run's batch size from ``(seed, rounds done, "perfedavg_eval")``.

Batches: ``D_t`` is the round's own step-``t`` batch (``(seed, round, "batches")``), ``D'_t`` and ``D''_t``
come from the streams ``"perfedavg_outer"`` and ``"perfedavg_hessian"`` (each client walks through its
shuffled examples in each stream as in any round). Every step is two (FO) or three (HF) engine calls over
the cohort (the HF one of ``2K`` rows ``[w + δg; w − δg]``), each a single step from given batches; a
gradient is read back as ``row − (row − 1·∇f)`` of a step at learning rate 1 (as APFL does). The
round's own training of ``w`` is discarded: a round costs about 3 (FO) or 5 (HF) FedAvg rounds of local
work and ``2T`` or ``3T`` engine calls. A straggler stops after its ``s_k`` steps. No per-client state.

    model:
      algorithm: perfedavg                 # or objective: {class_path: lfed.personal.perfedavg.PerFedAvg,
      client_lr: 0.001                     #   init_args: {alpha: 0.01, variant: hf, delta: 0.001}}
"""

from __future__ import annotations

import torch
from torch import Tensor

from lfed.base.declaration import Declaration, Supports
from lfed.checks import integer, number, one_of
from lfed.client.objectives import ClientRule
from lfed.engine import StepRule, batch_schedule
from lfed.rng import round_generator

VARIANTS = ("fo", "hf")


class PerFedAvg(ClientRule):
    """Per-FedAvg (module docstring).

    Args:
        alpha: ``α > 0``, the inner (personalization) step size.
        variant: ``"fo"`` (first-order: the Hessian term dropped) or ``"hf"`` (Hessian-free: the
            finite-difference Hessian-vector product, a third batch per step).
        delta: ``δ > 0`` of the finite difference (``"hf"`` only; the paper's experiments use 0.001).
        eval_steps: Steps of SGD at ``α`` from the global model that make a client's personalized model (>= 1).
    """

    name = "perfedavg"
    declares = Declaration(supports=Supports(personalized=True))

    def __init__(self, alpha: float = 0.01, variant: str = "fo", delta: float = 0.001, eval_steps: int = 1) -> None:
        super().__init__()
        self.alpha = float(number("alpha", alpha, above=0, detail=" (Per-FedAvg's inner step size α)"))
        self.variant = one_of("variant", variant, VARIANTS)
        self.delta = float(number("delta", delta, above=0, detail=" (Per-FedAvg HF's finite-difference δ)"))
        self.eval_steps = integer("eval_steps", eval_steps, at_least=1,
                                  detail=" (Per-FedAvg's steps of size α that personalize the global model)")

    def hparams(self) -> dict:
        return {"alpha": self.alpha, "delta": self.delta, "eval_steps": self.eval_steps}

    def structure(self) -> dict:
        return {"variant": self.variant}

    def after_local(self, cohort, w_start, w_end, lr, local) -> Tensor:
        K = cohort.clients.numel()
        steps = (local.steps_done if local.host_steps_done is None else local.host_steps_done).detach().cpu().long()
        T = int(steps.max()) if K else 0  # host values (lfed.engine.host): no device read inside the round
        n_k, B = (local.num_examples if local.host_num_examples is None else local.host_num_examples), local.batch_size
        inner = batch_schedule(n_k, T, B, round_generator(local.seed, local.round, "batches"))  # D_t: the round's own
        outer = batch_schedule(n_k, T, B, round_generator(local.seed, local.round, "perfedavg_outer"))  # D'_t
        hf = self.variant == "hf"
        if hf:
            hessian = batch_schedule(n_k, T, B, round_generator(local.seed, local.round, "perfedavg_hessian"))  # D''_t
            both = local.tiled(2)
        w = w_start.expand(K, -1).clone()
        for t in range(T):
            moving = (steps > t).to(w.device).long()
            d_t, d2_t = ((pos[:, t : t + 1], ok[:, t : t + 1]) for pos, ok in (inner, outer))
            w_tilde = local.train(w, steps=moving, lr=self.alpha, schedule=d_t).weights  # w − α∇f(w; D)
            g = w_tilde - local.train(w_tilde, steps=moving, lr=1.0, schedule=d2_t).weights  # ∇f(w̃; D')
            if hf:
                pos, ok = hessian[0][:, t : t + 1], hessian[1][:, t : t + 1]
                probes = torch.cat([w + self.delta * g, w - self.delta * g])
                grads = probes - both.train(probes, steps=torch.cat([moving, moving]), lr=1.0,
                                            schedule=(torch.cat([pos, pos]), torch.cat([ok, ok]))).weights
                d = (grads[:K] - grads[K:]) / (2 * self.delta)  # ≈ ∇²f(w; D'') g
                g = g - self.alpha * d
            w = torch.where(moving[:, None].bool(), w - lr * g, w)
        return w

    def personal_rows(self, clients: Tensor, w: Tensor, local) -> Tensor:
        steps = torch.full_like(local.num_examples, self.eval_steps)
        return local.train(w, StepRule(), steps=steps, lr=self.alpha, stream="perfedavg_eval").weights
