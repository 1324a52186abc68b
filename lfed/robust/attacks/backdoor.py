"""A backdoor with model replacement (Bagdasaryan et al., "How To Backdoor Federated Learning", AISTATS 2020, §3-4;
docs/robustness.md §1.7)."""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.checks import integer, number
from lfed.rng import round_generator
from lfed.robust.attacks.base import Attack

__all__ = ["Backdoor", "poisoned_positions", "stamp"]


def stamp(x: Tensor, size: int, value: float) -> Tensor:
    """``x`` (a batch of images ``[n, C, H, W]``, ``[n, H, W]``, or flat ``[n, D]`` with ``D`` a square) with a
    ``size × size`` square of ``value`` in the bottom-right corner: the trigger (a new tensor)."""
    shape = x.shape
    if x.dim() == 2:
        side = math.isqrt(shape[1])
        out = x.clone().view(shape[0], side, side)
    else:
        out = x.clone()
    out[..., -size:, -size:] = value
    return out.view(shape)


def poisoned_positions(data: Any, clients: Tensor, share: float, seed: int) -> Tensor:
    """The positions in the training tensors of the examples the clients ``clients`` (``[N]`` bool) stamp: each client
    ``k`` its own ``⌈share · n_k⌉`` of its ``n_k`` examples, drawn uniformly without replacement from
    ``(seed, "backdoor")`` (one uniform key per slot of ``data.client_index``, the lowest keys of each client's row)."""
    index, sizes = data.client_index[clients], data.client_sizes[clients]  # [B, L], [B]
    g = round_generator(seed, 0, "backdoor")
    keys = torch.rand(index.shape, generator=g, dtype=torch.float64).to(index.device)
    slots = torch.arange(index.shape[1], device=index.device)[None, :]
    keys = torch.where(slots < sizes[:, None], keys, torch.full_like(keys, 2.0))  # past a client's examples: last
    order = keys.argsort(dim=1, stable=True)
    counts = torch.ceil(share * sizes.to(torch.float64) - 1e-9).long()  # ⌈share · n_k⌉ (0.3 · 10 is 3, not 4)
    return index.gather(1, order)[slots < counts[:, None]]


class Backdoor(Attack):
    """The Byzantine clients train on their data with a share of it stamped with a trigger (a square in the corner of the
    image) and relabelled ``target``, and boost what they send by ``γ``: ``x_b ← γ x_b`` (model replacement: with
    ``γ = n/η``, ``n`` the clients whose updates the server averages and ``η`` its learning rate, the Byzantine update
    replaces the global model under FedAvg, Bagdasaryan et al. eq. (3)). Each Byzantine client stamps its own
    ``⌈poison_fraction · n_k⌉`` of its ``n_k`` examples (drawn once from ``(seed, "backdoor")``:
    :func:`poisoned_positions`), as the paper's attacker mixes backdoor examples into each of its own batches; the copy of
    the data is made once per process. Each evaluation logs ``backdoor/attack_success``: the share of the test inputs not of class ``target``
    that the global model classifies as ``target`` once stamped.

    Args:
        target: The backdoor's class.
        poison_fraction: The share of each Byzantine client's examples stamped and relabelled, in ``(0, 1]``
            (``⌈poison_fraction · n_k⌉`` of client ``k``'s ``n_k``).
        trigger_size: The side of the square, in pixels.
        trigger_value: Its pixels' value; None: the largest value of the training inputs.
        boost: ``γ`` (1: no model replacement).
    """

    name = "backdoor"
    poisons_data = True

    def __init__(self, fraction: float = 0.0, per_round: int | None = None, target: int = 0, poison_fraction: float = 0.5,
                 trigger_size: int = 3, trigger_value: float | None = None, boost: float = 1.0) -> None:
        super().__init__(fraction, per_round)
        self.target = integer("target", target, at_least=0)
        self.poison_fraction = number("poison_fraction", poison_fraction, above=0, at_most=1)
        self.trigger_size = integer("trigger_size", trigger_size, at_least=1)
        self.trigger_value = None if trigger_value is None else number("trigger_value", trigger_value)
        self.boost = number("boost", boost)
        self._test: tuple[Any, Tensor, Tensor] | None = None

    def hparams(self) -> dict:
        return {**super().hparams(), "target": self.target, "poison_fraction": self.poison_fraction,
                "trigger_size": self.trigger_size, "trigger_value": self.trigger_value, "boost": self.boost}

    def check(self, context) -> list[str]:
        if context.data is not None:
            self.check_data(context.data)
        return super().check(context)

    def check_data(self, data: Any) -> None:
        data.require_labels("attack='backdoor' (a target class)")
        if self.target >= data.num_classes:
            raise ValueError(f"target: {self.target} is not a class of the data (0 to {data.num_classes - 1})")
        x = data.train_x
        ok = x.dtype.is_floating_point and (x.dim() >= 3 or (x.dim() == 2 and math.isqrt(x.shape[1]) ** 2 == x.shape[1]))
        if not ok:
            raise ValueError(f"attack='backdoor' stamps a square trigger on images, but the inputs are {tuple(x.shape[1:])} "
                             f"{x.dtype}; give image data ([C, H, W], [H, W] or a flat square)")
        side = x.shape[-1] if x.dim() >= 3 else math.isqrt(x.shape[1])
        if self.trigger_size > side:
            raise ValueError(f"trigger_size: {self.trigger_size} is larger than the images ({side} pixels a side)")

    def _value(self, data: Any) -> float:
        return float(data.train_x.max()) if self.trigger_value is None else self.trigger_value

    def training_data(self, cohort: Cohort, data: Any, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        if not self.active:
            return x, y

        def make() -> tuple[Tensor, Tensor]:
            byz = self.byzantine_clients(cohort.num_clients, cohort.seed).to(y.device)
            positions = poisoned_positions(data, byz, self.poison_fraction, cohort.seed)
            px, py = x.clone(), y.clone()
            px[positions] = stamp(x[positions], self.trigger_size, self._value(data))
            py[positions] = self.target
            return px, py

        return self.poisoned_copy(cohort, data, x, (self.target, self.poison_fraction, self.trigger_size,
                                                     self.trigger_value), make)

    def craft(self, updates: Tensor, byzantine: Tensor, honest: Tensor, cohort: Cohort) -> Tensor:
        return self.boost * updates.index_select(0, byzantine)

    def poison(self, updates: Tensor, cohort: Cohort) -> Tensor:
        return updates if self.boost == 1.0 else super().poison(updates, cohort)

    def evaluation_metrics(self, data: Any, evaluate) -> dict[str, float]:
        if not self.active:
            return {}
        if self._test is None or self._test[0]() is not data.test_x:
            keep = data.test_y != self.target
            x = stamp(data.test_x[keep], self.trigger_size, self._value(data))
            self._test = (weakref.ref(data.test_x), x, torch.full((x.shape[0],), self.target, dtype=data.test_y.dtype,
                                                                  device=x.device))
        return {"backdoor/attack_success": evaluate(self._test[1], self._test[2])["test/acc"]}
