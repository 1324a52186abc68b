"""The channel between clients and server as a component of the round (docs/algorithms.md §7).

:class:`Dense` sends updates as they are (32 bits per entry). :class:`TernaryTopK` is EFL's
sparse ternary compression with error-feedback residuals both ways: each client keeps a
residual ``R_k`` (per-client state) and sends ``ST(R_k + Δ_k)``; the server keeps ``R_G``
(server state) and broadcasts ``ST(R_G + Δ)``, which is what the model moves by.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lfed.base.component import Cohort, Component
from lfed.base.declaration import Declaration, Supports
from lfed.engine.host import device_rows
from lfed.server import compression as c
from lfed.state.spec import StateSpec

__all__ = ["Channel", "Dense", "TernaryTopK"]


class Channel(Component):
    """Base class: a dense channel (the identity both ways)."""

    name = "dense"
    sparsity: float | None = None

    @property
    def declares(self) -> Declaration:
        """``Supports(exact=...)``: whether the server receives each update and the clients the combined update exactly
        as they are (no compression, no residual carried into later rounds), as DP-FedAvg's clipping needs: True where
        :meth:`upstream` and :meth:`downstream` are this class's identities (a subclass may declare it itself).
        ``Channel`` itself is the dense channel, defined asynchronously; a subclass that says nothing is not."""
        exact = type(self).upstream is Channel.upstream and type(self).downstream is Channel.downstream
        ready = True if type(self) is Channel else "is not defined asynchronously; use ternary or none"
        return Declaration(supports=Supports(asynchronous=ready, exact=exact))

    def upstream(self, updates: Tensor, cohort: Cohort, sizes: Sequence[int]) -> Tensor:
        """What the counting clients send (``[K, P]``; rows of clients that do not count are unused)."""
        return updates

    def downstream(self, delta: Tensor, sizes: Sequence[int]) -> Tensor:
        """What the server broadcasts for the combined update ``delta``: the model moves by it."""
        return delta

    def bits(self, sizes: Sequence[int]) -> int:
        """Bits of one upload or one broadcast of a model of tensor ``sizes``."""
        return c.dense_bits(sizes)


class Dense(Channel):
    """Updates travel uncompressed."""

    declares = Declaration(supports=Supports(asynchronous=True, exact=True))


class TernaryTopK(Channel):
    """EFL's ST compression with residuals up and down (004 Algorithm 2; docs/algorithms.md §7).

    Args:
        sparsity: Fraction ``q`` in (0, 1] of each tensor's entries kept.
    """

    name = "ternary"
    declares = Declaration(supports=Supports(asynchronous=True, exact=False))

    def __init__(self, sparsity: float = 0.1) -> None:
        super().__init__()
        self.sparsity = c.validate_sparsity(sparsity)

    def check(self, context) -> list[str]:
        if getattr((context.components or {}).get("asynchronous"), "mixing", None) is not None:
            raise ValueError("asynchronous: channel: FedAsync mixes the client's model w_k into the server's, but a client "
                             "can only compress its update w_k - w^v against the model version v it started from; use "
                             "FedBuff or no compression")
        if float(self.sparsity) >= 1.0:
            return ["compression=1.0 keeps every entry but ternary compression is not the identity: each entry "
                    "becomes ±mean|x| of its tensor (docs/algorithms.md §7); set channel: false for dense updates (null keeps the preset's q)"]
        return []

    def structure(self) -> dict:
        return {"sparsity": self.sparsity}

    def state_specs(self) -> list[StateSpec]:
        return [StateSpec("client_residual"), StateSpec("server_residual", per_client=False)]

    def upstream(self, updates: Tensor, cohort: Cohort, sizes: Sequence[int]) -> Tensor:
        sent = torch.zeros_like(updates)
        counting = device_rows(cohort.host_values().counting, updates.device)  # rows, not a mask: no device read
        ids = cohort.clients[counting.to(cohort.clients.device)]
        out, residual = c.compress_with_residual(updates[counting], self.rows("client_residual", ids), sizes, self.sparsity)
        sent[counting] = out
        self.write_rows("client_residual", ids, residual)
        return sent

    def downstream(self, delta: Tensor, sizes: Sequence[int]) -> Tensor:
        out, residual = c.compress_with_residual(delta, self.state("server_residual"), sizes, self.sparsity)
        self.set_state("server_residual", residual)
        return out

    def bits(self, sizes: Sequence[int]) -> int:
        return c.ternary_bits(sizes, self.sparsity)
