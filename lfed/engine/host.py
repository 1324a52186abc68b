"""Host values and the round's one read from the device (issue 37: no host synchronization inside a round).

Reading a number of a tensor on an accelerator (``.item()``, ``bool(t)``, ``float(t)``, ``.tolist()``,
a boolean mask, a blocking copy) waits until the device has run everything queued before it. A round
therefore keeps two kinds of values apart:

* **host values**: what is known on the host before anything goes to the device: the cohort's clients,
  sizes, step budgets and steps done, the aggregation weights of the built-in rules, the batch schedule.
  They live in CPU tensors; :func:`values` reads them as Python numbers (and refuses a tensor on an
  accelerator, so a device read cannot slip in as a host one). Every input check of the round runs on them.
* **device values**: the trained weights, losses, the aggregate, the round's metrics. They stay on the
  device; :func:`to_device` moves host tensors there without waiting (``non_blocking``), and
  :func:`read_metrics` brings the round's scalar metrics and its finiteness flags to the host in ONE
  transfer, where they are logged.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

__all__ = ["device_rows", "read_metrics", "to_device", "values"]


def values(t: Tensor) -> list:
    """The numbers of a host (CPU) tensor as a Python list (a 0-dim tensor: a Python number); no device read.

    Raises:
        ValueError: If ``t`` is on an accelerator: reading it would synchronize the device; a round's
            host values are made on the host (:mod:`lfed.engine.host`).
    """
    if t.device.type != "cpu":
        raise ValueError(f"a host value was asked of a tensor on {t.device}: reading it would wait for the device; "
                         "keep the host copy (lfed.engine.host) and read that")
    return t.tolist()


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """``t`` on ``device`` without waiting for the device (a host tensor's copy is queued, ``non_blocking``)."""
    return t.to(device, non_blocking=True)


def device_rows(mask: Tensor, device: torch.device) -> Tensor:
    """The positions where the host ``[K]`` bool ``mask`` is True, as a long tensor on ``device``.

    Indexing a device tensor with it gives what indexing with the mask gives, without the device read
    a boolean mask costs (its ``nonzero`` runs on the host).
    """
    if mask.device.type != "cpu":
        raise ValueError(f"mask: a host (CPU) mask is needed, got one on {mask.device}")
    return to_device(mask.nonzero().flatten(), device)


def read_metrics(metrics: dict[str, Any], flags: dict[str, Tensor] | None = None) -> tuple[dict[str, float], dict[str, bool]]:
    """The round's metrics and flags on the host, read in one transfer.

    Args:
        metrics: ``{name: value}``; values are Python numbers or 0-dim tensors (on any device).
        flags: ``{name: 0-dim bool tensor}`` (e.g. "the client updates are finite"), read with them.

    Returns:
        ``({name: float}, {name: bool})``: every metric as a float (NaN stays NaN) and every flag.
    """
    flags = flags or {}
    names = [k for k, v in metrics.items() if isinstance(v, Tensor)]
    tensors = [metrics[k].detach().reshape(()) for k in names] + [f.detach().reshape(()) for f in flags.values()]
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, Tensor)}
    read_flags: dict[str, bool] = {}
    if tensors:
        device = tensors[0].device
        stacked = torch.stack([t.to(device=device, dtype=torch.float64, non_blocking=True) for t in tensors])
        got = stacked.tolist()  # the one read
        for k, v in zip(names, got):
            out[k] = v
        for k, v in zip(flags, got[len(names):]):
            read_flags[k] = bool(v) and not math.isnan(v)
    return {k: out[k] for k in metrics}, read_flags
