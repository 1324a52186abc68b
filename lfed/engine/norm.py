"""BatchNorm inside the vmapped cohort: each client's running statistics as its own row, updated functionally.

torch's BatchNorm updates its running statistics in place, which ``vmap`` cannot do on buffers the
clients share, and it normalises over the whole ``[B, ...]`` batch, padding included. Inside the
vmap backend's step, :func:`batch_norms` makes every ``_BatchNorm`` of the net compute as
torch's does on the client's *valid* examples alone (the first ``c`` rows the loop backend
feeds it), reading the client's own statistics (the per-client buffers ``functional_call``
binds) and writing the updated ones into a dict instead of the buffers:

* training, batch statistics over the valid examples ``V`` and the spatial positions
  (``n = |V| · ∏ spatial``)::

      μ = Σ x / n,   σ² = Σ (x - μ)² / n,   y = (x - μ) / √(σ² + ε) · γ + β

* the running statistics (``track_running_stats``; torch's ``_BatchNorm.forward``): with
  ``t ← t + 1`` batches tracked, the factor ``f`` is ``momentum``, or ``1 / t`` with
  ``momentum=None`` (the cumulative average)::

      r_μ ← (1 - f) r_μ + f μ,   r_σ² ← (1 - f) r_σ² + f σ² n / (n - 1)

* evaluation mode with running statistics: ``y = (x - r_μ) / √(r_σ² + ε) · γ + β``.

The padding rows are normalised with the valid rows' statistics and weigh nothing in the loss,
so the gradients of the valid rows are the loop backend's. Every operation is a tensor
operation (no value read to the host), so the step can be recorded (:mod:`lfed.engine.recorded`).

A batch of one example at a BatchNorm layer without spatial extent (``BatchNorm1d`` on ``[B, C]``, a ``1x1`` map)
has one value per channel: torch (the loop backend) raises "Expected more than 1 value per channel when training",
and the formulas above would give ``σ² = 0`` and ``n / (n - 1) = ∞`` (``running_var`` NaN). The step cannot read
its batch's size without stopping the device, so a run refuses such a batch before round 0, on both backends alike
(:func:`check_batches_of_one`: a client whose examples leave a last batch of one).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from lfed.engine.patching import instance_methods

__all__ = ["batch_norms", "check_batches_of_one", "evaluating", "flat_batch_norms", "has_batch_norm", "has_running_stats",
           "running_stat_names"]


def has_running_stats(net: nn.Module) -> bool:
    """Whether ``net`` holds BatchNorm running statistics (per-client rows during local training)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats for m in net.modules())


def has_batch_norm(net: nn.Module) -> bool:
    """Whether ``net`` has any BatchNorm (its batch statistics must leave the padding rows out)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())


def running_stat_names(net: nn.Module) -> list[str]:
    """The qualified names of every BatchNorm's running statistics (``running_mean``, ``running_var``,
    ``num_batches_tracked``), in the net's order."""
    names = []
    for prefix, m in net.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            names += [f"{prefix}.{n}" if prefix else n for n, b in m.named_buffers(recurse=False) if b is not None]
    return names


@contextlib.contextmanager
def evaluating(net: nn.Module) -> Iterator[None]:
    """Inside, every module of ``net`` is in evaluation mode (``net.eval()``: BatchNorm reads its running statistics
    and updates none, dropout is off); after, each module is back in the mode it had (a frozen part left in ``eval()``
    by its owner stays so)."""
    modes = [(m, m.training) for m in net.modules()]
    net.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def flat_batch_norms(net: nn.Module, x: Tensor) -> list[str]:
    """The names of the BatchNorm layers of ``net`` whose input has no spatial extent (one value per channel and
    example: ``BatchNorm1d`` on ``[B, C]``, a ``1x1`` map), found by one forward of ``x`` (a few examples) in
    evaluation mode: nothing is written, and every module's mode is put back."""
    names = {module: name for name, module in net.named_modules() if isinstance(module, nn.modules.batchnorm._BatchNorm)}
    if not names:
        return []
    found: list[str] = []

    def seen(module, args):
        if args and isinstance(args[0], Tensor) and math.prod(args[0].shape[2:]) == 1 and names[module] not in found:
            found.append(names[module])

    hooks = [module.register_forward_pre_hook(seen) for module in names]
    try:
        with evaluating(net), torch.no_grad():
            net(x)
    finally:
        for hook in hooks:
            hook.remove()
    return found


