"""The privacy ledger of a run: the sampled Gaussian mechanisms it released, and ε(δ) from them (docs/algorithms.md §11).

A round of DP-FedAvg is the Poisson-subsampled Gaussian mechanism with sampling rate ``q`` and
noise multiplier ``z`` (Mironov, Talwar, Zhang 2019); rounds compose. The ledger keeps how many
rounds ran with each ``(q, z)`` (a checkpoint carries it, so a resumed run accounts exactly) and
asks Google's ``dp-accounting`` for ε: its RDP accountant (``RdpAccountant``, the default, as
TensorFlow Privacy and pfl use it) or its PLD accountant (``pld``, tighter). ``dp-accounting`` is
the maintained library behind TensorFlow Privacy's accounting; it is pure Python, needs no
framework, and has both accountants (Opacus's RDP accountant agrees with it: tests/privacy/test_dp_fedavg.py).
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

__all__ = ["PrivacyAccountant", "budget_stop", "calibrate_noise", "smallest_multiplier"]

ACCOUNTANTS = ("rdp", "pld")


class _DropExcludedOrders(logging.Filter):
    """dp-accounting warns, every time it composes, that a fractional Rényi order near 1 did not converge and is left
    out of the ε computation (for common (q, z)); ε stays a valid bound from the other orders. One line per round per
    order would bury a run's log, so the message is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Excluding this order from the epsilon computation" not in record.getMessage()


logging.getLogger("absl").addFilter(_DropExcludedOrders())


def _accountant(kind: str):
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    if kind == "rdp":
        return rdp_privacy_accountant.RdpAccountant()
    if kind == "pld":
        return pld_privacy_accountant.PLDAccountant()
    raise ValueError(f"accountant: {kind!r} is not one of {ACCOUNTANTS}")  # pragma: no cover - checked before
    del dp_accounting


def _event(q: float, z: float):
    import dp_accounting

    return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))


@functools.lru_cache(maxsize=256)
def _rdp_of_one_round(q: float, z: float) -> tuple:
    """``(orders, RDP)`` of one round of the Poisson-subsampled Gaussian (dp-accounting's, at its default orders)."""
    accountant = _accountant("rdp")
    accountant.compose(_event(q, z), 1)
    return tuple(accountant._orders), tuple(accountant._rdp)  # the library's own vector (tests compare the ε)


def epsilon(events: dict[tuple[float, float], int], delta: float, kind: str = "rdp") -> float:
    """ε(δ) of the composition of ``{(q, z): rounds}`` (inf when some round had no noise).

    RDP: the rounds' RDP vectors (each ``(q, z)`` computed once, then cached: the library's
    computation costs ~0.2 s) add up, ``count × RDP`` as the library composes them, and
    dp-accounting's ``compute_epsilon`` converts the sum. PLD: the library's accountant, anew.
    """
    if any(z == 0 and q > 0 and n > 0 for (q, z), n in events.items()):
        return math.inf
    live = sorted((key, n) for key, n in events.items() if n > 0 and key[0] > 0)
    if not live:
        return 0.0
    if kind == "rdp":
        import numpy as np
        from dp_accounting.rdp import rdp_privacy_accountant

        orders = _rdp_of_one_round(*live[0][0])[0]
        total = np.zeros(len(orders))
        for (q, z), n in live:
            total += n * np.asarray(_rdp_of_one_round(q, z)[1])
        return float(rdp_privacy_accountant.compute_epsilon(orders, total, delta)[0])
    accountant = _accountant(kind)
    for (q, z), n in live:
        accountant.compose(_event(q, z), n)
    return float(accountant.get_epsilon(delta))


def smallest_multiplier(eps, target: float, unreachable: str, cap: float = 1e4) -> float:
    """The smallest noise multiplier ``z`` (bisection to 0.1%) with ``eps(z) <= target``, ``eps`` decreasing in ``z``;
    ``ValueError(unreachable)`` when even ``cap`` does not reach it. DP-FedAvg's and distributed DP's calibration."""
    lo, hi = 0.0, 1.0
    while eps(hi) > target:
        lo, hi = hi, hi * 2
        if hi > cap:
            raise ValueError(unreachable)
    while hi - lo > 1e-3 * hi:
        mid = (lo + hi) / 2
        if eps(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


def budget_stop(round: int, after: float, target: float, delta: float, rounds: int, spent: float) -> str | None:
    """The one line stopping a run before ``round``, which would spend ``after > target`` (None when it fits)."""
    if after <= target:
        return None
    return (f"privacy budget: round {round} would spend ε = {after:.4g} > target_epsilon = {target:g} "
            f"(δ = {delta:.3g}); stopping after {rounds} rounds at ε = {spent:.4g}")


def calibrate_noise(target_epsilon: float, delta: float, rates: list[float], kind: str = "rdp") -> float:
    """The smallest noise multiplier ``z`` with ``ε(δ) ≤ target`` after rounds at sampling rates ``rates`` (one per round;
    bisection to 0.1%)."""
    counts: dict[float, int] = {}
    for q in rates:
        counts[float(q)] = counts.get(float(q), 0) + 1

    def eps(z: float) -> float:
        return epsilon({(q, z): n for q, n in counts.items()}, delta, kind)

    return smallest_multiplier(eps, target_epsilon,
                               f"target_epsilon: {target_epsilon} cannot be reached in {len(rates)} rounds at sampling rate "
                               f"{max(rates):.4g} and delta {delta:.3g}, even with noise multiplier 1e4")


class PrivacyAccountant:
    """The ledger (module docstring): ``step(q, z)`` per round, ``epsilon(delta)`` at any time.

    Args:
        kind: ``rdp`` (default) or ``pld``.
    """

    def __init__(self, kind: str = "rdp") -> None:
        if kind not in ACCOUNTANTS:
            raise ValueError(f"accountant: {kind!r} is not one of {ACCOUNTANTS}")
        self.kind = kind
        self.events: dict[tuple[float, float], int] = {}

    @property
    def rounds(self) -> int:
        return sum(self.events.values())

    def step(self, q: float, z: float) -> None:
        """One round of the sampled Gaussian mechanism at rate ``q`` with multiplier ``z``."""
        key = (float(q), float(z))
        self.events[key] = self.events.get(key, 0) + 1

    def epsilon(self, delta: float) -> float:
        return epsilon(self.events, delta, self.kind)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "events": [[q, z, n] for (q, z), n in sorted(self.events.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kind = state["kind"]
        self.events = {(float(q), float(z)): int(n) for q, z, n in state["events"]}
