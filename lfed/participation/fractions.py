"""Cohort sizes and participation-fraction schedules (docs/algorithms.md §5): a round draws ``K_t = cohort_size(γ_t, N)``
clients, ``γ_t`` from a :class:`FractionSchedule` (constant, AdaFL's stepwise schedule, or an explicit list). The
samplers that draw them: :mod:`lfed.participation.sampling`."""

from __future__ import annotations

import bisect
import math

__all__ = [
    "ConstantFraction", "ExplicitFraction", "FractionSchedule", "StepwiseFraction", "as_schedule", "cohort_size", "round_half_up",
]  # fmt: skip

# Relative tolerance for round_half_up: a product such as 0.29 * 100 carries float
# error of a few ulps (~1e-16 relative); 1e-12 absorbs it, while no genuine
# fraction times client count lies that close below a half.
_HALF_TOL = 1e-12


# --------------------------------------------------------------------------- rounding


def round_half_up(x: float) -> int:
    """Round to the nearest integer, halves up: ``floor(x + 0.5)`` (docs/algorithms.md §5).

    Robust to float error: a value within a relative ``1e-12`` below a half is
    treated as the half (``floor(x + 0.5 + 1e-12 * max(1, |x|))``), so a product
    that should be ``2.5`` but comes out as ``2.4999999999999996`` gives 3.
    ``int(x)`` would truncate instead (``int(0.29 * 100) == 28``).

    Args:
        x: A finite real number.

    Returns:
        ``floor(x + 0.5)`` up to float error.

    Raises:
        ValueError: If ``x`` is not a finite real number.
    """
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise ValueError(f"x must be a finite real number, got {x!r}")
    return math.floor(x + 0.5 + _HALF_TOL * max(1.0, abs(x)))


