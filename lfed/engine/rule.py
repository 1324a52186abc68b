"""The step rule: one local step ``w ← w - eta_l * (grad_scale * g + decay ⊙ w + shift)`` for K clients.

:class:`StepRule` holds the per-client or shared ``grad_scale``, ``decay`` and ``shift`` of an
objective; :class:`LossTerm` is its hook for objectives that change the loss instead of the step.
:func:`_apply_step_` applies the rule in place (the loop backend's non-plain step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from torch import Tensor


@dataclass
class LossTerm:
    """A term added to each example's loss, for objectives that change the loss, not the step (MOON, Ditto).

    ``fn(params, out, x, y, aux)`` gets one client's parameters (``{name: tensor}`` in the
    layout's order), the net's outputs ``out`` ``[B, ...]`` on the batch ``x``, ``y`` and the
    client's own row of ``aux``, and returns the term per example (``[B]``) or one value for the
    batch (added to every example). The engine adds it to the per-example loss before the masked
    mean, under ``vmap`` (the vmap backend) or per client (the loop backend), so ``g`` in the
    step rule is the gradient of the changed loss.

    A function of six arguments, ``fn(params, out, x, y, aux, model)``, also gets the net
    (:class:`lfed.engine.term.TermModel`): ``model.features`` is the current model's output of
    ``layer`` on the batch (e.g. the penultimate layer, MOON's representation), and
    ``model.represent(row, x)`` / ``model(row, x)`` run the same net with another flat ``[P]``
    parameter row (the global model, the client's previous model: rows of ``aux``).

    Attributes:
        fn: The term, written for one client (no cohort dimension).
        aux: A tensor or a dict of tensors, each ``[K, ...]``: per-client inputs of ``fn`` (e.g.
            the start weights, or another model's parameters); None if ``fn`` needs none.
        layer: The name of the submodule whose output ``model.features`` is (``"net.3"``); None: none.
    """

    fn: Callable[..., Tensor]
    aux: Tensor | dict[str, Tensor] | None = None
    layer: str | None = None

    @property
    def wants_model(self) -> bool:
        """Whether ``fn`` takes the sixth argument ``model``."""
        import inspect

        try:
            params = inspect.signature(self.fn).parameters.values()
        except (TypeError, ValueError):
            return False
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return len(positional) >= 6 or any(p.kind == p.VAR_POSITIONAL for p in params)

    def select(self, rows: Tensor | int | slice, num_clients: int) -> LossTerm:
        """The term of a subset of the K clients: the rows of ``aux``."""
        return replace(self, aux=_pick_rows(self.aux, rows, num_clients))

    def client(self, k: int) -> Tensor | dict[str, Tensor] | None:
        """Client ``k``'s row of ``aux``."""
        return _pick_rows(self.aux, k, None)


def term_per_example(extra, batch: int):
    """A loss term's value, checked: ``[B]`` (one value per example) or a scalar (one for the batch).

    The one rule of both backends (the vmap backend sees one client's view, the loop backend one
    client): any other shape, ``[B, 1]`` or ``[B, C]``, would broadcast against the ``[B]`` losses
    differently in each, so it is refused with one line naming the hook and the fix.
    """
    from torch import Tensor as _Tensor

    if not isinstance(extra, _Tensor) or extra.dim() == 0 or (extra.dim() == 1 and extra.shape[0] == batch):
        return extra
    shape = ", ".join("B" if i == 0 and n == batch else str(n) for i, n in enumerate(extra.shape))
    from lfed.checks import HookError

    raise HookError(f"loss_term: its function returned shape [{shape}] for a batch of B examples; return [B] "
                    "(one value per example) or a scalar (one value for the batch), e.g. .reshape(-1) or .sum(-1)")


def _pick_rows(aux, rows, num_clients: int | None):
    if aux is None:
        return None
    if isinstance(aux, dict):
        return {name: _pick_rows(a, rows, num_clients) for name, a in aux.items()}
    if num_clients is not None and aux.shape[0] != num_clients:
        raise ValueError(f"loss term: aux has {aux.shape[0]} rows for a cohort of {num_clients} clients")
    return aux[rows]


@dataclass
class StepRule:
    """The local step ``w ← w - lr * (grad_scale * g + decay ⊙ w + shift)`` for K clients.

    Attributes:
        grad_scale: A float, or ``[K]`` per client.
        decay: None, a float, ``[P]`` shared, or ``[K, P]`` per client.
        shift: None, ``[P]`` shared, or ``[K, P]`` per client.
        loss_term: None, or a :class:`LossTerm` added to each example's loss (``g`` is then the
            gradient of the changed loss).
        grad_mask: None, or ``[P]`` / ``[K, P]`` factors the gradient is multiplied by first, so
            ``g`` becomes ``grad_mask ⊙ g``: 0 freezes a coordinate against its gradient (FedRep trains
            its head with the body frozen, then the body with the head frozen).
        example_dp: None, or an :class:`lfed.engine.example_dp.ExampleNoise`: ``g`` is then example-level DP-SGD's
            gradient (Poisson batches, per-example clipping, noise, the expected batch as divisor), which the rule
            uses as it would the plain gradient.
    """

    grad_scale: float | Tensor = 1.0
    decay: float | Tensor | None = None
    shift: Tensor | None = None
    loss_term: LossTerm | None = None
    grad_mask: Tensor | None = None
    example_dp: Any = None

    def direction(self, g: Tensor, w: Tensor) -> Tensor:
        """The step direction for gradients ``g`` and weights ``w`` (both ``[K, P]`` or ``[P]``)."""
        return self.direction_(g.clone(), w)

    def direction_(self, g: Tensor, w: Tensor) -> Tensor:
        """:meth:`direction` in place: ``g`` (a fresh gradient) becomes the direction and is returned.

        The one implementation of the rule: training (:func:`_apply_step_`) and :meth:`direction` both run it.
        """
        if self.grad_mask is not None:
            g.mul_(self.grad_mask)
        scale = self.grad_scale
        if isinstance(scale, Tensor):
            g.mul_(scale[:, None] if scale.dim() == 1 and g.dim() == 2 else scale)
        elif scale != 1.0:
            g.mul_(scale)
        if self.decay is not None:
            if isinstance(self.decay, Tensor):
                g.addcmul_(self.decay, w)
            else:
                g.add_(w, alpha=self.decay)
        if self.shift is not None:
            g.add_(self.shift)
        return g

    def select(self, rows: Tensor | int, num_clients: int) -> StepRule:
        """The rule of a subset of the K clients (``rows`` indexes the cohort)."""

        def pick(x, per_client_dim):
            if isinstance(x, Tensor) and x.dim() == per_client_dim and x.shape[0] == num_clients:
                return x[rows]
            return x

        term = None if self.loss_term is None else self.loss_term.select(rows, num_clients)
        dp = None if self.example_dp is None else self.example_dp.select(rows, num_clients)
        return replace(self, grad_scale=pick(self.grad_scale, 1), decay=pick(self.decay, 2), shift=pick(self.shift, 2),
                       loss_term=term, grad_mask=pick(self.grad_mask, 2), example_dp=dp)


def _is_plain(rule: StepRule) -> bool:
    """Whether the rule is plain SGD (``w ← w - lr g``): no scale, decay or shift."""
    return (rule.decay is None and rule.shift is None and rule.grad_mask is None and not isinstance(rule.grad_scale, Tensor)
            and rule.grad_scale == 1.0)


def _apply_step_(w: Tensor, g: Tensor, rule: StepRule, lr: float) -> None:
    """``w ← w - lr * (scale g + decay ⊙ w + shift)`` in place; ``g`` (a fresh gradient) is overwritten.

    ``w`` and ``g`` are ``[K, P]`` (or ``[P]`` for one client), the rule's tensors broadcast
    against them as in :meth:`StepRule.direction` (whose in-place form this runs).
    """
    w.add_(rule.direction_(g, w), alpha=-lr)
