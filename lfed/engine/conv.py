"""Convolutions of a cohort as batched matrix products: the vmap backend's form of ``Conv1d`` / ``Conv2d``.

Under ``vmap`` over stacked client weights, torch computes a convolution whose weight is batched as
one grouped convolution (``groups = K x groups``), and cuDNN runs a grouped convolution as one
small kernel per group: one kernel per client per step. Written as im2col (``F.unfold``) and a
matrix product, the same convolution becomes, under ``vmap``, one unfold of the cohort's batch and
one batched matrix product over the cohort: a fixed number of kernels whatever ``K``.

* :func:`conv2d_matmul` / :func:`conv1d_matmul`: ``F.conv2d`` / ``F.conv1d`` as unfold + matmul
  (the same maths; float64 agrees to round-off, forward and backward);
* :data:`CONV_FORMS`, :func:`choose_form`: which form a convolution of given shapes runs in
  (``"matmul"`` or ``"native"``), a fixed rule of the device (below);
* :func:`conv_forms`: the context in which a net's ``Conv1d`` / ``Conv2d`` modules compute in the
  chosen form (the engine's vmapped step; the net is as it was after it).

The rule (``"auto"``): the native form on every device, measured: on a CPU the grouped convolution
is one oneDNN call and the matmul form took about twice as long (``benchmarks/conv_forms.py``,
BENCHMARKS.md "Convolutions of a cohort"); on an H100 (GPU suite, 2026-11-26, K = 50) the F.unfold
matmul form took 2.1x the native form's round (CUDA's im2col is one kernel per image). The im2col
here is now one gather (``index_select``), timed by the GPU suite's conv rows; the rule changes only
on such a measurement. The choice
is a rule of the device, not a timing, because the two forms round differently in float32: a
choice made by timing could differ between two runs of one configuration (or a run and its
resume) and change their results.

Memory: the matmul form saves the unfolded input for the weight's gradient, ``kh * kw`` times the
input of the convolution (9x for 3x3). The engine's chunks are sized by one client's saved tensors
measured in the form the step runs (:meth:`CohortTrainer._saved_bytes`), so they stay within the
activation budget.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.utils import _pair, _single

from lfed.engine.patching import instance_methods

__all__ = ["CONV_FORMS", "choose_form", "conv1d_matmul", "conv2d_matmul", "conv_forms"]

#: ``"auto"`` (the rule of the module docstring), ``"matmul"`` (unfold + batched matmul) or ``"native"`` (``F.conv*``).
CONV_FORMS = ("auto", "matmul", "native")


def _same_padding(kernel: tuple[int, ...], dilation: tuple[int, ...]) -> list[int]:
    """``F.pad`` amounts (last dim first) of ``padding='same'``: as torch's, the odd pixel after."""
    pad: list[int] = []
    for k, d in zip(reversed(kernel), reversed(dilation)):
        total = d * (k - 1)
        pad += [total // 2, total - total // 2]
    return pad


def conv2d_matmul(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] | str = 0, dilation: int | tuple[int, int] = 1, groups: int = 1,
) -> Tensor:
    """``F.conv2d(x, weight, bias, stride, padding, dilation, groups)`` as ``F.unfold`` and one matrix product.

    ``x`` is ``[B, C, H, W]`` (or ``[C, H, W]``), ``weight`` ``[O, C / groups, kh, kw]``. The columns
    of each group are laid out ``[groups, C / groups * kh * kw, B * L]`` so the product is one
    ``[groups, O / groups, .] @ [groups, ., B * L]``: under ``vmap`` over the weight (and ``x``) a
    single batched product over the cohort. Under ``torch.autocast`` it computes in autocast's dtype, as
    ``F.conv2d`` does (the unfold too, and the output has that dtype).
    """
    if x.dim() == 3:
        return conv2d_matmul(x.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0)
    device = x.device.type
    if torch.is_autocast_enabled(device) and x.is_floating_point():  # as autocast casts F.conv2d's operands
        dtype = torch.get_autocast_dtype(device)
        x, weight = x.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    kernel, stride, dilation = tuple(weight.shape[2:]), _pair(stride), _pair(dilation)
    if isinstance(padding, str):
        if padding == "same":
            if stride != (1, 1):
                raise ValueError("padding='same' is not supported for strided convolutions")
            x = F.pad(x, _same_padding(kernel, dilation))
        elif padding != "valid":
            raise ValueError(f"padding: {padding!r} is not 'same', 'valid' or a number")
        padding = (0, 0)
    padding = _pair(padding)
    B, C, H, W = x.shape
    O, g = weight.shape[0], groups
    Ho = (H + 2 * padding[0] - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    Wo = (W + 2 * padding[1] - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    # im2col as ONE gather of the padded input's pixels (index_select over H * W), then one matrix product. Not
    # F.unfold: CUDA's im2col launches one kernel per image (the H100 profile of 2026-11-26: 5,000 kernels a round
    # at K = 50), and not a strided view (Tensor.unfold): its backward has no vmap batching rule (a per-client loop).
    if padding != (0, 0):
        x = F.pad(x, (padding[1], padding[1], padding[0], padding[0]))
    Hp, Wp = x.shape[-2:]
    rows = dilation[0] * torch.arange(kernel[0], device=x.device).view(-1, 1, 1, 1) \
        + stride[0] * torch.arange(Ho, device=x.device).view(1, 1, -1, 1)
    cols_ = dilation[1] * torch.arange(kernel[1], device=x.device).view(1, -1, 1, 1) \
        + stride[1] * torch.arange(Wo, device=x.device).view(1, 1, 1, -1)
    pixels = (rows * Wp + cols_).reshape(-1)  # [kh * kw * Ho * Wo], in (kh, kw, Ho, Wo) order
    cols = x.reshape(B, C, Hp * Wp).index_select(2, pixels)  # [B, C, kh * kw * Ho * Wo]
    L = Ho * Wo
    cols = cols.view(B, g, -1, L).permute(1, 2, 0, 3).reshape(g, -1, B * L)  # [g, C/g * kh * kw, B * L]
    out = torch.matmul(weight.reshape(g, O // g, -1), cols)  # [g, O/g, B * L]
    out = out.view(O, B, Ho, Wo).transpose(0, 1)  # [B, O, Ho, Wo]
    if bias is not None:
        out = out + bias.view(1, O, 1, 1)
    return out.contiguous()


def conv1d_matmul(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int | tuple[int] = 1,
    padding: int | tuple[int] | str = 0, dilation: int | tuple[int] = 1, groups: int = 1,
) -> Tensor:
    """``F.conv1d`` as :func:`conv2d_matmul` of a height-1 image (``x [B, C, L]`` or ``[C, L]``)."""
    pad = padding if isinstance(padding, str) else (0, _single(padding)[0])
    out = conv2d_matmul(x.unsqueeze(-2), weight.unsqueeze(-2), bias, (1, _single(stride)[0]), pad,
                        (1, _single(dilation)[0]), groups)
    return out.squeeze(-2)


def choose_form(device: torch.device) -> Literal["matmul", "native"]:
    """The ``"auto"`` form of a convolution on ``device`` (the module docstring's rule)."""
    return "native"


_MATMUL = {nn.Conv1d: conv1d_matmul, nn.Conv2d: conv2d_matmul}


def _conv_forward(module: nn.Module, fn: Callable, form: Callable[[nn.Module, Tensor, Tensor], str]) -> Callable:
    """A ``_conv_forward`` of ``module`` that computes in the form ``form(module, input, weight)`` names."""
    native = type(module)._conv_forward.__get__(module)

    def forward(input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        if form(module, input, weight) != "matmul":
            return native(input, weight, bias)
        if module.padding_mode != "zeros":  # as torch: pad with the mode, then convolve without padding
            input = F.pad(input, module._reversed_padding_repeated_twice, mode=module.padding_mode)
            return fn(input, weight, bias, module.stride, 0, module.dilation, module.groups)
        return fn(input, weight, bias, module.stride, module.padding, module.dilation, module.groups)

    return forward


@contextlib.contextmanager
def conv_forms(net: nn.Module, form: Callable[[nn.Module, Tensor, Tensor], str]) -> Iterator[None]:
    """Inside, each ``nn.Conv1d`` / ``nn.Conv2d`` of ``net`` computes in the form ``form(module, input, weight)``
    returns (``"matmul"``: :func:`conv2d_matmul` / :func:`conv1d_matmul`; anything else: torch's own).

    The modules' ``_conv_forward`` is replaced on the instances and put back after, so the net is
    unchanged outside (a module that defines its own ``forward`` without ``_conv_forward`` computes as
    it always does). Nested uses on one net are fine (the inner one's form applies inside it).
    """
    replacements = []
    for module in net.modules():
        fn = next((f for base, f in _MATMUL.items()
                   if isinstance(module, base) and type(module)._conv_forward is base._conv_forward), None)
        if fn is not None:  # else not a Conv1d / Conv2d, or one that computes its own way
            replacements.append((module, _conv_forward(module, fn, form)))
    with instance_methods("_conv_forward", replacements):
        yield
