"""Local objectives (SPEC §2): plain, prox, scaffold, igfl, efl.

Each objective is an ``nn.Module`` whose per-client and server state are registered
buffers, so a Lightning checkpoint carries them. Before local training it turns its state
into a :class:`~lfed.engine.StepRule` for the whole cohort (one general step,
``w ← w - eta_l (grad_scale g + decay ⊙ w + shift)``); after local training it updates its
state from the clients' final weights. Nothing here loops over clients.

Per-client state is ``N × P`` numbers per tensor (``N`` clients, ``P`` trainable parameters),
held on the device in the module's state dict:

=========  =====================================================  ==========================
objective  state                                                  numbers
=========  =====================================================  ==========================
plain      none                                                   0
prox       none (``w_start`` is the broadcast model)              0
scaffold   ``c_k`` (``client_control``), ``c`` (``control``)      ``N·P + P``
igfl       ``Δw_k`` (module ``previous_update``), ``Δw_ps``       ``N·P + P``
           (module ``global_change``), kept by the module
efl        ``u_k``, ``v_k`` (``fisher_u``, ``fisher_v``) and      ``2·N·P + 2·P``
           their sums ``U``, ``V``
=========  =====================================================  ==========================

For example SCAFFOLD on :class:`~lfed.models.McMahanCIFARCNN` at its default 32×32 input
(P = 1,756,426) with 100 clients keeps ``c_k`` in 100 × 1,756,426 × 4 B ≈ 703 MB (670 MiB) in
float32, twice that in float64; at the paper's 24×24 crops (P = 1,068,298) it is ≈ 427 MB.
EFL keeps two such tensors (≈ 1.4 GB at 32×32), IGFL one. The MNIST 2NN (P = 199,210) with
100 clients needs ≈ 80 MB per tensor. A checkpoint carries all of it; loading one whose state
was made for another ``N`` or ``P`` fails with a :class:`ValueError` naming the buffer and both
shapes (:func:`check_state_shapes`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lfed.engine import StepRule

OBJECTIVES = ("plain", "prox", "scaffold", "igfl", "efl")


@dataclass
class Cohort:
    """The clients of one round, as the objectives see them.

    Attributes:
        round: Round index r (0-based).
        clients: ``[K]`` client ids.
        num_examples: ``[K]`` client sizes ``n_k``.
        step_budget: ``[K]`` planned local steps ``T_k``.
        steps_done: ``[K]`` completed local steps ``s_k`` (0 = inactive).
        num_clients: ``N``, all clients.
        previous_update: ``[K, P]`` each client's update from the last round it took part in
            (zeros if none), when an objective or the server asked for history.
        global_change: ``[P]`` ``w^r - w^{r-1}`` (zeros in round 0), with history.
    """

    round: int
    clients: Tensor
    num_examples: Tensor
    step_budget: Tensor
    steps_done: Tensor
    num_clients: int
    previous_update: Tensor | None = None
    global_change: Tensor | None = None

    @property
    def active(self) -> Tensor:
        """``[K]`` bool: clients that did any local work (``s_k > 0``)."""
        return self.steps_done > 0


FisherFn = Callable[[Tensor], Tensor]


def check_state_shapes(module: nn.Module, state_dict: Mapping[str, Any], prefix: str) -> None:
    """Refuse a state dict whose buffers of ``module`` have other shapes than ``module``'s own.

    Per-client state is ``[N, P]`` and server state ``[P]`` (``N`` clients, ``P`` parameters).
    A checkpoint made for another number of clients or another model cannot be resumed:
    copying it would fail deep inside ``load_state_dict``, or, worse, index the wrong clients.
    Call it from ``_load_from_state_dict`` (it looks only at ``module``'s direct buffers).

    Args:
        module: The module whose registered buffers are checked.
        state_dict: The state dict being loaded.
        prefix: ``module``'s key prefix in ``state_dict`` (e.g. ``"objective."``).

    Raises:
        ValueError: Naming the buffer, the checkpoint's shape and this module's shape.
    """
    wrong = []
    for name, buf in module._buffers.items():
        key = prefix + name
        if buf is None or key not in state_dict or not isinstance(state_dict[key], Tensor):
            continue
        got, want = tuple(state_dict[key].shape), tuple(buf.shape)
        if got != want:
            wrong.append(f"{key} has shape {got} in the checkpoint but {want} in this run")
    if wrong:
        raise ValueError(
            "the checkpoint's state does not fit this run: " + "; ".join(wrong) + ". Per-client state is "
            "[num_clients, num_params] and server state [num_params]: resume with the same data.num_clients "
            "and the same model (and objective) as the run that saved it."
        )


class LocalObjective(nn.Module):
    """Base class: the plain FedAvg objective, ``w ← w - eta_l g_k(w)``."""

    name = "plain"
    needs_history = False  # whether step_rule reads Cohort.previous_update / global_change

    def setup(self, num_clients: int, num_params: int, like: Tensor) -> None:
        """Allocate state for ``num_clients`` clients of ``num_params`` parameters like ``like``."""

    def step_rule(self, cohort: Cohort, w_start: Tensor, lr: float) -> StepRule:
        """The cohort's local step rule."""
        return StepRule()

    def after_local(self, cohort: Cohort, w_start: Tensor, w_end: Tensor, lr: float, fisher: FisherFn) -> None:
        """Update state from the cohort's final weights ``w_end`` ``[K, P]``; inactive clients keep theirs."""

    def _zeros(self, name: str, shape: tuple[int, ...], like: Tensor) -> None:
        self.register_buffer(name, torch.zeros(shape, dtype=like.dtype, device=like.device))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        check_state_shapes(self, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)


def _check_coefficient(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
    return float(value)


def _check_fisher_samples(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"fisher_samples: need an integer >= 1 (examples per client for the Fisher diagonal), got {value!r}")
    return int(value)


class Plain(LocalObjective):
    """FedAvg's local SGD (McMahan et al. 2017)."""


class Prox(LocalObjective):
    """FedProx (Li et al. 2020): ``w ← w - eta_l (g_k(w) + mu (w - w_start))``.

    Args:
        mu: Proximal coefficient, >= 0.
    """

    name = "prox"

    def __init__(self, mu: float = 0.01) -> None:
        super().__init__()
        self.mu = _check_coefficient("mu", mu)

    def step_rule(self, cohort: Cohort, w_start: Tensor, lr: float) -> StepRule:
        return StepRule(decay=self.mu, shift=-self.mu * w_start)


class Scaffold(LocalObjective):
    """SCAFFOLD, option II (Karimireddy et al. 2020; SPEC §2 scaffold).

    Step ``w ← w - eta_l (g_k(w) - c_k + c)``; after ``K`` steps
    ``c_k ← c_k - c + (w_start - w_end) / (K eta_l)`` and
    ``c ← c + (1/N) Σ_{k∈S} (c_k_new - c_k)`` (= ``|S|/N`` times the uniform mean).
    """

    name = "scaffold"

    def setup(self, num_clients: int, num_params: int, like: Tensor) -> None:
        self._zeros("control", (num_params,), like)
        self._zeros("client_control", (num_clients, num_params), like)

    def step_rule(self, cohort: Cohort, w_start: Tensor, lr: float) -> StepRule:
        return StepRule(shift=self.control - self.client_control[cohort.clients])

    def after_local(self, cohort: Cohort, w_start: Tensor, w_end: Tensor, lr: float, fisher: FisherFn) -> None:
        steps = cohort.steps_done.to(w_end.dtype).clamp_min(1)[:, None]
        old = self.client_control[cohort.clients]
        new = old - self.control + (w_start - w_end) / (steps * lr)
        change = torch.where(cohort.active[:, None], new - old, torch.zeros_like(new))
        self.client_control[cohort.clients] = old + change
        self.control += change.sum(0) / cohort.num_clients


class IGFL(LocalObjective):
    """IGFL-C (Huang et al., Algorithm 2 of 000; SPEC §2 igfl).

    Each step ``Δ_I = -eta_l g``, ``Δ_G = (1/|S|)(Δ_I - Δw_k / T) + Δw_ps / T``,
    ``w ← w + Δ_I + Δ_G``, i.e. the step rule with ``grad_scale = 1 + 1/|S|`` and
    ``shift = (Δw_k / |S| - Δw_ps) / (eta_l T_k)``. ``Δw_k`` (the client's update from the
    last round it took part in) and ``Δw_ps`` (the global model's last change) are kept by
    the module (``needs_history``).
    """

    name = "igfl"
    needs_history = True

    def step_rule(self, cohort: Cohort, w_start: Tensor, lr: float) -> StepRule:
        K = cohort.clients.numel()
        T = cohort.step_budget.to(w_start.dtype).clamp_min(1)[:, None]
        shift = (cohort.previous_update / K - cohort.global_change) / (lr * T)
        return StepRule(grad_scale=1.0 + 1.0 / K, shift=shift)


class EFL(LocalObjective):
    """EFL's Fisher-elastic objective (Ma et al., §3.1 of 004; SPEC §2 efl).

    Local objective ``f_k(w) + (λ/2) wᵀUw - λ wᵀV`` with ``U = Σ_i u_i``, ``V = Σ_i v_i`` over
    every client's latest report; step ``w ← w - eta_l (g + λ (U ⊙ w - V))``. After local
    work client k reports ``u_k = diag(F_k)`` at ``w_end`` and ``v_k = u_k ⊙ w_end``.

    Args:
        lam: Elastic coefficient λ, >= 0.
        fisher_samples: Examples per client for the empirical Fisher diagonal, >= 1.
    """

    name = "efl"

    def __init__(self, lam: float = 0.1, fisher_samples: int = 64) -> None:
        super().__init__()
        self.lam = _check_coefficient("efl_lambda", lam)
        self.fisher_samples = _check_fisher_samples(fisher_samples)

    def setup(self, num_clients: int, num_params: int, like: Tensor) -> None:
        self._zeros("fisher_u", (num_clients, num_params), like)
        self._zeros("fisher_v", (num_clients, num_params), like)
        self._zeros("fisher_u_sum", (num_params,), like)
        self._zeros("fisher_v_sum", (num_params,), like)

    def step_rule(self, cohort: Cohort, w_start: Tensor, lr: float) -> StepRule:
        if self.lam == 0:
            return StepRule()
        return StepRule(decay=self.lam * self.fisher_u_sum, shift=-self.lam * self.fisher_v_sum)

    def after_local(self, cohort: Cohort, w_start: Tensor, w_end: Tensor, lr: float, fisher: FisherFn) -> None:
        active = cohort.active
        if not bool(active.any()):
            return
        clients = cohort.clients[active]
        u = fisher(active)
        v = u * w_end[active]
        self.fisher_u_sum += (u - self.fisher_u[clients]).sum(0)
        self.fisher_v_sum += (v - self.fisher_v[clients]).sum(0)
        self.fisher_u[clients] = u
        self.fisher_v[clients] = v


def build_objective(name: str, mu: float = 0.01, efl_lambda: float = 0.1, fisher_samples: int = 64) -> LocalObjective:
    """The objective called ``name`` (one of :data:`OBJECTIVES`).

    ``mu``, ``efl_lambda`` and ``fisher_samples`` are checked whichever objective is built,
    so a bad value fails early even where it would not be used.

    Raises:
        ValueError: An unknown ``name``, ``mu`` or ``efl_lambda`` negative or not finite,
            ``fisher_samples`` not an integer >= 1.
    """
    _check_coefficient("mu", mu)
    _check_coefficient("efl_lambda", efl_lambda)
    _check_fisher_samples(fisher_samples)
    if name == "plain":
        return Plain()
    if name == "prox":
        return Prox(mu)
    if name == "scaffold":
        return Scaffold()
    if name == "igfl":
        return IGFL()
    if name == "efl":
        return EFL(efl_lambda, fisher_samples)
    raise ValueError(f"objective: {name!r} is not one of {OBJECTIVES}")
