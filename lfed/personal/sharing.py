"""Partial sharing: which coordinates of the flat model leave the client (docs/algorithms.md §13).

A personalized method that keeps part of the model on each client (FedPer's and FedRep's head,
FedBN's normalization layers) names its *local* parameters by name patterns (``fnmatch`` globs
over ``named_parameters()`` names, e.g. ``"fc2.*"``) or by module type. :class:`Sharing` turns
that into a split of the flat vector ``[P]`` (:class:`~lfed.engine.params.ParamLayout`) into a shared
part ``[P_s]`` and a local part ``[P_l]``, whole tensors each, in the layout's order. The round
(:mod:`lfed.core.round`) then trains every client from the global shared part and its own local part,
and uploads, compresses, counts bits for, combines and server-steps the shared part only; the local
part is per-client state of the rule and never leaves the client.

A rule without a local part has :data:`~lfed.base.sharing.SHARE_ALL` (:class:`~lfed.base.sharing.ShareAll`, the
round's default, in :mod:`lfed.base.sharing`), the do-nothing sharing: every coordinate is shared, and each of its
methods is the identity. The round calls the same methods on
either, so it has no branch of its own for partial sharing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from lfed.base.sharing import SHARE_ALL, ShareAll, resolve_sharing  # noqa: F401 (their 0.4 home)
from lfed.checks import name_matches
from lfed.engine.params import ParamLayout

__all__ = ["SHARE_ALL", "ShareAll", "Sharing", "norm_parameter_names", "resolve_sharing"]

#: Module types whose parameters are normalization parameters (FedBN).
NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm)


class Sharing:
    """The split of the flat vector into shared and local coordinates.

    Args:
        layout: The model's :class:`~lfed.engine.params.ParamLayout`.
        local: Names of the local parameters (each a name of ``layout``).

    Attributes:
        local_names, shared_names: The parameter names of each part, in the layout's order.
        local_mask: ``[P]`` bool, True at local coordinates.
        shared_index, local_index: ``[P_s]`` / ``[P_l]`` positions of each part in the flat vector.
        shared_sizes: Entries of each shared tensor (the channel compresses per tensor).
    """

    def __init__(self, layout: ParamLayout, local: Iterable[str]) -> None:
        local = set(local)
        unknown = sorted(local - set(layout.names))
        if unknown:
            raise ValueError(f"local: {unknown} are not trainable parameters of the net ({list(layout.names)})")
        self.layout = layout
        self.local_names = tuple(n for n in layout.names if n in local)
        self.shared_names = tuple(n for n in layout.names if n not in local)
        if not self.local_names:
            raise ValueError("local: no parameter is local; a personalized method with partial sharing needs at least one")
        if not self.shared_names:
            raise ValueError(f"local: every parameter of the net is local ({list(layout.names)}); nothing would be "
                             "shared and the server would learn nothing. Keep some parameters global")
        parts = [torch.full((size,), name in local) for name, size in zip(layout.names, layout.sizes)]
        self.local_mask = torch.cat(parts)
        self.local_index = self.local_mask.nonzero().squeeze(1)
        self.shared_index = (~self.local_mask).nonzero().squeeze(1)
        self.shared_sizes = [s for n, s in zip(layout.names, layout.sizes) if n not in local]

    @classmethod
    def from_patterns(cls, layout: ParamLayout, patterns: Sequence[str], argument: str = "local") -> Sharing:
        """The split whose local parameters match any of ``patterns`` (``fnmatch`` globs over parameter names).

        Raises:
            ValueError: Naming ``argument`` when a pattern matches no parameter, or when the
                patterns match every parameter or none.
        """
        if isinstance(patterns, str):
            patterns = [patterns]
        if not patterns:
            raise ValueError(f"{argument}: give at least one parameter-name pattern of the local part "
                             f"(parameters: {list(layout.names)})")
        local = []
        for pattern in patterns:
            if not isinstance(pattern, str):
                raise ValueError(f"{argument}: patterns are strings (parameter-name globs), got {pattern!r}")
            local += name_matches(argument, list(layout.names), pattern, "trainable parameter of the net")
        if set(local) == set(layout.names):
            raise ValueError(f"{argument}: {list(patterns)} match every parameter of the net ({list(layout.names)}); "
                             "nothing would be shared. Keep some parameters global")
        return cls(layout, local)

    @property
    def num_local(self) -> int:
        """``P_l``, the local coordinates."""
        return int(self.local_index.numel())

    @property
    def num_shared(self) -> int:
        """``P_s``, the shared coordinates."""
        return int(self.shared_index.numel())

    def _at(self, index: Tensor, x: Tensor) -> Tensor:
        return index if index.device == x.device else index.to(x.device)

    def shared(self, x: Tensor) -> Tensor:
        """The shared coordinates of ``x`` (``[..., P]`` -> ``[..., P_s]``)."""
        return x.index_select(-1, self._at(self.shared_index, x))

    def local(self, x: Tensor) -> Tensor:
        """The local coordinates of ``x`` (``[..., P]`` -> ``[..., P_l]``)."""
        return x.index_select(-1, self._at(self.local_index, x))

    def merge(self, w: Tensor, local: Tensor) -> Tensor:
        """``[K, P]``: the global ``w [P]`` (or ``[K, P]``) with each row's local coordinates replaced by ``local [K, P_l]``."""
        out = w.expand(local.shape[0], -1).clone()
        out[:, self._at(self.local_index, out)] = local.to(out.dtype)
        return out

    def expand_shared(self, shared: Tensor) -> Tensor:
        """``[P]`` zeros with the shared coordinates set from ``shared [P_s]`` (an update of the shared part)."""
        out = shared.new_zeros(self.layout.num_params)
        out[self._at(self.shared_index, out)] = shared
        return out

    def keep_local(self, w_new: Tensor, w_old: Tensor) -> Tensor:
        """``w_new`` with its local coordinates those of ``w_old`` (the server never moves the local part)."""
        out = w_new.clone()
        at = self._at(self.local_index, out)
        out[at] = w_old[at].to(out.dtype)
        return out

    # ------------------------------------------------------------------ what the round asks of a sharing
    def shared_sizes_of(self, sizes: Sequence[int]) -> list[int]:
        """Entries of each tensor that travels (:attr:`shared_sizes`; ``sizes``, the whole model's, are not read)."""
        return self.shared_sizes

    def state_size(self, num_params: int, local: bool) -> int:
        """A component's ``"P"``: ``P_l`` for the rule that keeps the local part (``local``), ``P_s`` for the rest."""
        return self.num_local if local else self.num_shared

    def amplification(self, *args) -> None:
        """None: the server amplification (:func:`lfed.evaluation.amplification.server_amplification`) is not defined on the shared
        part (the step rule's shift is over every coordinate)."""
        return None


def norm_parameter_names(net: nn.Module) -> list[str]:
    """Names of the trainable parameters of ``net``'s normalization layers (BatchNorm, GroupNorm, LayerNorm, ...)."""
    out = []
    for prefix, module in net.named_modules():
        if isinstance(module, NORM_TYPES):
            out += [f"{prefix}.{n}" if prefix else n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
    return out
