"""Mixed precision of a round: autocast on the clients' local steps, float32 for the rest of the round.

Lightning's ``MixedPrecision`` plugin (``--trainer.precision bf16-mixed`` / ``16-mixed``) runs all of
``training_step`` under ``torch.autocast`` (``Strategy.training_step`` enters the plugin's
``train_step_context``) and leaves the module in float32. In lfed one training step is a whole
round, so that would run the server's arithmetic in bfloat16 / float16 as well: the aggregate's
weighted sum, the server optimizer, the components' state (the products of attention
aggregation). Here:

* :func:`round_precision` (the driver's ``training_step`` runs inside it) switches the ambient
  autocast off for the round and remembers it;
* :func:`local_autocast` (the engine's client losses run inside it, both backends) switches it on
  again for the local step's forward pass and loss only. The backward runs outside it, as
  ``torch.autocast`` recommends: its operations take the dtypes autocast chose for the forward's,
  and the gradients come out in the weights' dtype.

So the clients' weights, their updates, the aggregate and the server's state stay float32 (the
weights' dtype), and only the local forward's eligible operations (matmuls, convolutions) run in
the lower precision. ``16-mixed`` is float16 without loss scaling (the local step is lfed's own SGD,
not a Lightning optimizer step, so Lightning's ``GradScaler`` never sees it): prefer ``bf16-mixed``.
Outside a round (a user's own ``torch.autocast`` around :meth:`CohortTrainer.train`, evaluation)
the ambient autocast applies as it is. :func:`precision_key` names the state, for the recorded
step's key (a graph recorded under autocast holds its casts).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch

__all__ = ["local_autocast", "precision_key", "release_loss_scaler", "round_precision"]

#: The device types whose autocast a round switches off and its local steps switch on again.
_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps")

#: ``((device type, dtype), ...)``: the autocast a round switched off (None outside a round, or with none on).
_REMEMBERED: ContextVar[tuple[tuple[str, torch.dtype], ...] | None] = ContextVar("lfed_local_autocast", default=None)


def _ambient() -> tuple[tuple[str, torch.dtype], ...]:
    return tuple((d, torch.get_autocast_dtype(d)) for d in _DEVICE_TYPES if torch.is_autocast_enabled(d))


@contextlib.contextmanager
def round_precision() -> Iterator[None]:
    """Inside: no autocast, except in the engine's local steps (:func:`local_autocast`), which get the one that
    was on when it was entered (none: nothing changes). Also a decorator: ``@round_precision()``."""
    ambient = _ambient()
    if not ambient:
        yield
        return
    token = _REMEMBERED.set(ambient)
    try:
        with contextlib.ExitStack() as stack:
            for device, _ in ambient:
                stack.enter_context(torch.autocast(device, enabled=False))
            yield
    finally:
        _REMEMBERED.reset(token)


@contextlib.contextmanager
def local_autocast() -> Iterator[None]:
    """Inside: the autocast :func:`round_precision` switched off, on again (outside a round: nothing changes)."""
    remembered = _REMEMBERED.get()
    if not remembered:
        yield
        return
    with contextlib.ExitStack() as stack:
        for device, dtype in remembered:  # as Lightning's MixedPrecision: no cache of cast weights
            stack.enter_context(torch.autocast(device, dtype=dtype, cache_enabled=False))
        yield


def precision_key() -> tuple:
    """The autocast a local step would run under here: the remembered one and the ambient one."""
    return _REMEMBERED.get(), _ambient()


def release_loss_scaler(trainer) -> str | None:
    """Take Lightning's ``GradScaler`` off the trainer's precision plugin (``16-mixed`` on a GPU); the message that says so.

    Lightning gives ``16-mixed`` a loss scaler that unscales and checks the gradients of its optimizer at
    every step. lfed's round has no such gradients (the local steps are lfed's own SGD; the server
    optimizer steps inside the round on the pseudo-gradient), so the scaler's first step fails ("Attempted
    unscale_ but _scale is None"). Without it the round runs as under ``bf16-mixed``: the local steps under
    float16 autocast, with no loss scaling; a gradient that overflows stops the run (non-finite updates),
    one that underflows is lost. None when the plugin has no scaler.
    """
    plugin = getattr(trainer, "precision_plugin", None)
    if getattr(plugin, "scaler", None) is None:
        return None
    plugin.scaler = None
    return (f"precision={getattr(plugin, 'precision', '16-mixed')}: Lightning's loss scaler is not used (lfed's local "
            "steps are its own SGD, the round has no loss for it to scale): the local steps run under float16 "
            "autocast without loss scaling, so small gradients can underflow; bf16-mixed has the range of float32")
