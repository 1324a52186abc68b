"""Per-example losses: the engine masks padding out of each client's mean, so it needs one loss per example.

:func:`as_per_example_loss` turns a user's loss (a ``torch.nn`` loss module, a callable returning
per-example values or one value for the batch) into one that returns a loss per example;
:func:`per_example_mean` reduces a ``[B, ...]`` per-example loss to ``[B]``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LossFn = Callable[[Tensor, Tensor], Tensor]


def per_example_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy per example (``reduction='none'``): lfed's default client loss."""
    return F.cross_entropy(logits, target, reduction="none")


def as_per_example_loss(loss: nn.Module | LossFn | None) -> LossFn:
    """Turn a user's loss into one that returns a loss per example.

    A ``torch.nn`` loss module with a ``reduction`` attribute is copied with
    ``reduction='none'``. A plain callable may return one value per example (``[B]`` or
    ``[B, ...]``) or one value for the whole batch (``F.cross_entropy`` with its default mean, a
    lambda with ``.sum()``): then it is evaluated example by example (``torch.func.vmap`` over the
    batch), so the engine's mask keeps the padding of a partial last batch out of the mean.
    """
    if loss is None:
        return per_example_cross_entropy
    if isinstance(loss, nn.Module) and hasattr(loss, "reduction"):
        import copy

        loss = copy.copy(loss)
        loss.reduction = "none"
        return loss
    if not callable(loss):
        raise ValueError(f"loss: expected a torch.nn loss or a callable (logits, target) -> per-example loss, got {loss!r}")
    return _PerExample(loss)


class _PerExample:
    """A plain loss callable made per-example (see :func:`as_per_example_loss`)."""

    def __init__(self, loss: LossFn) -> None:
        self.loss = loss
        self._one = lambda o, t: loss(o[None], t[None]).reshape(())

    def __call__(self, out: Tensor, target: Tensor) -> Tensor:
        value = self.loss(out, target)
        if value.dim() >= 1 and value.shape[0] == out.shape[0]:
            return value
        if value.numel() != 1:
            raise ValueError(
                f"loss: returned shape {tuple(value.shape)} for a batch of {out.shape[0]}; expected one value "
                f"per example ([{out.shape[0]}]) or one value for the batch"
            )
        try:  # one call over the batch where the loss can be vmapped
            return torch.func.vmap(self._one)(out, target)
        except Exception:  # noqa: BLE001 - a loss vmap cannot run: example by example
            return torch.stack([self._one(out[i], target[i]) for i in range(out.shape[0])])

    def __repr__(self) -> str:
        return f"per_example({self.loss!r})"


def per_example_mean(per_example: Tensor) -> Tensor:
    """``[B]`` from a per-example loss ``[B]`` or ``[B, ...]`` (e.g. squared errors: one mean per example)."""
    return per_example.reshape(per_example.shape[0], -1).mean(1) if per_example.dim() > 1 else per_example
