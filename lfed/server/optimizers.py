"""Server optimizers on the pseudo-gradient (docs/algorithms.md §4.4).

The server treats the combined client update ``Δ`` (docs/algorithms.md §4) as a
pseudo-gradient: lfed sets ``p.grad = -Δ`` on the global parameters and calls
``optimizer.step()`` once per round (:func:`apply_pseudo_gradient` does both).
Any ``torch.optim.Optimizer`` works:

* FedAvg: ``torch.optim.SGD(params, lr=1)`` gives ``w ← w + Δ``.
* FedAvgM (Hsu et al. 2019): ``torch.optim.SGD(params, lr=eta_s, momentum=β)``
  (``dampening=0``, ``nesterov=False``, the defaults). torch keeps
  ``b ← β b + g`` (``b = g`` on the first step) and moves ``w ← w - lr b``. With
  ``g = -Δ`` this is ``b = -v`` for docs/algorithms.md §4.4's ``v ← β v + Δ`` (``v`` starting at 0,
  so ``v = Δ`` on the first step as well) and ``w ← w + eta_s v``: the same
  rule, with torch's buffer holding ``-v``.
* FedAdam, FedYogi, FedAdagrad (Reddi et al. 2021, *Adaptive Federated
  Optimization*, Algorithm 2): the classes below. ``torch.optim.Adam`` is not
  FedAdam: it corrects bias and starts ``v`` at 0, so these are lfed's own.

Algorithm 2, with ``Δ = -p.grad``, ``m`` starting at 0 and ``v`` at ``τ²``, no
bias correction::

    m ← β1 m + (1 - β1) Δ
    v ← β2 v + (1 - β2) Δ²                      (FedAdam)
    v ← v - (1 - β2) Δ² sign(v - Δ²)            (FedYogi)
    v ← v + Δ²                                  (FedAdagrad)
    w ← w + lr m / (sqrt(v) + τ)

State lives in ``optimizer.state[p]`` (``"m"``, ``"v"``, ``"step"``), so
``state_dict()`` / ``load_state_dict()`` (and Lightning checkpoints) resume a
run exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from lfed.checks import number

__all__ = ["FedAdam", "FedYogi", "FedAdagrad", "apply_pseudo_gradient"]


def _check_lr(lr: Any) -> float:
    return number("lr", lr, above=0)


def _check_beta(name: str, beta: Any) -> float:
    return number(name, beta, at_least=0, below=1)


def _check_tau(tau: Any) -> float:
    return number("tau", tau, above=0)


def _check_initial(value: Any) -> float | None:
    return None if value is None else number("initial_accumulator_value", value, at_least=0, detail=" or None (tau**2)")


def _check_betas(betas: Any) -> tuple[float, float]:
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    return _check_beta("beta1", betas[0]), _check_beta("beta2", betas[1])


class _FedAdaptive(Optimizer):
    """Shared checks and step of Reddi et al. 2021, Algorithm 2; subclasses update ``v``.

    ``moments`` are the (checked) momentum settings of the subclass: ``betas`` or ``beta1``.
    """

    def __init__(self, params, lr: float, tau: float, initial_accumulator_value: float | None, **moments: Any) -> None:
        defaults = {"lr": _check_lr(lr), **moments, "tau": _check_tau(tau),
                    "initial_accumulator_value": _check_initial(initial_accumulator_value)}
        super().__init__(params, defaults)

    def _update_v(self, v: Tensor, delta_sq: Tensor, group: dict[str, Any]) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:  # type: ignore[override]
        """Apply one server round to every parameter that has a ``grad`` (``= -Δ``).

        Args:
            closure: Optional closure that re-evaluates a loss (torch API); its
                value is returned. Not used by lfed.

        Returns:
            The closure's loss, or ``None``.

        Raises:
            ValueError: If a gradient is sparse.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1: float = group["betas"][0] if "betas" in group else group["beta1"]
            tau: float = group["tau"]
            lr: float = group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError(f"{type(self).__name__} does not support sparse gradients")
                delta = -p.grad
                state = self.state[p]
                if len(state) == 0:
                    init = group["initial_accumulator_value"]
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["v"] = torch.full_like(
                        p, tau * tau if init is None else init, memory_format=torch.preserve_format
                    )
                m: Tensor = state["m"]
                v: Tensor = state["v"]
                m.mul_(beta1).add_(delta, alpha=1.0 - beta1)
                self._update_v(v, delta * delta, group)
                p.addcdiv_(m, v.sqrt().add_(tau), value=lr)
                state["step"] += 1
        return loss


class _WithBetas(_FedAdaptive):
    """FedAdam's and FedYogi's arguments: ``lr``, ``betas = (β1, β2)``, ``tau``, ``initial_accumulator_value``."""

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.99),
        tau: float = 1e-3,
        initial_accumulator_value: float | None = None,
    ) -> None:
        super().__init__(params, lr, tau, initial_accumulator_value, betas=_check_betas(betas))


