"""FLTrust (Cao, Fang, Liu and Gong, NDSS 2021, Algorithm 1 and eqs. (2)-(4); docs/robustness.md §2.8)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.base.declaration import Declaration, Releases
from lfed.checks import integer
from lfed.rng import round_generator
from lfed.robust.rules.base import RobustCombination

__all__ = ["FLTrust"]


class FLTrust(RobustCombination):
    """The server trains its own update ``g_0`` on a small clean root set each round, from the round's global model with
    the clients' local training (plain SGD, the same learning rate, batch size and step budget), and trusts each client
    by the direction of its update: ``TS_i = ReLU(cos(x_i, g_0))``, ``x̄_i = (‖g_0‖ / ‖x_i‖) x_i``,
    ``Δ = Σ_i TS_i x̄_i / Σ_j TS_j`` (``Δ = 0`` when every ``TS_i`` is 0). An update that is exactly 0 (a client that
    sent nothing) has no direction: ``TS_i = 0``, so it adds nothing (not ``0 · ∞``). The aggregation weights are not used.

    The root set is ``root_size`` examples of the server's validation split (``data.validation_fraction``: examples no
    client holds), drawn once from ``(seed, "fltrust_root")``: the server's "small clean training dataset" of the paper
    (its experiments: 100 examples). ``robust/kept`` counts the clients with ``TS_i > 0``.

    Args:
        root_size: Examples of the root set (at most the validation split's).
    """

    name = "fltrust"
    takes_f = False
    declares = Declaration(releases=Releases(values=(
        "the trust-weighted mean of the clients' raw updates, rescaled to the norm of the server's own update "
        "(unclipped, un-noised)",)))

    def __init__(self, root_size: int = 100) -> None:
        super().__init__(None)
        self.root_size = integer("root_size", root_size, at_least=1)
        self._pool: Tensor | None = None  # the validation split's positions (check_data)
        self._root: tuple[int, Tensor] | None = None

    def hparams(self) -> dict:
        return {"root_size": self.root_size}

    def min_inputs(self, f: int) -> int:
        return 1

    def check_data(self, data: Any) -> None:
        if not getattr(data, "has_validation", False):
            raise ValueError("combination: fltrust trains the server's root set from the server's validation split; "
                             "give data.validation_fraction > 0")
        if self.root_size > data.val_index.numel():
            raise ValueError(f"root_size: {self.root_size} is more than the server's validation split holds "
                             f"({data.val_index.numel()} examples); give a smaller root_size or a larger validation_fraction")
        self._pool, self._root = data.val_index, None

    def root(self, seed: int) -> Tensor:
        """The root set's positions in the training tensors (drawn once per seed)."""
        if self._pool is None:
            raise ValueError("combination: fltrust has no root set: the run's data was not checked (check)")
        if self._root is None or self._root[0] != seed:
            pick = torch.randperm(self._pool.numel(), generator=round_generator(seed, 0, "fltrust_root"))[:self.root_size]
            self._root = (seed, self._pool[pick.to(self._pool.device)])
        return self._root[1]

    def server_update(self, cohort: Cohort) -> Tensor:
        """``g_0 [P]``: the server's update on its root set from the round's global model."""
        work, w = cohort.local_work, cohort.start_model
        if work is None or w is None:
            raise ValueError("combination: fltrust needs the round's local work (run it through lfed.core.round.run_round)")
        index = self.root(cohort.seed)
        n = torch.tensor([index.numel()])
        steps = work.plan.step_budget(n) if work.plan is not None else cohort.host_values().step_budget.max().view(1)
        device = index.device
        root = replace(work, index=index[None], num_examples=n.to(device), steps_done=steps.to(device), buffers=None,
                       host_num_examples=n, host_steps_done=steps)
        return root.train(w, stream="fltrust").weights[0] - w

    def aggregate(self, x: Tensor, a: Tensor, f: int, cohort: Cohort) -> tuple[Tensor, Tensor]:
        g0 = self.server_update(cohort).to(x.dtype)
        if g0.numel() != x.shape[1]:
            raise ValueError("combination: fltrust is not defined with partial sharing (its server update covers the whole "
                             "model); use it with a shared model")
        tiny = torch.finfo(x.dtype).tiny
        n0, norms = g0.norm(), x.norm(dim=1)
        # unit directions first: n0 / ||x_i|| overflows to inf for a tiny ||x_i||, and 0 * inf is NaN; a zero update
        # (or a zero g_0) has no direction, so its direction is 0: trust 0 and nothing added
        units = torch.where((norms > 0)[:, None], x / norms.clamp_min(tiny)[:, None], torch.zeros_like(x))
        unit0 = torch.where(n0 > 0, g0 / n0.clamp_min(tiny), torch.zeros_like(g0))
        trust = torch.relu(units @ unit0)
        total = trust.sum()
        delta = torch.where(total > 0, n0 * (trust @ units) / total.clamp_min(tiny), torch.zeros_like(g0))
        return delta, trust > 0
