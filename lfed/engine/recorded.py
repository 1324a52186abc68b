"""The recorded step: the vmap backend's local step recorded once per shape and replayed.

:class:`RecordedStep` (a part of :class:`~lfed.engine.CohortTrainer`) records the eager
vmapped step with ``torch.fx`` ``make_fx`` the first time it sees a key (shapes, dtypes,
device, train/eval mode, the convolutions' form setting, autocast), checks the recording bit
for bit against the eager step, and replays it afterwards; models with hooks, and steps on part
of a cohort, run eagerly.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_leaves

from lfed.engine.precision import precision_key


def _has_hooks(net: nn.Module) -> bool:
    """Whether any module hook (global, or of ``net`` or a submodule) would run in a forward/backward."""
    from torch.nn.modules import module as m

    for name in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks", "_global_backward_pre_hooks"):
        if getattr(m, name, None):
            return True
    return any(
        mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks or getattr(mod, "_backward_pre_hooks", None)
        for mod in net.modules()
    )


def _leaves(out) -> list[Tensor]:
    """Every tensor of a step's output (gradients, loss, and a BatchNorm net's updated statistics)."""
    return [t for t in tree_leaves(out) if isinstance(t, Tensor)]


def _rng_state(device: torch.device):
    cpu = torch.get_rng_state()
    return cpu, (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


class RecordedStep:
    """The recording fast path of the vmap backend's local step (a part of :class:`~lfed.engine.CohortTrainer`).

    Uses the trainer's ``net``, ``trace``, ``_traced`` (the cache of recordings by key),
    ``_vmapped`` (the eager step) and ``_conv_setting()`` (the convolutions' form, part of the key).
    """

    def _step(self, params, x, y, mask, buffers, whole: bool, stats: bool = False):
        """One vmapped local step: the recorded graph when there is one for these inputs, else eager.

        ``stats``: a net with BatchNorm (``_vmapped_stats``: per-row buffers in, ``(gradients, (loss, statistics))`` out).
        """
        vmapped = self._vmapped_stats if stats else self._vmapped
        if not (whole and self.trace):
            return vmapped(params, x, y, mask, buffers)
        key = (stats,
            tuple((k, tuple(v.shape), v.dtype) for k, v in params.items()),
            tuple(x.shape), x.dtype, tuple(y.shape), y.dtype, mask.dtype, x.device,
            tuple((k, tuple(b.shape), b.dtype) for k, b in buffers.items()), self.net.training,
            self._conv_setting(), precision_key(),
        )
        fn = self._traced.get(key)
        if fn is not None and not _has_hooks(self.net):
            return fn(params, x, y, mask, buffers)
        if fn is not None or key in self._traced or _has_hooks(self.net):
            return vmapped(params, x, y, mask, buffers)
        return self._record(key, params, x, y, mask, buffers, vmapped)

    def _record(self, key, params, x, y, mask, buffers, vmapped):
        """Record the step for ``key`` and check it against the eager step; return the eager result."""
        from torch.fx.experimental.proxy_tensor import make_fx

        def step(params, x, y, mask, buffers):
            return vmapped(params, x, y, mask, buffers)

        rng = _rng_state(x.device)
        expected = vmapped(params, x, y, mask, buffers)
        after = _rng_state(x.device)
        try:
            _set_rng_state(rng, x.device)
            graph = make_fx(step)(params, x, y, mask, buffers)
            _set_rng_state(rng, x.device)
            got = graph(params, x, y, mask, buffers)
            same = all(torch.equal(a, b) for a, b in zip(_leaves(expected), _leaves(got)))
        except Exception:  # noqa: BLE001 - anything make_fx cannot record runs eagerly
            graph, same = None, False
        _set_rng_state(after, x.device)
        if len(self._traced) >= 16:  # a bounded cache: shapes change rarely (chunks, datasets)
            self._traced.pop(next(iter(self._traced)))
        self._traced[key] = graph if same else None
        return expected
