"""What a loss term may ask of the model besides its outputs: a representation, and other parameter rows.

A :class:`~lfed.engine.rule.LossTerm` whose function takes a sixth argument gets a
:class:`TermModel` of the net it trains (MOON's contrastive term, Ditto-like distances on
representations): the current model's representation at the term's ``layer`` on the batch
(:attr:`TermModel.features`, captured from the forward pass the loss already makes), and the
same net run with other parameters, a flat ``[P]`` row (the round's global model, the client's
previous model, carried in the term's ``aux``) or a ``{name: tensor}`` dict, with no second copy
of the net (:meth:`TermModel.represent`, :meth:`TermModel.__call__`). It works under ``vmap``
(the vmap backend: one client's view) and with plain autograd (the loop backend).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torch.func import functional_call

__all__ = ["TermModel"]


class TermModel:
    """The net of a loss term (module docstring).

    Attributes:
        features: The current model's output of ``layer`` on the batch; reading it for a term without a
            ``layer`` raises a :class:`~lfed.checks.HookError` that names the fix.
    """

    def __init__(self, net: nn.Module, layout: Any, buffers: dict[str, Tensor], layer: str | None) -> None:
        self.net, self.layout, self.buffers, self.layer = net, layout, buffers, layer
        self._features: Tensor | None = None

    @property
    def features(self) -> Tensor:
        if self.layer is None:
            from lfed.checks import HookError

            names = [n for n, _ in self.net.named_modules() if n]
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            raise HookError("loss_term: model.features is the output of the term's layer, and the LossTerm names none; "
                            f"give it one: LossTerm(fn, aux, layer='<submodule>') (this net's submodules: {shown})")
        return self._features

    @features.setter
    def features(self, value: Tensor | None) -> None:
        self._features = value

    def _params(self, weights: Tensor | dict[str, Tensor]) -> dict[str, Tensor]:
        return weights if isinstance(weights, dict) else self.layout.unflatten(weights)

    def __call__(self, weights: Tensor | dict[str, Tensor], x: Tensor) -> Tensor:
        """The net's outputs on ``x`` with ``weights`` (a flat ``[P]`` row or a parameter dict)."""
        return functional_call(self.net, (self._params(weights), self.buffers), (x,))

    def represent(self, weights: Tensor | dict[str, Tensor], x: Tensor) -> Tensor:
        """The output of ``layer`` on ``x`` with ``weights`` (a flat ``[P]`` row or a parameter dict)."""
        return self.forward(self._params(weights), x)[1]

    def forward(self, params: dict[str, Tensor], x: Tensor) -> tuple[Tensor, Tensor | None]:
        """``(outputs, output of layer)`` of one forward pass with ``params`` (the layer's is None without one)."""
        if self.layer is None:
            return functional_call(self.net, (params, self.buffers), (x,)), None
        try:
            module = self.net.get_submodule(self.layer)
        except AttributeError:
            names = [n for n, _ in self.net.named_modules() if n]
            raise ValueError(f"loss term: layer {self.layer!r} is not a submodule of the net; its submodules: {names}") from None
        seen: list[Tensor] = []
        handle = module.register_forward_hook(lambda m, inputs, output: seen.append(output))
        try:
            out = functional_call(self.net, (params, self.buffers), (x,))
        finally:
            handle.remove()
        return out, seen[-1]
