"""FedBN (Li, Jiang, Zhang, Kamp, Dou 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", Algorithm 1; docs/algorithms.md §13).

Every client keeps its normalization layers: their parameters (BatchNorm's, GroupNorm's,
LayerNorm's, InstanceNorm's affine ``γ, β``) and their running statistics (``running_mean``,
``running_var``, ``num_batches_tracked``); everything else is aggregated as FedAvg's. The
parameters are the local part of :class:`lfed.personal.local_part.LocalPartRule` (partial
sharing). The running statistics are one more per-client row (``stats``, float64, the statistics
of every norm layer flattened; the constructed net's statistics until a client first trains), handed
to the engine as each client's start buffers and read back from its final buffers. Both backends
train them (under ``vmap`` each client's statistics are its own row, :mod:`lfed.engine.norm`). Personalized model
of client ``k``: the global model with the client's norm parameters and statistics. The global
model's own norm parameters stay at the initial model's; its statistics are the usual weighted
average of the cohort's (as for any net with running statistics).

    model:
      algorithm: fedbn
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lfed.personal.local_part import LocalPartRule
from lfed.personal.sharing import NORM_TYPES, Sharing, norm_parameter_names
from lfed.state.spec import GLOBAL, StateSpec


class FedBN(LocalPartRule):
    """FedBN (module docstring): no arguments; the net's normalization layers are the local part."""

    name = "fedbn"

    def __init__(self) -> None:
        super().__init__(None)
        self._stats: list[tuple[str, torch.Size, torch.dtype]] = []
        self._initial: Tensor | None = None

    def structure(self) -> dict:
        return {"local": "normalization layers"}

    def make_sharing(self, net, layout) -> Sharing:
        names = norm_parameter_names(net)
        if not names:
            raise ValueError(
                f"objective: FedBN keeps the normalization layers local, but the net ({type(net).__name__}) has no "
                "trainable normalization layer (BatchNorm, GroupNorm, LayerNorm, InstanceNorm with affine parameters); "
                "use FedPer (algorithm: fedper, objective init_args local: [...]) to keep other layers local"
            )
        stats = []
        for prefix, module in net.named_modules():
            if isinstance(module, NORM_TYPES):
                for n, b in module.named_buffers(recurse=False):
                    if b is not None:
                        stats.append((f"{prefix}.{n}" if prefix else n, b.shape, b.dtype))
        self._stats = stats
        own = dict(net.named_buffers())
        self._initial = (torch.cat([own[n].detach().reshape(-1).to(torch.float64) for n, _, _ in stats])
                         if stats else None)
        return Sharing(layout, names)

    @property
    def stats_size(self) -> int:
        """Numbers of the running statistics of every norm layer (0: none)."""
        return sum(math.prod(shape) for _, shape, _ in self._stats)

    def state_specs(self) -> list[StateSpec]:
        specs = super().state_specs()
        if self.stats_size:
            specs.append(StateSpec("stats", shape=(self.stats_size,), init=GLOBAL, dtype=torch.float64))
        return specs

    def _stat_rows(self, clients: Tensor) -> Tensor:
        initial = self._initial.to(clients.device)
        return self.rows("stats", clients, first=initial)

    def _unflatten(self, rows: Tensor) -> dict[str, Tensor]:
        out, lo = {}, 0
        for name, shape, dtype in self._stats:
            n = math.prod(shape)
            out[name] = rows[:, lo : lo + n].reshape(rows.shape[0], *shape).to(dtype)
            lo += n
        return out

    def start_buffers(self, cohort) -> dict[str, Tensor] | None:
        if not self.stats_size:
            return None
        return self._unflatten(self._stat_rows(cohort.clients))

    def after_local(self, cohort, w_start, w_end, lr, local) -> None:
        super().after_local(cohort, w_start, w_end, lr, local)
        if self.stats_size:
            if local.buffers is None:
                raise RuntimeError("FedBN: the engine returned no per-client buffers for a net with running statistics")
            flat = torch.cat([local.buffers[n].reshape(cohort.clients.numel(), -1).to(torch.float64)
                              for n, _, _ in self._stats], 1)
            self.write_rows("stats", cohort.clients, flat, mask=cohort.active)

    def personal_rows(self, clients: Tensor, w: Tensor, local):
        rows = super().personal_rows(clients, w, local)
        if not self.stats_size:
            return rows
        return rows, self._unflatten(self._stat_rows(clients))