def check_batches_of_one(net: nn.Module, x: Tensor, num_examples: Tensor, batch_size: int | None) -> None:
    """Refuse a client whose examples leave a batch of one (module docstring) when a BatchNorm layer of ``net`` has no
    spatial extent: the loop backend (torch) would raise mid-round, the vmap backend write NaN statistics.

    Each client walks its ``n_k`` examples in batches of ``B``, the last of ``n_k mod B`` (:func:`lfed.engine.batch_schedule`);
    every local epoch, fine-tuning's and a second training's too, ends with it. So a client with ``n_k mod B = 1`` (every
    client with ``B = 1``; with full batches, a client of one example) is refused, whatever the step budget.

    Args:
        net: The net (in any mode; one forward of ``x`` in evaluation mode finds the layers).
        x: A few inputs (two examples), as the net takes them.
        num_examples: ``[N]`` the clients' training sizes ``n_k`` (on the host).
        batch_size: ``B``, or None for full-batch steps.

    Raises:
        ValueError: One line naming ``batch_size``, the first such client, the layer and what to change.
    """
    if not has_batch_norm(net):
        return
    n = num_examples.detach().cpu().long()
    ones = (n == 1) if batch_size is None else (n > 0) & ((n % batch_size == 1) | (batch_size == 1))
    if not bool(ones.any()):
        return
    flat = flat_batch_norms(net, x)
    if not flat:
        return
    k = int(ones.nonzero()[0, 0])
    given = "full batches (batch_size None)" if batch_size is None else f"batch_size {batch_size}"
    more = f" ({int(ones.sum()) - 1} more client(s) too)" if int(ones.sum()) > 1 else ""
    raise ValueError(
        f"batch_size: with {given} client {k}'s {int(n[k])} examples leave a batch of one{more}, and BatchNorm layer "
        f"{flat[0]!r} has no spatial extent, so it would normalise one value per channel (torch: 'Expected more than 1 "
        "value per channel when training'); choose a batch_size that leaves no client a batch of one (n_k mod "
        "batch_size != 1), or a norm without batch statistics (GroupNorm, LayerNorm)")


def _forward(module: nn.modules.batchnorm._BatchNorm, prefix: str, mask: Tensor, out: dict[str, Tensor]):
    """A ``forward`` of ``module`` as the module docstring computes it (``mask [B]``: 1 for a valid example)."""

    def forward(x: Tensor) -> Tensor:
        module._check_input_dim(x)
        shape = [1, -1] + [1] * (x.dim() - 2)  # a [C] vector against [B, C, *spatial]
        dims = [0] + list(range(2, x.dim()))
        low = x.dtype in (torch.float16, torch.bfloat16)  # mixed precision: the statistics in float32, as torch's kernels
        xc = x.float() if low else x
        track = module.track_running_stats
        if module.training or not track:
            m = mask.to(xc.dtype).view([-1] + [1] * (x.dim() - 1))
            n = mask.to(xc.dtype).sum() * math.prod(x.shape[2:])
            mean = (xc * m).sum(dims) / n
            centred = xc - mean.view(shape)
            var = (centred * centred * m).sum(dims) / n
            y = centred * torch.rsqrt(var + module.eps).view(shape)
            if module.training and track:
                key = f"{prefix}." if prefix else ""
                # a second use in one forward continues from the first one's statistics, as torch's in-place update
                rm = out.get(key + "running_mean", module.running_mean)
                rv = out.get(key + "running_var", module.running_var)
                t = out.get(key + "num_batches_tracked", module.num_batches_tracked) + 1
                f = (1.0 / t.to(rm.dtype)) if module.momentum is None else module.momentum
                out[key + "running_mean"] = ((1 - f) * rm + f * mean.detach().to(rm.dtype))
                unbiased = var.detach() * (n / (n - 1))
                out[key + "running_var"] = ((1 - f) * rv + f * unbiased.to(rv.dtype))
                out[key + "num_batches_tracked"] = t
        else:
            y = (xc - module.running_mean.to(xc.dtype).view(shape)) * torch.rsqrt(
                module.running_var.to(xc.dtype) + module.eps).view(shape)
        if module.affine:
            y = y * module.weight.to(y.dtype).view(shape) + module.bias.to(y.dtype).view(shape)
        return y.to(x.dtype) if low else y

    return forward


@contextlib.contextmanager
def batch_norms(net: nn.Module, mask: Tensor, out: dict[str, Tensor]) -> Iterator[None]:
    """Inside, every ``_BatchNorm`` of ``net`` computes over the examples ``mask`` marks and writes its updated
    running statistics into ``out`` (``{qualified buffer name: value}``) instead of its buffers (module docstring).

    The modules' ``forward`` is replaced on the instances and put back after: outside, the net is unchanged.
    A BatchNorm reached twice in one forward updates its statistics twice, as torch's would.
    """
    with instance_methods("forward", [(module, _forward(module, prefix, mask, out)) for prefix, module in net.named_modules()
                                      if isinstance(module, nn.modules.batchnorm._BatchNorm)]):
        yield
