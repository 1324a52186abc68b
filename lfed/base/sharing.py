"""The sharing role's default: every coordinate of the flat model leaves the client (docs/algorithms.md §13).

The round (:mod:`lfed.core.round`) uploads, compresses, combines and server-steps through its sharing's methods. A
rule without a local part has :data:`SHARE_ALL`, whose every method is the identity; a personalized rule that keeps
part of the model on each client returns a :class:`lfed.personal.sharing.Sharing` from its ``make_sharing`` (the
same methods), so the core needs no import of the personalization package and has no branch of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from lfed.evaluation.amplification import server_amplification

__all__ = ["SHARE_ALL", "ShareAll", "resolve_sharing"]


class ShareAll:
    """The do-nothing sharing (:data:`SHARE_ALL`): every coordinate is shared, and each method is the identity.

    The sharing of every rule whose :meth:`~lfed.client.objectives.ClientRule.make_sharing` returns None (the
    default), with the methods of :class:`Sharing` the round calls.
    """

    def shared_sizes_of(self, sizes: Sequence[int]) -> list[int]:
        """``sizes``: every tensor travels whole."""
        return sizes

    def state_size(self, num_params: int, local: bool) -> int:
        """``P``: every component's rows are the whole model."""
        return num_params

    def shared(self, x: Tensor) -> Tensor:
        """``x`` itself."""
        return x

    def expand_shared(self, shared: Tensor) -> Tensor:
        """``shared`` itself (it is the whole update)."""
        return shared

    def keep_local(self, w_new: Tensor, w_old: Tensor) -> Tensor:
        """``w_new`` itself (there is no local part)."""
        return w_new

    def amplification(self, *args) -> Tensor | None:
        """The round's server amplification (:func:`lfed.evaluation.amplification.server_amplification`, same arguments)."""
        return server_amplification(*args)

    def __repr__(self) -> str:
        return "SHARE_ALL"


#: The sharing of a rule with no local part (:class:`ShareAll`).
SHARE_ALL = ShareAll()


def resolve_sharing(rule, net, layout) -> Any:
    """The round's sharing for ``net``: ``rule.make_sharing(net, layout)``, also kept as ``rule.sharing`` (where the
    rule reads it), or :data:`SHARE_ALL` when the rule returns None (every parameter shared)."""
    made = rule.make_sharing(net, layout)
    if made is None:
        return SHARE_ALL
    rule.sharing = made
    return made


