"""One cohort's local training as a value: :class:`TrainJob`, the arguments of :meth:`lfed.engine.CohortTrainer.train`.

A round (:func:`lfed.core.round.prepare_round`) makes one; the engine trains it, alone, split over processes
(:func:`lfed.engine.ranks.train_cohort`) or merged with other runs' jobs in one call (:mod:`lfed.core.lockstep`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from lfed.engine.result import CohortResult
from lfed.engine.rule import StepRule

if TYPE_CHECKING:
    from lfed.engine.trainer import CohortTrainer

__all__ = ["TrainJob"]


@dataclass(frozen=True)
class TrainJob:
    """One cohort's local training: the arguments of :meth:`CohortTrainer.train`, in its order."""

    w_start: Tensor
    data_x: Tensor
    data_y: Tensor
    index: Tensor
    num_examples: Tensor
    steps_done: Tensor
    rule: StepRule
    lr: float
    batch_size: int | None
    generator: torch.Generator | None
    schedule: tuple[Tensor, Tensor] | None = None  # given batches (the rows of several runs, lfed.core.lockstep)
    buffers: dict[str, Tensor] | None = None  # per-row start buffers {name: [K, ...]} (FedBN's statistics)
    augment: tuple | None = None  # (Augmentation, its generator or drawn parameters): every step's batch transformed
    host_num_examples: Tensor | None = None  # the host copies of num_examples and steps_done (lfed.engine.host): the engine
    host_steps_done: Tensor | None = None    # reads its schedule and step counts from them without a device read

    def args(self) -> tuple:
        """The positional arguments of :meth:`CohortTrainer.train` (``schedule``, ``buffers``, ``augment`` are keywords).

        The engine reads sizes and steps on the host: it gets the host copies where there are.
        """
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in ("schedule", "buffers", "augment", "host_num_examples", "host_steps_done")}
        if self.host_num_examples is not None:
            out["num_examples"] = self.host_num_examples
        if self.host_steps_done is not None:
            out["steps_done"] = self.host_steps_done
        return tuple(out.values())

    def sizes_on_host(self) -> Tensor:
        """``[K]`` the rows' sizes on the host (the host copy, or one device read)."""
        return self.host_num_examples if self.host_num_examples is not None else self.num_examples.detach().cpu()

    def steps_on_host(self) -> Tensor:
        """``[K]`` the rows' steps done on the host (the host copy, or one device read)."""
        return self.host_steps_done if self.host_steps_done is not None else self.steps_done.detach().cpu()

    def train(self, engine: CohortTrainer, rows: Tensor | None = None) -> CohortResult:
        """``engine.train`` of this job (its ``rows`` only, when given)."""
        kwargs = {k: v for k, v in (("rows", rows), ("schedule", self.schedule), ("buffers", self.buffers),
                                    ("augment", self.augment)) if v is not None}
        return engine.train(*self.args(), **kwargs)