class FedAdam(_WithBetas):
    """FedAdam (Reddi et al. 2021, Algorithm 2; docs/algorithms.md §4.4).

    With ``Δ = -p.grad``::

        m ← β1 m + (1 - β1) Δ
        v ← β2 v + (1 - β2) Δ²
        w ← w + lr m / (sqrt(v) + τ)

    ``m`` starts at 0 and ``v`` at ``τ²`` (``initial_accumulator_value``); no
    bias correction (unlike ``torch.optim.Adam`` and Flower's ``FedAdam``).

    Args:
        params: Parameters or parameter groups, as for any torch optimizer.
        lr: Server learning rate ``eta_s`` (> 0).
        betas: ``(β1, β2)``, each in ``[0, 1)``.
        tau: Adaptivity ``τ`` (> 0): added to ``sqrt(v)`` and, squared, the
            initial ``v``. 000 uses ``τ ∈ {0.1, 0.01}``.
        initial_accumulator_value: Initial ``v``; ``None`` (default) means
            ``τ²`` as in Algorithm 2. ``0`` reproduces Flower's initial state.

    Raises:
        ValueError: If an argument is outside the range given above.
    """

    def _update_v(self, v: Tensor, delta_sq: Tensor, group: dict[str, Any]) -> None:
        beta2: float = group["betas"][1]
        v.mul_(beta2).add_(delta_sq, alpha=1.0 - beta2)


class FedYogi(_WithBetas):
    """FedYogi (Reddi et al. 2021, Algorithm 2; docs/algorithms.md §4.4).

    As :class:`FedAdam` except the second moment::

        v ← v - (1 - β2) Δ² sign(v - Δ²)

    so ``v`` moves additively towards ``Δ²`` instead of multiplicatively
    (``sign(0) = 0``: no change where ``v == Δ²``).

    Args:
        params: Parameters or parameter groups.
        lr: Server learning rate ``eta_s`` (> 0).
        betas: ``(β1, β2)``, each in ``[0, 1)``.
        tau: Adaptivity ``τ`` (> 0).
        initial_accumulator_value: Initial ``v``; ``None`` means ``τ²``.

    Raises:
        ValueError: If an argument is outside the range given above.
    """

    def _update_v(self, v: Tensor, delta_sq: Tensor, group: dict[str, Any]) -> None:
        beta2: float = group["betas"][1]
        sign = torch.sign(v - delta_sq)
        v.addcmul_(delta_sq, sign, value=-(1.0 - beta2))


class FedAdagrad(_FedAdaptive):
    """FedAdagrad (Reddi et al. 2021, Algorithm 2; docs/algorithms.md §4.4).

    As :class:`FedAdam` except the second moment accumulates::

        v ← v + Δ²

    Algorithm 2 keeps the momentum ``m ← β1 m + (1 - β1) Δ`` for all three
    methods; the default ``beta1=0`` (``m = Δ``, plain server Adagrad) is
    Flower's ``FedAdagrad``, which fixes ``β1 = 0``.

    Args:
        params: Parameters or parameter groups.
        lr: Server learning rate ``eta_s`` (> 0).
        beta1: Momentum ``β1`` in ``[0, 1)``.
        tau: Adaptivity ``τ`` (> 0).
        initial_accumulator_value: Initial ``v``; ``None`` means ``τ²``.

    Raises:
        ValueError: If an argument is outside the range given above.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.01,
        beta1: float = 0.0,
        tau: float = 1e-3,
        initial_accumulator_value: float | None = None,
    ) -> None:
        super().__init__(params, lr, tau, initial_accumulator_value, beta1=_check_beta("beta1", beta1))

    def _update_v(self, v: Tensor, delta_sq: Tensor, group: dict[str, Any]) -> None:
        v.add_(delta_sq)


def apply_pseudo_gradient(
    optimizer: Optimizer, params: Sequence[Tensor], delta: Tensor | Sequence[Tensor]
) -> None:
    """Run one server round: set ``p.grad = -Δ`` on each parameter and step (docs/algorithms.md §4.4).

    Args:
        optimizer: Any torch optimizer over ``params``.
        params: The global model's trainable parameters, in flat-layout order
            (``named_parameters()`` order).
        delta: The combined update ``Δ`` as one flat vector of length
            ``P = sum(p.numel())``, or a sequence of tensors shaped like
            ``params``.

    Raises:
        ValueError: If ``delta`` does not match ``params`` in size or shape.
    """
    params = list(params)
    if isinstance(delta, Tensor):
        total = sum(p.numel() for p in params)
        if delta.dim() != 1 or delta.numel() != total:
            raise ValueError(
                f"delta must be a flat vector of length P={total}, got shape {tuple(delta.shape)}"
            )
        chunks = list(torch.split(delta, [p.numel() for p in params]))
    else:
        chunks = list(delta)
        if len(chunks) != len(params):
            raise ValueError(f"delta must hold {len(params)} tensors, got {len(chunks)}")
    for p, d in zip(params, chunks):
        if d.numel() != p.numel():
            raise ValueError(f"delta entry of shape {tuple(d.shape)} does not match parameter {tuple(p.shape)}")
        p.grad = (-d.detach()).reshape(p.shape).to(dtype=p.dtype, device=p.device)
    optimizer.step()
