"""The data's task and whether a net fits it: integer targets are class labels (classification: loss and accuracy),
floating targets regression targets (loss only) (:func:`is_classification`); :func:`check_task` runs the net once
before round 0 and refuses outputs that do not fit the task (number of classes, or the regression target's shape)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lfed.engine.norm import evaluating

__all__ = ["check_task", "is_classification", "output_shape_is_known"]


def is_classification(y: Tensor) -> bool:
    """Whether targets ``y`` are class labels (an integer dtype) rather than regression targets."""
    return not (y.dtype.is_floating_point or y.dtype.is_complex)

def _known_losses() -> tuple[tuple, tuple]:
    import torch.nn.functional as F

    classification = (nn.CrossEntropyLoss, nn.NLLLoss), (F.cross_entropy, F.nll_loss)
    regression = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss), (F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss)
    return classification, regression


def output_shape_is_known(loss, classification: bool) -> bool:
    """Whether ``loss`` fixes the net's output shape: lfed's default (None) or a torch loss of the task.

    With any other loss (a user's function over integer targets, say a squared error on the
    label value) the loss defines what the outputs mean, and lfed does not check their shape.
    """
    if loss is None:
        return classification
    modules, functions = _known_losses()[0 if classification else 1]
    return isinstance(loss, modules) or any(loss is f for f in functions)


@torch.no_grad()
def check_task(net: nn.Module, data, loss=None) -> None:
    """Refuse a net whose output does not fit the data's task, before any round is spent.

    Classification (with the default loss, ``CrossEntropyLoss`` or ``NLLLoss``): the last output
    dimension must be the number of classes ``C`` (the other dimensions those of a label).
    Regression (with ``MSELoss``, ``L1Loss``, ``SmoothL1Loss``, ``HuberLoss``): one output per
    target value (``out.shape[1:] == y.shape[1:]``). With another loss nothing is checked (see
    :func:`output_shape_is_known`). Two examples are run through the net.

    Raises:
        ValueError: Naming the net's output shape and what the data needs.
    """
    x = data.train_x[:2]  # two: a norm layer without running statistics needs more than one value per channel
    dtype = next(net.parameters()).dtype
    x = x.to(dtype) if x.is_floating_point() else x
    try:
        with evaluating(net):
            out = net(x)
    except (RuntimeError, ValueError, TypeError, IndexError) as err:  # e.g. "mat1 and mat2 shapes cannot be multiplied"
        said = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        flat = math.prod(x.shape[1:])
        raise ValueError(f"net: does not run on the data's inputs ({tuple(x.shape[1:])} per example, {x.dtype}): {said}; "
                         f"its first layer must take this input (a flattened one has {flat} values: in_features={flat})") from err
    if not output_shape_is_known(loss, is_classification(data.train_y)):
        return
    if not isinstance(out, Tensor):
        raise ValueError(f"net: must return a tensor of outputs, returned {type(out).__name__}")
    y = data.train_y[:1]
    if is_classification(data.train_y):
        C = data.num_classes
        if out.dim() < 2 or out.shape[-1] != C or tuple(out.shape[1:-1]) != tuple(y.shape[1:]):
            per_label = f", label shape {tuple(y.shape[1:])}" if y.dim() > 1 else ""
            raise ValueError(
                f"net: outputs shape {tuple(out.shape[1:])} per example, but the data has {C} classes "
                f"(labels 0..{C - 1}{per_label}): the net's last layer must output {C} values per example "
                "(one score per class)"
            )
    elif tuple(out.shape[1:]) != tuple(y.shape[1:]):
        raise ValueError(
            f"net: outputs shape {tuple(out.shape[1:])} per example, but the regression targets have shape "
            f"{tuple(y.shape[1:])} per example: the net must output one value per target value"
        )
