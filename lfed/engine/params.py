"""Flat parameter vectors: the one representation lfed's client and server maths share.

A model's trainable parameters, in ``named_parameters()`` order, are flattened into one
vector of length ``P``. A cohort of ``K`` clients is a ``[K, P]`` tensor and per-client state
of ``N`` clients an ``[N, P]`` tensor, so aggregation, attention, control variates and
compression are plain tensor algebra. :class:`ParamLayout` converts between the two views;
``unflatten`` returns views (no copy) and works under ``torch.func.vmap``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class ParamLayout:
    """Names, shapes and offsets of a model's trainable parameters in the flat vector."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]

    @classmethod
    def from_module(cls, module: nn.Module) -> ParamLayout:
        """Layout of ``module``'s parameters that require grad, in ``named_parameters()`` order."""
        named = [(n, p.shape) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(f"net: {type(module).__name__} has no trainable parameters to federate")
        names, shapes = zip(*named)
        return cls(tuple(names), tuple(torch.Size(s) for s in shapes))

    @property
    def sizes(self) -> list[int]:
        """Number of entries of each parameter tensor (for per-tensor operations)."""
        return [math.prod(s) for s in self.shapes]

    @property
    def num_params(self) -> int:
        """``P``, the length of the flat vector."""
        return sum(self.sizes)

    def flatten(self, tensors: Mapping[str, Tensor]) -> Tensor:
        """``{name: [*lead, *shape]}`` -> ``[*lead, P]`` (the leading dims must agree)."""
        parts = []
        for name, shape in zip(self.names, self.shapes):
            t = tensors[name]
            lead = t.shape[: t.dim() - len(shape)]
            parts.append(t.reshape(*lead, -1))
        return torch.cat(parts, dim=-1)

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """``[*lead, P]`` -> ``{name: [*lead, *shape]}`` as views of ``flat``."""
        if flat.shape[-1] != self.num_params:
            raise ValueError(f"flat: last dimension {flat.shape[-1]} != number of parameters {self.num_params}")
        lead = flat.shape[:-1]
        out = {}
        for name, shape, chunk in zip(self.names, self.shapes, flat.split(self.sizes, dim=-1)):
            out[name] = chunk.reshape(*lead, *shape)
        return out

    def module_vector(self, module: nn.Module) -> Tensor:
        """The flat vector of ``module``'s current parameters (a copy)."""
        params = dict(module.named_parameters())
        return self.flatten({n: params[n].detach() for n in self.names})

    def load_into(self, module: nn.Module, flat: Tensor) -> None:
        """Copy the flat vector into ``module``'s parameters in place."""
        params = dict(module.named_parameters())
        with torch.no_grad():
            for name, value in self.unflatten(flat).items():
                params[name].copy_(value)
