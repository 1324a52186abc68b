"""Distributed DP with the Skellam mechanism over simulated secure aggregation (docs/privacy.md "Distributed DP
(Skellam)", docs/algorithms.md §18).

Agarwal, Kairouz, Liu, *The Skellam Mechanism for Differentially Private Federated Learning* (NeurIPS 2021), their
Algorithm 1 (the distributed Skellam mechanism with secure aggregation). In each round every counting client

1. clips its update to L2 norm ``C``: ``x̃ = x · min(1, C/‖x‖)``;
2. flattens it with a randomized Hadamard rotation ``R x = H D x / √d`` (``d`` the next power of two ≥ P, ``x``
   zero-padded, ``D`` random signs shared by the round, seeded; ``H`` the Sylvester-Hadamard matrix), which spreads
   the norm over the coordinates so that modular clipping rarely wraps (Algorithm 1, as in Kairouz, Liu, Steinke
   2021); the rotation is orthonormal, so L2 norms are kept;
3. scales by ``s`` and rounds to integers by **conditional randomized rounding** (each coordinate ``⌊y⌋`` or
   ``⌊y⌋ + 1`` with probability ``y - ⌊y⌋``, redrawn until the rounded vector's L2 norm is at most
   ``Δ̃₂ = min(sC + √d, sqrt((sC)² + d/4 + √(2 ln(1/β)) (sC + √d/2)))``: the sensitivity the accountant uses);
4. adds its own noise share ``Sk(μ/m)``: per coordinate ``Poisson(μ/(2m)) - Poisson(μ/(2m))`` (variance ``μ/m``; the
   Skellam is closed under summation, so ``m`` shares sum to ``Sk(μ)``, variance ``μ``);
5. uploads it through secure aggregation (:func:`lfed.privacy.secagg.modular_sum`) in ``Z_M``, ``M = 2^bits``, where a
   sum outside ``[-M/2, M/2)`` wraps around (modular clipping).

The server decodes the sum to the signed range, divides by ``s``, rotates back (``Rᵀ``), keeps the first ``P``
coordinates and divides by the expected cohort ``m`` (a fixed denominator). ``μ = (z·C·s)²``: the central noise has
standard deviation ``z·C`` in the update's units, as DP-FedAvg's.

**The accountant.** One round is the multi-dimensional Skellam mechanism on the (integer) sum of the survivors'
rounded updates. Its Rényi DP at order α, for a total Skellam variance ``μ`` and sensitivities ``Δ₂`` (L2) and ``Δ₁``
(L1) in the integer domain (the paper's RDP bound for the multi-dimensional Skellam mechanism, a copy of the authors'
accounting code numbers it Corollary 4.1; the number is not checked against the paper's text here. The paper writes it
for ``Sk(λ, λ) = Poisson(λ) - Poisson(λ)``, variance ``2λ``: ``αΔ₂²/(4λ) + min(((2α-1)Δ₂² + 6Δ₁)/(16λ²), 3Δ₁/(4λ))``;
below is the same with ``μ = 2λ``, as the authors' code ``_skellam_rdp``, google-research
``federated/distributed_dp/accounting_utils.py``, computes it):

    ε(α) ≤ α Δ₂² / (2μ) + min( ((2α - 1) Δ₂² + 6 Δ₁) / (4μ²),  3 Δ₁ / (2μ) )

with ``Δ₁ = min(√d Δ₂, Δ₂²)`` (integer coordinates: ``|v_i| ≤ v_i²``). The rounds compose (RDP adds up) and
dp-accounting's ``compute_epsilon`` converts to (ε, δ). **No amplification by subsampling**: in secure aggregation the
server draws and sees the cohort, so the sampling is not hidden from it; every round is counted at ``q = 1`` (an
upper bound whatever the sampler). **Dropouts and small cohorts are accounted honestly**: a round's noise is that of
the shares that reached the sum, ``μ_t = k_t · μ/m`` with ``k_t`` the counting clients that did not drop (the server
knows who survived), so a round with fewer shares than planned is accounted at its smaller variance. A round in which
no client's upload reaches the sum releases nothing that depends on the data and costs nothing (counted apart, as
``empty``). Under ``target_epsilon`` the server, which learns who survived before it unmasks, does not unmask a sum whose
surviving noise would take the ledger past the budget: that round releases nothing and costs nothing, and the run stops
(so the realised ε never exceeds the budget, whatever the dropouts).

**The sampler.** Each share is ``Poisson(μ/(2m)) - Poisson(μ/(2m))`` drawn by torch, which is exact only for rates up to
:data:`MAX_RATE`: the derived scale keeps the rate below it, and a given scale above it is refused before round 0.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import Tensor

from lfed.base.component import each_once
from lfed.base.declaration import Declaration, Releases, Supports, declaration
from lfed.checks import integer, number
from lfed.privacy.accountant import budget_stop, smallest_multiplier
from lfed.privacy.dp_fedavg import check_neighbours
from lfed.privacy.secagg import _modulus, counting_rows, modular_sum, survivors, to_signed
from lfed.rng import NOISE_MODES, PrivateStreams, round_generator
from lfed.server.combination import ServerCombination

__all__ = ["DistributedDP", "SkellamAccountant", "conditional_rounding", "hadamard", "rotate", "rounded_l2_bound",
           "skellam_epsilon", "skellam_noise", "skellam_rdp", "unrotate"]

#: Rényi orders (integers, as the authors' accountant uses them).
ORDERS = tuple(range(2, 129)) + (160, 192, 256, 512, 1024)
#: The sum's standard deviations kept inside the range when the scale is derived (the authors' ``k = 3``).
K_STDDEVS = 3.0
#: The largest Poisson rate a noise share is drawn at (2^32 ≈ 4.3e9). torch's Poisson sampler (numpy's PTRS, Hörmann
#: 1993, in float64) accepts a draw by comparing ``-λ + k log λ - log Γ(k+1)``, a sum of terms of size ``λ log λ`` whose
#: true value is O(1): its rounding error is ~``λ log λ · 2^-52`` (2e-5 at 2^32, 0.07 at 1e13, and above 2^53 the draws
#: are not even integers; above 2^63 torch returns INT64_MIN, so the two draws cancel and a share carries no noise at all).
#: Below this rate the draws' mean, variance and parity are Poisson's (tests/privacy/test_distributed_dp.py); a derived
#: scale stays below it, a given one above it is refused. Large ``bits`` then buy room against wrap-around, not resolution.
MAX_RATE = float(2 ** 32)


# ---------------------------------------------------------------------- the rotation
def hadamard(x: Tensor) -> Tensor:
    """``H x`` over the last dimension (a power of two), ``H`` the Sylvester-Hadamard matrix (entries ±1, ``H² = d I``):
    the fast Walsh-Hadamard transform, ``O(d log d)``, its butterflies in place on one copy (no new tensor per level)."""
    d = x.shape[-1]
    if d & (d - 1):
        raise ValueError(f"hadamard: the last dimension must be a power of two, got {d}")
    lead = x.shape[:-1]
    y = x.reshape(-1, d).clone()
    h = 1
    while h < d:
        v = y.view(-1, d // (2 * h), 2, h)
        top, bottom = v[:, :, 0, :], v[:, :, 1, :]
        a = top.clone()
        top.add_(bottom)  # a + b
        torch.sub(a, bottom, out=a)  # a - b
        bottom.copy_(a)
        h *= 2
    return y.reshape(*lead, d)


def _signs(d: int, seed: int, round: int) -> Tensor:
    g = round_generator(seed, round, "ddp-rotation")
    return torch.randint(0, 2, (d,), generator=g, dtype=torch.long).double() * 2 - 1


def rotate(x: Tensor, d: int, seed: int, round: int) -> Tensor:
    """``R x = H D x / √d`` of rows ``x [K, P]`` zero-padded to ``d`` (float64): orthonormal, ``‖R x‖ = ‖x‖``."""
    padded = torch.nn.functional.pad(x.double(), (0, d - x.shape[-1]))
    return hadamard(padded * _signs(d, seed, round)) / math.sqrt(d)


def unrotate(y: Tensor, P: int, seed: int, round: int) -> Tensor:
    """``Rᵀ y = D H y / √d``, the first ``P`` coordinates: the inverse of :func:`rotate`."""
    d = y.shape[-1]
    return (hadamard(y.double()) * _signs(d, seed, round) / math.sqrt(d))[..., :P]


# ---------------------------------------------------------------------- rounding and noise
def rounded_l2_bound(c: float, d: int, beta: float) -> float:
    """``Δ̃₂ = min(c + √d, sqrt(c² + d/4 + √(2 ln(1/β)) (c + √d/2)))`` (``c + √d`` when β = 0): the L2 norm that
    conditional randomized rounding keeps a vector of norm ``c`` in ``d`` dimensions under (the conditional randomized
    rounding of Kairouz, Liu, Steinke 2021, as the authors' ``rounded_l2_norm_bound`` computes it); the first term
    holds always, the second with probability ≥ 1 - β per draw (a row above it is redrawn)."""
    first = c + math.sqrt(d)
    if beta == 0:
        return first
    second = math.sqrt(c * c + d / 4 + math.sqrt(2 * math.log(1 / beta)) * (c + math.sqrt(d) / 2))
    return min(first, second)


def conditional_rounding(y: Tensor, bound: float, generator: torch.Generator, tries: int = 1000,
                         exempt: Tensor | None = None) -> Tensor:
    """Rows of ``y [K, d]`` rounded to integers (float64): ``⌊y⌋ + Bernoulli(y - ⌊y⌋)``, each row redrawn until its
    L2 norm is at most ``bound`` (rows in ``exempt`` are rounded once, unchecked). Raises after ``tries`` draws."""
    low = torch.floor(y)
    frac = y - low
    out = low + (torch.rand(y.shape, generator=generator, dtype=torch.float64) < frac).double()
    check = torch.ones(len(y), dtype=torch.bool) if exempt is None else ~exempt.bool()
    for _ in range(tries):
        bad = check & (torch.linalg.vector_norm(out, dim=1) > bound)
        if not bool(bad.any()):
            return out
        redraw = low[bad] + (torch.rand(frac[bad].shape, generator=generator, dtype=torch.float64) < frac[bad]).double()
        out[bad] = redraw
    raise RuntimeError(f"conditional rounding: a row's norm stayed above {bound:.6g} after {tries} draws")


def skellam_noise(shape: tuple[int, ...], variance: float, generator: torch.Generator) -> Tensor:
    """``Sk`` of ``variance`` per entry: ``Poisson(variance/2) - Poisson(variance/2)`` (float64 integers). Refuses a rate
    ``variance/2`` above :data:`MAX_RATE`, where the sampler is not exact (and above 2^63 returns no noise at all)."""
    if variance <= 0:
        return torch.zeros(shape, dtype=torch.float64)
    if not variance / 2 <= MAX_RATE:
        raise ValueError(f"skellam_noise: a Poisson rate of {variance / 2:.4g} is above {MAX_RATE:.4g}, where torch's "
                         "sampler is not exact (it returns no noise at all above 2^63); use a smaller scale")
    rate = torch.full(shape, variance / 2, dtype=torch.float64)
    return torch.poisson(rate, generator=generator) - torch.poisson(rate, generator=generator)


# ---------------------------------------------------------------------- the accountant
def skellam_rdp(alpha: float, mu: float, l2: float, l1: float) -> float:
    """``ε(α) = α Δ₂²/(2μ) + min(((2α-1)Δ₂² + 6Δ₁)/(4μ²), 3Δ₁/(2μ))`` (module docstring; ``μ`` the total variance,
    ``Δ₂ = l2``, ``Δ₁ = l1``, all in the integer domain; inf without noise)."""
    if mu <= 0:
        return math.inf
    return alpha * l2 ** 2 / (2 * mu) + min(((2 * alpha - 1) * l2 ** 2 + 6 * l1) / (4 * mu ** 2), 3 * l1 / (2 * mu))


@functools.lru_cache(maxsize=256)
def _rdp_vector(mu: float, l2: float, l1: float) -> tuple[float, ...]:
    return tuple(skellam_rdp(a, mu, l2, l1) for a in ORDERS)


def skellam_epsilon(events: dict[tuple[float, float, float], int], delta: float) -> float:
    """ε(δ) of the composition of ``{(μ, Δ₂, Δ₁): rounds}`` (RDP vectors added, dp-accounting's ``compute_epsilon``)."""
    live = [(key, n) for key, n in events.items() if n > 0]
    if not live:
        return 0.0
    if any(key[0] <= 0 for key, _ in live):
        return math.inf
    import numpy as np
    from dp_accounting.rdp import rdp_privacy_accountant

    total = np.zeros(len(ORDERS))
    for key, n in live:
        total += n * np.asarray(_rdp_vector(*key))
    return float(rdp_privacy_accountant.compute_epsilon(ORDERS, total, delta)[0])


class SkellamAccountant:
    """The ledger of a distributed-DP run: ``{(μ_t, Δ₂, Δ₁): rounds}`` (no sampling: every round at q = 1), and the
    rounds that released nothing data-dependent (no client's upload reached the sum: ``empty``; they cost nothing)."""

    def __init__(self) -> None:
        self.events: dict[tuple[float, float, float], int] = {}
        self.empty = 0

    @property
    def rounds(self) -> int:
        return sum(self.events.values())

    def step(self, mu: float, l2: float, l1: float) -> None:
        key = (float(mu), float(l2), float(l1))
        self.events[key] = self.events.get(key, 0) + 1

    def epsilon(self, delta: float) -> float:
        return skellam_epsilon(self.events, delta)

    def state_dict(self) -> dict[str, Any]:
        return {"events": [[*key, n] for key, n in sorted(self.events.items())], "empty": self.empty}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.events = {(float(a), float(b), float(c)): int(n) for a, b, c, n in state["events"]}
        self.empty = int(state.get("empty", 0))  # (0.5's checkpoints did not count them)


# ---------------------------------------------------------------------- the combination
class DistributedDP(ServerCombination):
    """Distributed DP with Skellam noise and simulated secure aggregation (module docstring).

    Args:
        noise_multiplier: ``z > 0``: the central noise's standard deviation in units of ``C`` (``μ = (z C s)²``,
            each of the expected ``m`` clients adds ``μ/m``); None with ``target_epsilon``: calibrated before round 0.
        target_epsilon: A budget. With ``noise_multiplier: null``, ``z`` is first calibrated (bisection to 0.1%) to the
            smallest whose ε(δ) after the run's rounds (every share arriving) is within it; with a given ``z``, a cap. In
            both, the realised ε never exceeds it: the run stops before a round that would spend more with every share
            arriving, and the server does not unmask a round whose surviving shares would (:meth:`combine`).
        clip: The L2 clip ``C > 0``.
        bits: ``M = 2^bits`` of the modular sum (2..52, default 20).
        scale: ``s``; None (default): the largest with ``2^bits ≥ 2·3·sqrt(s²(K²C²/d + z²C²) + K/4)`` (three standard
            deviations of the sum's coordinates inside the range, the authors' choice ``k = 3``; ``K`` the largest cohort)
            and each noise share's Poisson rate ``(zCs)²/(2m)`` at most :data:`MAX_RATE` (``m`` the smallest planned
            cohort), where the sampler is exact; a given scale above that rate is refused before round 0.
        beta: ``β`` in [0, 1) of conditional rounding (default ``e^{-1/2}``; 0: the bound ``sC + √d``, no redraws).
        delta: ``δ`` in (0, 1) (default ``1/N^1.1``).
        dropout: Probability in [0, 1) that a client drops after masking; accounted (module docstring).
        noise: ``seeded`` (default) or ``secure``, as :class:`~lfed.privacy.DPFedAvg`'s.
        log_unaccounted: As :class:`~lfed.privacy.DPFedAvg`'s.
        masks: True (default): secure aggregation draws and cancels every pair's mask (``O(K² d)`` a round); False: the
            survivors' residues are summed directly, the same sum exactly (:func:`lfed.privacy.secagg.modular_sum`).
    """

    name = "distributed_dp"

    def __init__(self, noise_multiplier: float | None = 1.0, clip: float = 1.0, bits: int = 20, scale: float | None = None,
                 beta: float = math.exp(-0.5), delta: float | None = None, dropout: float = 0.0,
                 noise: str = "seeded", log_unaccounted: bool = False, masks: bool = True,
                 target_epsilon: float | None = None) -> None:
        super().__init__()
        if not isinstance(masks, bool):
            raise ValueError(f"masks: must be true or false, got {masks!r}")
        self.masks = masks
        if target_epsilon is not None:
            number("target_epsilon", target_epsilon, above=0)
        elif noise_multiplier is None:
            raise ValueError("noise_multiplier: give a noise multiplier z > 0, or target_epsilon to calibrate it")
        if noise_multiplier is not None:
            number("noise_multiplier", noise_multiplier, above=0)
        self.noise_multiplier = None if noise_multiplier is None else float(noise_multiplier)  # None: calibrated before round 0
        self.target_epsilon = target_epsilon
        self._calibrate = noise_multiplier is None
        self.clip = number("clip", clip, above=0)
        self.bits = integer("bits", bits, at_least=2)
        if bits > 52:  # the rotation, the rounding and the noise run in float64, exact for integers below 2^53
            raise ValueError(f"bits: at most 52 for distributed DP (its rounding and noise are computed in float64, whose "
                             f"integers are exact only below 2^53), got {bits}")
        self.M = _modulus(bits)
        self.scale = None if scale is None else number("scale", scale, above=0)
        self.beta = number("beta", beta, at_least=0, below=1)
        self.delta = None if delta is None else number("delta", delta, above=0, below=1)
        self.dropout = number("dropout", dropout, at_least=0, below=1)
        if noise not in NOISE_MODES:
            raise ValueError(f"noise: {noise!r} is not one of {NOISE_MODES}")
        if not isinstance(log_unaccounted, bool):
            raise ValueError(f"log_unaccounted: must be true or false, got {log_unaccounted!r}")
        self.noise, self.log_unaccounted = noise, log_unaccounted
        self.streams = PrivateStreams(noise)
        self._given = {"noise_multiplier": self.noise_multiplier, "clip": self.clip, "bits": bits, "scale": self.scale,
                       "beta": self.beta, "delta": self.delta, "dropout": self.dropout, "noise": noise, "masks": masks,
                       "target_epsilon": target_epsilon}
        self._d: int | None = None  # the padded dimension (the shared coordinates rounded up to a power of two)
        self.k_max: int | None = None
        self.m_min: float | None = None  # the smallest planned cohort (the noise shares' rate is (zCs)²/(2m))
        self._halt: str | None = None  # the server refused to unmask a round that would overspend: the run stops
        self.accountant = SkellamAccountant()
        self._report: dict[str, float] = {}

    @property
    def declares(self) -> Declaration:  # type: ignore[override]
        """It releases its noised sum every round; its private metrics are ε, the settings, the dropouts (drawn
        independently of the data) and the decoded noised sum's share of the range (post-processing of the release);
        it guards the run's metrics; it is not defined asynchronously."""
        private = ("privacy/epsilon", "privacy/noise_multiplier", "privacy/clip", "secagg/dropped", "secagg/unmasked",
                   "secagg/max_abs_fraction_of_range", "final/privacy_*")
        return Declaration(releases=Releases(every_round=True, private_metrics=private,
                                             metric_policy="mark" if self.log_unaccounted else "drop"),
                           supports=Supports(asynchronous="masks and noises one synchronous cohort; use a synchronous schedule"))

    def hparams(self) -> dict:
        return dict(self._given)

    # ------------------------------------------------------------------ before round 0
    def check(self, context) -> list[str]:
        """Refuse DP-FedAvg's neighbours (no Poisson requirement: no amplification by sampling); fix δ; check bits."""
        self._resolve(context)
        return []

    def _resolve(self, context) -> None:
        check_neighbours(context, "distributed DP", poisson=False)
        roles = context.components or {}
        self.streams = PrivateStreams(self.noise, getattr(context, "run_key", ""))
        for c in each_once(roles.values()):
            if declaration(c).releases.dp_shares:
                raise ValueError(f"{getattr(c, 'name', c)}: its own noised releases (dp_shares) are accounted by "
                                 "DP-FedAvg's Gaussian accountant only; use combination: dp_fedavg with it")
        if context.num_clients is not None and self.delta is None:
            self.delta = 1.0 / context.num_clients ** 1.1
        if context.cohort_sizes:
            self.k_max = max(context.cohort_sizes)
            self.m_min = float(min(context.cohort_sizes))
            if (self.M / (2 * K_STDDEVS)) ** 2 <= self.k_max / 4:
                raise ValueError(f"bits: {self.bits} bits cannot hold the rounding noise of {self.k_max} clients "
                                 f"within {K_STDDEVS:g} standard deviations; give more bits")
        if getattr(context, "shared_params", None):
            self._d = 1 << max(0, (int(context.shared_params) - 1).bit_length())
        if self.target_epsilon is not None and self._calibrate:
            if not context.cohort_sizes:
                raise ValueError("target_epsilon: calibrating the noise needs the run's rounds (trainer.max_steps > 0)")
            if self._d is None:
                raise ValueError("target_epsilon: calibrating distributed DP's noise needs the model's size (a run "
                                 "gives it); give noise_multiplier instead")
            self.noise_multiplier = self.calibrate(self.target_epsilon, len(context.cohort_sizes))
            self._calibrated_over = len(context.cohort_sizes)  # said before round 0 (start_notice)
            if self._given["scale"] is None:
                self.scale = self.derive_scale(self.k_max, self._d)
        if self._given["scale"] is not None and self.noise_multiplier is not None:
            self.check_rate(self._given["scale"], self.m_min or 1.0)

    def check_rate(self, s: float, m: float) -> None:
        """Refuse a scale at which a noise share's Poisson rate ``(zCs)²/(2m)`` is above :data:`MAX_RATE`."""
        rate = (self.noise_multiplier * self.clip * s) ** 2 / (2 * m)
        if not rate <= MAX_RATE:
            top = math.sqrt(2 * m * MAX_RATE) / (self.noise_multiplier * self.clip)
            places = 5 - math.floor(math.log10(top))  # six significant digits, rounded down (a value that is allowed)
            top = math.floor(top * 10 ** places) / 10 ** places
            raise ValueError(f"scale: {s:.6g} draws each of the {m:g} noise shares at Poisson rate {rate:.4g}, above "
                             f"{MAX_RATE:.4g} where the sampler is exact; give scale <= {top:.6g} or scale: null")

    def event(self, z: float, s: float, arrived: tuple[float, float] | None = None) -> tuple[float, float, float]:
        """``(μ, Δ₂, Δ₁)`` of a round at multiplier ``z`` and scale ``s`` in the padded dimension: ``μ = (z C s)²``, or with
        ``arrived = (k, m)`` the ``k`` of ``m`` shares that reached the sum, ``k μ / m``; ``Δ₂`` the conditional
        rounding's bound and ``Δ₁ = min(√d Δ₂, Δ₂²)`` (integer coordinates)."""
        d = self._d
        l2 = rounded_l2_bound(self.clip * s, d, self.beta)
        mu = (z * self.clip * s) ** 2
        if arrived is not None:
            mu = arrived[0] * mu / arrived[1]
        return (mu, l2, min(math.sqrt(d) * l2, l2 * l2))

    def scale_for(self, z: float) -> float:
        """The scale at multiplier ``z``: the setting, or derived for ``z``, the largest and smallest cohorts and the
        padded dimension."""
        return self._given["scale"] if self._given["scale"] is not None else self.derive_scale(self.k_max or 1, self._d, z)

    def calibrate(self, target: float, rounds: int) -> float:
        """The smallest ``z`` (bisection to 0.1%) whose ε(δ) after ``rounds`` full rounds is at most ``target``."""
        return smallest_multiplier(lambda z: skellam_epsilon({self.event(z, self.scale_for(z)): rounds}, self.delta),
                                   target, f"target_epsilon: {target} cannot be reached in {rounds} rounds at delta "
                                           f"{self.delta:.3g}, even with noise multiplier 1e4")

    @property
    def depends_on_total_rounds(self) -> bool:
        """``z`` calibrated for the run's rounds (``target_epsilon`` without ``noise_multiplier``)."""
        return self._calibrate

    def stop_before(self, round: int, cohort_size: int, num_clients: int) -> str | None:
        """Stop before a round that would spend more than ``target_epsilon`` with every share arriving, or after a round
        whose surviving shares would have spent more, and which the server therefore did not unmask (:meth:`combine`)."""
        if self._halt is not None:
            return self._halt
        if self.target_epsilon is None or self.delta is None or self._d is None:
            return None
        z = self.noise_multiplier
        key = self.event(z, self.scale if self.scale is not None else self.scale_for(z))
        events = dict(self.accountant.events)
        events[key] = events.get(key, 0) + 1
        after = skellam_epsilon(events, self.delta)
        if after <= self.target_epsilon:  # (the spent ε only when the line is written)
            return None
        return budget_stop(round, after, self.target_epsilon, self.delta, self.accountant.rounds,
                           self.accountant.epsilon(self.delta))

    def derive_scale(self, k: int, d: int, z: float | None = None, m: float | None = None) -> float:
        """The largest ``s`` with ``2^bits ≥ 2·k_σ·sqrt(s² (K² C²/d + z² C²) + K/4)`` and ``(zCs)²/(2m) ≤`` :data:`MAX_RATE`
        (the ``scale`` setting's rule; ``m`` the smallest planned cohort, default :attr:`m_min`, else 1)."""
        room = (self.M / (2 * K_STDDEVS)) ** 2 - k / 4
        if room <= 0:
            raise ValueError(f"bits: {self.bits} bits cannot hold the rounding noise of {k} clients; give more bits")
        C = self.clip
        z = self.noise_multiplier if z is None else z
        m = m if m is not None else (self.m_min or 1.0)
        return min(math.sqrt(room / (k * k * C * C / d + z * z * C * C)), math.sqrt(2 * m * MAX_RATE * (1 - 1e-9)) / (z * C))  # (a hair below)

    def start_notice(self) -> str:
        """At start-up: a calibrated noise multiplier (before round 0), where the noise comes from, the accounting."""
        where = "secure (the operating system's randomness)" if self.streams.secure else "seeded from the run's seed"
        rounds = getattr(self, "_calibrated_over", None)
        calibrated = ("" if rounds is None else f"distributed DP noise multiplier z = {self.noise_multiplier:.4g}, "
                      f"calibrated for target_epsilon {self.target_epsilon:g} at delta {self.delta:.3g} over {rounds} rounds\n")
        return calibrated + (f"distributed DP: Skellam noise shares and masks {where}; every round accounted at q = 1 "
                             "(no amplification)")

    # ------------------------------------------------------------------ one round
    def combine(self, updates, weights, cohort, *, noisy: Tensor | None = None, skip_noise: bool = False,
                unclipped: Tensor | None = None):
        """Δ from ``updates [K, P]`` (module docstring). ``noisy [K]`` bool: which counting rows add a noise share
        (default all; the audit's canaries add none); ``skip_noise``: no share is drawn, but the accountant counts
        them (a planted leak); ``unclipped [K]`` bool: rows neither clipped nor norm-checked (a planted leak)."""
        K, P = updates.shape
        host = cohort.host_values()
        _, idx = counting_rows(cohort, K)
        m = float(cohort.expected_size)
        d = self._d = 1 << max(0, (P - 1).bit_length())
        if self.scale is None:
            self.scale = self.derive_scale(self.k_max or max(len(idx), 1), d, m=min(m, self.m_min or m))
        s, C, z = self.scale, self.clip, self.noise_multiplier
        x = updates.detach().double().cpu()[idx]
        free = (torch.zeros(len(idx), dtype=torch.bool) if unclipped is None else unclipped.bool().cpu()[idx])
        norms = torch.linalg.vector_norm(x, dim=1)
        factor = torch.clamp(C / norms.clamp_min(torch.finfo(torch.float64).tiny), max=1.0)
        x = x * torch.where(free, torch.ones_like(factor), factor)[:, None]
        y = rotate(x, d, cohort.seed, cohort.round) * s
        l2 = self.event(z, s)[1]
        g = self.streams.generator(cohort.seed, cohort.round, "ddp-rounding")
        ints = conditional_rounding(y, l2, g, exempt=free)
        mu = (z * C * s) ** 2
        shares = (torch.ones(len(idx), dtype=torch.bool) if noisy is None else noisy.bool().cpu()[idx])
        g = self.streams.generator(cohort.seed, cohort.round, "ddp-noise")
        noise = skellam_noise((len(idx), d), mu / m, g)
        if not skip_noise:
            ints = ints + noise * shares[:, None].double()
        survived = self.survivors(len(idx), cohort)
        # What the round releases is decided on what the server knows before it unmasks (who survived; independent of
        # the data): no survivor, nothing data-dependent is released (free); a sum whose surviving noise would take the
        # ledger past target_epsilon is not unmasked (free, and the run stops).
        event = self.event(z, s, arrived=(float((shares & survived).sum()), m))  # the noise that reached the sum
        released = bool(survived.any())
        if released and self.target_epsilon is not None and self.delta is not None:
            events = dict(self.accountant.events)
            events[event] = events.get(event, 0) + 1
            after = skellam_epsilon(events, self.delta)
            if after > self.target_epsilon:
                released = False
                self._halt = (f"privacy budget: round {cohort.round}'s {int((shares & survived).sum())} surviving noise "
                              f"shares of {m:g} would spend ε = {after:.4g} > target_epsilon = {self.target_epsilon:g} "
                              f"(δ = {self.delta:.3g}); the server did not unmask it; stopping after "
                              f"{self.accountant.rounds} rounds at ε = {self.accountant.epsilon(self.delta):.4g}")
        if released:
            rows = torch.remainder(ints.long(), self.M)  # modular clipping: a value outside the range wraps
            total = modular_sum(rows, self.bits, survived, ids=host.clients[idx], seed=cohort.seed, round=cohort.round,
                                masks=self.masks)
            signed = to_signed(total, self.bits).double()
            self.accountant.step(*event)
        else:
            signed = torch.zeros(d, dtype=torch.float64)
            self.accountant.empty += bool(not survived.any())
        delta = unrotate(signed / s, P, cohort.seed, cohort.round) / m
        eps = self.accountant.epsilon(self.delta) if self.delta is not None else math.inf
        self._report = {"privacy/epsilon": eps, "privacy/noise_multiplier": z, "privacy/clip": C,
                        "secagg/dropped": float((~survived).sum()), "secagg/unmasked": float(released),
                        "secagg/max_abs_fraction_of_range": float(signed.abs().max()) / (self.M / 2) if d else 0.0}
        return delta.to(updates.device, updates.dtype), None

    def survivors(self, K: int, cohort) -> Tensor:
        """``[K]`` bool: who does not drop after masking (:func:`lfed.privacy.secagg.survivors`, stream ``ddp-dropout``)."""
        return survivors(K, self.dropout, cohort, "ddp-dropout")

    def report(self, cohort) -> dict[str, float]:
        return dict(self._report)

    def summary(self) -> dict[str, float]:
        out = {"final/privacy_noise_multiplier": float(self.noise_multiplier)}
        if self.delta is not None:
            out["final/privacy_epsilon"] = float(self.accountant.epsilon(self.delta))
            out["final/privacy_delta"] = float(self.delta)
        return out

    def get_extra_state(self) -> dict[str, Any]:
        return {"accountant": self.accountant.state_dict(), "delta": self.delta, "scale": self.scale,
                "noise_multiplier": self.noise_multiplier, "halt": self._halt}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.accountant.load_state_dict(state["accountant"])
        self.delta, self.scale = state["delta"], state["scale"]
        self.noise_multiplier = state.get("noise_multiplier", self.noise_multiplier)
        self._halt = state.get("halt")