def is_int(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _check_fraction(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")
    if not (0.0 < float(value) <= 1.0):
        raise ValueError(f"{name} must be in (0, 1], got {value}")
    return float(value)


def cohort_size(fraction: float, num_clients: int) -> int:
    """Number of clients of a round: ``K = max(1, round_half_up(C * N))`` (docs/algorithms.md §5).

    Args:
        fraction: Participation fraction ``C`` in ``(0, 1]``.
        num_clients: ``N >= 1``.

    Returns:
        ``K`` with ``1 <= K <= N``.

    Raises:
        ValueError: If ``fraction`` is outside ``(0, 1]`` or ``num_clients < 1``.
    """
    fraction = _check_fraction("fraction", fraction)
    if not is_int(num_clients, 1):
        raise ValueError(f"num_clients must be an int >= 1, got {num_clients!r}")
    return min(num_clients, max(1, round_half_up(fraction * num_clients)))


# --------------------------------------------------------------------------- schedules


class FractionSchedule:
    """Participation fraction ``γ_t`` per round (docs/algorithms.md §5, dynamic fraction of 003).

    Call with the 0-based round index and the run's total number of rounds
    (``None`` if unknown; schedules that need it raise). Subclasses implement
    :meth:`fraction`.
    """

    def __call__(self, round: int, total_rounds: int | None = None) -> float:
        """Return ``γ`` for ``round``.

        Args:
            round: 0-based round index, ``>= 0``.
            total_rounds: Number of rounds of the run (``>= 1``) or ``None``.

        Returns:
            The fraction, in ``(0, 1]``.

        Raises:
            ValueError: On a negative or non-int ``round`` or a ``total_rounds``
                that is neither ``None`` nor an int ``>= 1``.
        """
        if not is_int(round, 0):
            raise ValueError(f"round must be an int >= 0, got {round!r}")
        if total_rounds is not None and not is_int(total_rounds, 1):
            raise ValueError(f"total_rounds must be None or an int >= 1, got {total_rounds!r}")
        return self.fraction(round, total_rounds)

    #: Whether the fraction of a round depends on the run's total number of rounds (then a
    #: run resumed or extended with another ``trainer.max_steps`` follows another schedule).
    depends_on_total_rounds: bool = False

    def fraction(self, round: int, total_rounds: int | None) -> float:
        """The fraction of a validated round; implemented by subclasses."""
        raise NotImplementedError


class ConstantFraction(FractionSchedule):
    """The same fraction ``C`` every round (FedAvg's ``C``).

    Args:
        fraction: ``C`` in ``(0, 1]``.
    """

    def __init__(self, fraction: float = 0.1) -> None:
        self.value = _check_fraction("fraction", fraction)

    def fraction(self, round: int, total_rounds: int | None) -> float:
        return self.value

    def __repr__(self) -> str:
        return f"ConstantFraction(fraction={self.value})"


class StepwiseFraction(FractionSchedule):
    """AdaFL's dynamic fraction: ``stages`` equal constant stages from ``start`` to ``end``.

    docs/algorithms.md §5, 003 "Dynamic fraction" (0.1 to 0.5). Stage ``i`` (``0 <= i < stages``)
    uses ``γ = start + (end - start) * i / (stages - 1)``, i.e. fractions linearly
    spaced from ``start`` to ``end``. The 0-based round ``r`` of a run of ``R``
    rounds is in stage ``min(floor(r * stages / R), stages - 1)``, so stage ``i``
    starts at round ``ceil(i * R / stages)`` (stage lengths differ by at most one
    when ``stages`` does not divide ``R``). Rounds ``>= R`` stay in the last
    stage. With ``R = 10, stages = 5, 0.1 -> 0.5``: rounds 0-1 use 0.1, 2-3 0.2,
    4-5 0.3, 6-7 0.4, 8-9 0.5. (003's tables fit ``R = 1000`` with 200-round
    stages: AdaFL reaches 90% on MNIST after 423 rounds and
    ``200*10 + 200*20 + 23*30 = 6690`` uploads.)

    Args:
        start: First fraction, in ``(0, 1]``.
        end: Last fraction, in ``[start, 1]``.
        stages: Number of stages, ``>= 1`` (``1`` requires ``start == end``).

    Raises:
        ValueError: On fractions outside ``(0, 1]``, ``end < start`` (the
            schedule must be non-decreasing), or a bad ``stages``.
    """

    def __init__(self, start: float = 0.1, end: float = 0.5, stages: int = 5) -> None:
        self.start = _check_fraction("start", start)
        self.end = _check_fraction("end", end)
        if self.end < self.start:
            raise ValueError(
                f"end must be >= start (the fraction schedule must be non-decreasing), "
                f"got start={start}, end={end}"
            )
        if not is_int(stages, 1):
            raise ValueError(f"stages must be an int >= 1, got {stages!r}")
        if stages == 1 and self.start != self.end:
            raise ValueError(f"stages=1 needs start == end, got start={start}, end={end}")
        self.stages = stages

    depends_on_total_rounds = True

    def stage(self, round: int, total_rounds: int) -> int:
        """0-based stage index of ``round`` in a run of ``total_rounds`` rounds."""
        return min(round * self.stages // total_rounds, self.stages - 1)

    def fraction(self, round: int, total_rounds: int | None) -> float:
        if total_rounds is None:
            raise ValueError("total_rounds is required by StepwiseFraction, got None")
        if self.stages == 1:
            return self.start
        i = self.stage(round, total_rounds)
        last = self.stages - 1
        return (self.start * (last - i) + self.end * i) / last

    def __repr__(self) -> str:
        return f"StepwiseFraction(start={self.start}, end={self.end}, stages={self.stages})"


class ExplicitFraction(FractionSchedule):
    """A piecewise-constant schedule given as ``(round, fraction)`` pairs (docs/algorithms.md §5).

    Round ``r`` uses the fraction of the last pair whose round is ``<= r``.

    Args:
        points: Pairs ``(round, fraction)``; the first round must be 0, rounds
            strictly increasing ints, fractions in ``(0, 1]`` and non-decreasing.
            Lists of two items (as from YAML) are accepted.

    Raises:
        ValueError: If ``points`` breaks any of these rules.
    """

    def __init__(self, points: list[tuple[int, float]]) -> None:
        if not isinstance(points, (list, tuple)) or not points:
            raise ValueError(f"points must be a non-empty list of (round, fraction), got {points!r}")
        rounds: list[int] = []
        fractions: list[float] = []
        for i, point in enumerate(points):
            if not isinstance(point, (list, tuple)) or len(point) != 2:
                raise ValueError(f"points[{i}] must be a (round, fraction) pair, got {point!r}")
            r, f = point
            if not is_int(r, 0):
                raise ValueError(f"points[{i}] round must be an int >= 0, got {r!r}")
            f = _check_fraction(f"points[{i}] fraction", f)
            if rounds and r <= rounds[-1]:
                raise ValueError(f"points rounds must be strictly increasing, got {r} after {rounds[-1]}")
            if fractions and f < fractions[-1]:
                raise ValueError(
                    f"points fractions must be non-decreasing, got {f} after {fractions[-1]} at round {r}"
                )
            rounds.append(r)
            fractions.append(f)
        if rounds[0] != 0:
            raise ValueError(f"points must start at round 0, got first round {rounds[0]}")
        self.rounds = rounds
        self.fractions = fractions

    def fraction(self, round: int, total_rounds: int | None) -> float:
        return self.fractions[bisect.bisect_right(self.rounds, round) - 1]

    def __repr__(self) -> str:
        return f"ExplicitFraction(points={list(zip(self.rounds, self.fractions))})"


def as_schedule(x: float | FractionSchedule) -> FractionSchedule:
    """Turn a number into a :class:`ConstantFraction`; pass schedules through.

    Raises:
        ValueError: If ``x`` is neither a number in ``(0, 1]`` nor a schedule.
    """
    if isinstance(x, FractionSchedule):
        return x
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"fraction must be a number in (0, 1] or a FractionSchedule, got {x!r}")
    return ConstantFraction(x)
