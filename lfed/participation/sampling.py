"""Client sampling: cohort sizes, participation-fraction schedules, samplers.

docs/algorithms.md §5. A round draws ``K_t = cohort_size(γ_t, N)`` clients, where ``γ_t`` comes
from a :class:`FractionSchedule` (constant, AdaFL's stepwise schedule, or an
explicit list), with a :class:`ClientSampler` (uniform, or AdaFL's attention
sampler whose scores are declared state, :mod:`lfed.state.spec`, so they ride in the checkpoint).

The straggler model (docs/algorithms.md §6) and the communication meter (docs/algorithms.md §5, §7) live in
:mod:`lfed.participation.stragglers` and :mod:`lfed.evaluation.communication`; they are re-exported here.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import torch
from torch import Tensor

from lfed.base.component import Cohort, Component, standalone_store
from lfed.engine.host import device_rows, values
from lfed.evaluation.communication import CommunicationMeter, rounds_to_reach
from lfed.participation.stragglers import Stragglers
from lfed.state.spec import StateSpec

__all__ = [
    "DRAWS", "AttentionSampler", "PoissonSampler", "ClientSampler", "CommunicationMeter", "ConstantFraction",
    "ExplicitFraction", "FractionSchedule", "StepwiseFraction", "Stragglers", "UniformSampler",
    "as_schedule", "cohort_size", "round_half_up", "rounds_to_reach", "uniform_draw",
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


def _is_int(value: object, minimum: int) -> bool:
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
    if not _is_int(num_clients, 1):
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
        if not _is_int(round, 0):
            raise ValueError(f"round must be an int >= 0, got {round!r}")
        if total_rounds is not None and not _is_int(total_rounds, 1):
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
        if not _is_int(stages, 1):
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
            if not _is_int(r, 0):
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


# --------------------------------------------------------------------------- samplers


class ClientSampler(Component):
    """Base class of client samplers (docs/algorithms.md §5), a component of the round (:mod:`lfed.base.component`).

    Sampler state (AdaFL scores) is declared state (:meth:`state_specs`), so it is in the
    LightningModule's ``state_dict`` and checkpoints. Call :meth:`setup` once the client sizes
    are known (this resets the state; Lightning calls ``setup`` before restoring a
    checkpoint, so restored state wins), then per round :meth:`sample` and, after the server
    step, :meth:`observe` (which computes what the sampler needs from the round itself).
    """

    num_clients: int
    name = "uniform"
    asynchronous_unready = ("is not used: asynchronous dispatch draws uniformly among the clients not in flight; "
                            "leave sampler unset")
    #: Whether every round's cohort has the planned size. A sampler of random cohort sizes (Poisson) sets False, and the
    #: engine then runs its steps eagerly instead of recording one graph per shape (a new size almost every round).
    fixed_size = True
    #: Whether each client is drawn independently with the same probability ``q = K_t / N`` (Poisson sampling, the
    #: sampling DP-FedAvg's accountant assumes; :class:`PoissonSampler`). False by default.
    poisson = False

    def __init__(self) -> None:
        super().__init__()
        self.num_clients = 0

    def setup_state(self, store, num_examples: Tensor, num_params: int, like: Tensor) -> None:
        self.setup(num_examples, store=store)

    def observe(self, cohort: Cohort, client_weights: Tensor, w_new: Tensor) -> None:
        """After the server step: the cohort's final local weights ``[K, P]`` and the new global model."""

    def setup(self, num_examples: Tensor, store=None) -> None:
        """Record the clients' example counts ``n_k`` (shape ``[N]``) and reset state.

        Raises:
            ValueError: If ``num_examples`` is not a 1-D tensor of ``N >= 1``
                non-negative counts with a positive sum.
        """
        if not isinstance(num_examples, Tensor) or num_examples.ndim != 1 or num_examples.numel() < 1:
            raise ValueError(f"num_examples must be a 1-D tensor with N >= 1 entries, got {num_examples!r}")
        if num_examples.is_complex() or bool((num_examples < 0).any()) or not bool(num_examples.sum() > 0):
            raise ValueError(f"num_examples must be non-negative with a positive sum, got {num_examples}")
        self.num_clients = int(num_examples.numel())
        store = store or self.__dict__.get("_store") or standalone_store()
        like = torch.zeros((), device=num_examples.device)
        Component.setup_state(self, store, num_examples, 0, like)

    def _check_k(self, k: int) -> None:
        if self.num_clients < 1:
            raise ValueError("sampler is not set up: call setup(num_examples) first")
        if not _is_int(k, 1) or k > self.num_clients:
            raise ValueError(f"k must be an int in [1, {self.num_clients}], got {k!r}")

    def sample(self, round: int, k: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Draw ``k`` distinct clients for ``round``.

        Args:
            round: 0-based round index (samplers may ignore it; the randomness
                comes from ``generator``, e.g. ``round_generator(seed, round, "sample")``).
            k: Cohort size, ``1 <= k <= N``.
            generator: Source of randomness. The draw happens on its device
                and both results live there, so a CPU generator gives the same
                cohort whichever device the sampler's buffers are on.

        Returns:
            ``(ids, p)``: ``ids`` the sampled client indices, ``[k]`` long,
            sorted ascending, no repeats; ``p`` the ``[N]`` float64 distribution
            the draw used (AdaFL's ``p ← a^(t)``: the probabilities of the first
            draw, not the inclusion probabilities), for logging.
        """
        raise NotImplementedError

    def update(self, sampled: Tensor, distances: Tensor) -> None:
        """Update state after aggregation; no-op by default.

        Args:
            sampled: ``[k]`` long ids of the sampled clients.
            distances: ``[k]`` distances ``||w^(t+1) - w_i^(t)||_2``, same order.
        """


#: How a cohort is drawn: ``"rejection"`` (0.6 on: O(K), :func:`uniform_draw`) or ``"permutation"`` (lfed 0.5 and
#: earlier: the first ``k`` of ``randperm(N)``, O(N)). A run keeps the draws it was made with: a checkpoint of 0.5 resumes
#: with ``"permutation"`` (:meth:`lfed.core.run.FederatedRun.load_extra_state`).
DRAWS = ("rejection", "permutation")


def uniform_draw(num_clients: int, k: int, generator: torch.Generator, exclude: Tensor | None = None) -> Tensor:
    """``[k]`` distinct clients of ``range(num_clients)`` not in ``exclude``, uniformly without replacement, in draw order.

    With ``k + |exclude| ≤ N/2``, in O(k) expected time and memory whatever ``N``: batches of ``max(2 m, 16)`` integers
    uniform in ``[0, N)`` (``m`` the clients still missing) from ``generator``, each kept at its first appearance unless
    excluded, until ``k`` are kept (every ``k``-subset of the allowed clients equally likely: the first ``k`` distinct
    values of an i.i.d. uniform sequence, rejection keeping uniformity). Otherwise (a large share of the population)
    the first ``k`` allowed clients of ``randperm(N)``, O(N). Drawn on the generator's device.
    """
    N = int(num_clients)
    device = generator.device
    banned = set() if exclude is None else set(exclude.detach().cpu().long().tolist())  # (the dispatch's few busy)
    if k + len(banned) > N / 2:
        perm = torch.randperm(N, generator=generator, device=device)
        if banned:
            perm = perm[~torch.isin(perm, torch.tensor(sorted(banned), dtype=perm.dtype, device=device))]
        return perm[:k]
    kept = torch.zeros(0, dtype=torch.long, device=device)
    seen = torch.tensor(sorted(banned), dtype=torch.long, device=device)  # the excluded, then those kept
    while kept.numel() < k:
        m = max(2 * (k - kept.numel()), 16)
        draws = torch.randint(0, N, (m,), generator=generator, device=device)
        values_, inverse = torch.unique(draws, return_inverse=True)  # each value's first position in the batch:
        first = torch.full_like(values_, m).scatter_reduce(0, inverse, torch.arange(m, device=device), "amin")
        new = ~torch.isin(values_, seen)
        order = first[new].argsort()  # the new values in the order they first appeared
        taken = values_[new][order][: k - kept.numel()]
        kept = torch.cat([kept, taken])
        seen = torch.cat([seen, taken])
    return kept


def _constant(num_clients: int, value: float, device) -> Tensor:
    """``[N]`` float64 all ``value``, as a broadcast view of one number (no O(N) allocation)."""
    return torch.tensor(value, dtype=torch.float64, device=device).expand(num_clients)


class UniformSampler(ClientSampler):
    """``k`` clients without replacement, uniformly (FedAvg; docs/algorithms.md §5), in O(k) (:func:`uniform_draw`;
    ``draws = "permutation"``: lfed 0.5's ``randperm(N)[:k]``, kept for the runs it made)."""

    asynchronous_ready = True
    draws = "rejection"

    def sample(self, round: int, k: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        self._check_k(k)
        device = generator.device
        if self.draws == "permutation":
            ids = torch.randperm(self.num_clients, generator=generator, device=device)[:k]
        else:
            ids = uniform_draw(self.num_clients, k, generator)
        return ids.sort().values, _constant(self.num_clients, 1.0 / self.num_clients, device)


class PoissonSampler(ClientSampler):
    """Each client independently with probability ``q = K_t / N`` (docs/algorithms.md §11): a cohort of random size, ``K_t`` expected.

    The sampling DP-FedAvg's accountant assumes (:mod:`lfed.privacy`); ``K_t`` is the participation's
    planned cohort (``fraction``). A round may draw no client.
    """

    name = "poisson"
    fixed_size = False
    poisson = True
    #: DP-FedAvg's source of private draws (:class:`lfed.rng.PrivateStreams`), set by it before round 0: the cohort
    #: is part of the mechanism (its subsampling amplification assumes nobody can reproduce it)
    private_streams = None

    draws = "rejection"

    def sample(self, round: int, k: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Each client independently with probability ``q``: in O(K) as the number of clients ``Binomial(N, q)``, then
        that many uniformly without replacement (:func:`uniform_draw`; the same distribution of cohorts); with
        ``draws = "permutation"``, lfed 0.5's ``N`` uniforms compared with ``q``, O(N)."""
        self._check_k(k)
        N, device = self.num_clients, generator.device
        q = k / N
        if self.draws == "permutation":
            draws = torch.rand(N, generator=generator, device=device, dtype=torch.float64)
            ids = torch.nonzero(draws < q).flatten()
        else:
            count = torch.binomial(torch.tensor(float(N), dtype=torch.float64, device=device),
                                   torch.tensor(q, dtype=torch.float64, device=device), generator=generator)
            ids = uniform_draw(N, int(count), generator).sort().values
        return ids, _constant(N, q, device)


class AttentionSampler(ClientSampler):
    """AdaFL attention-based client sampling (003 Algorithm 1; docs/algorithms.md §5).

    Scores start at ``a^(1) = n_k / n`` (buffer ``scores``, ``[N]`` float64). A round
    draws ``k`` clients without replacement with probabilities ``a``: successive
    draws, each proportional to the scores of clients not yet drawn
    (``torch.multinomial(a, k, replacement=False)``). After aggregation, for the
    sampled clients ``S`` with distances ``d_i = ||w^(t+1) - w_i^(t)||_2``
    (Algorithm 1 line 12)::

        a_i <- α a_i + (1 - α) * d_i / Σ_{k∈S} d_k * Σ_{k∈S} a_k

    with shares ``d_i / Σ d`` replaced by ``1/|S|`` if every ``d`` is 0;
    unsampled scores are unchanged, so the total stays 1.

    Args:
        alpha: Decay ``α`` in ``[0, 1)`` (0.9 in 003).

    Raises:
        ValueError: If ``alpha`` is outside ``[0, 1)``.
    """

    scores: Tensor
    name = "attention"
    releases = ("AdaFL's sampling scores move with each client's raw distance ||w^(t+1) - w_k^(t)||, un-noised, "
                "and choose later cohorts",)

    def composition_warnings(self, context) -> list[str]:
        sizes = context.cohort_sizes
        if sizes and min(sizes) == context.num_clients:
            return ["sampler='attention' with every client sampled every round: the AdaFL scores change nothing"]
        return []

    def __init__(self, alpha: float = 0.9) -> None:
        super().__init__()
        from lfed.checks import number

        alpha = number("alpha", alpha, at_least=0, below=1, detail=" (AdaFL's score decay α)")
        self.alpha = float(alpha)
        self.register_buffer("scores", torch.zeros(0, dtype=torch.float64))

    def hparams(self) -> dict:
        return {"alpha": self.alpha}

    def state_specs(self) -> list[StateSpec]:
        def initial(n: Tensor) -> Tensor:  # a^(1) = n_k / n
            n = n.to(torch.float64)
            return n / n.sum()

        return [StateSpec("scores", shape=(), init=initial, dtype=torch.float64)]

    def setup(self, num_examples: Tensor, store=None) -> None:
        super().setup(num_examples.to(self.scores.device), store=store)

    def observe(self, cohort: Cohort, client_weights: Tensor, w_new: Tensor) -> None:
        """AdaFL scores (docs/algorithms.md §5) move only for clients whose model the server received and used:
        an inactive or dropped client uploaded nothing, so it has no distance and keeps its score."""
        host = cohort.host_values()
        if not any(values(host.counting)):
            return
        rows = device_rows(host.counting, client_weights.device)  # no boolean mask: no device read (lfed.engine.host)
        self._update(cohort.clients[rows.to(cohort.clients.device)], (client_weights[rows] - w_new).norm(dim=1))

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        # Resize the buffer to the checkpoint's so a state dict loads before or
        # after setup(); the number of clients follows the loaded scores.
        saved = state_dict.get(prefix + "scores")
        if isinstance(saved, Tensor) and saved.shape != self.scores.shape:
            self.scores = torch.empty_like(saved, device=self.scores.device, dtype=torch.float64)
            self.num_clients = int(saved.numel())
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def sample(self, round: int, k: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        self._check_k(k)
        scores = self.state("scores").to(generator.device)
        positive = scores > 0
        n_pos = int(positive.sum())
        if n_pos >= k:
            ids = torch.multinomial(scores, k, replacement=False, generator=generator)
        else:
            # Fewer positive scores than k (possible only with alpha = 0 and
            # zero distances, or clients with no examples): every positive
            # client is drawn, the rest uniformly among the zero-score clients.
            zeros = (~positive).to(scores.dtype)
            rest = torch.multinomial(zeros, k - n_pos, replacement=False, generator=generator)
            ids = torch.cat([positive.nonzero().flatten(), rest])
        return ids.sort().values, scores.clone()

    @torch.no_grad()
    def update(self, sampled: Tensor, distances: Tensor) -> None:
        """Apply 003 Algorithm 1 line 12 to the sampled clients' scores.

        Args:
            sampled: ``[k]`` distinct long client ids.
            distances: ``[k]`` finite non-negative distances, same order.

        Raises:
            ValueError: On mismatched shapes, repeated or out-of-range ids, or
                negative or non-finite distances.
        """
        if sampled.ndim != 1 or distances.shape != sampled.shape or sampled.numel() < 1:
            raise ValueError(
                f"sampled and distances must be 1-D of the same length >= 1, got shapes "
                f"{tuple(sampled.shape)} and {tuple(distances.shape)}"
            )
        if sampled.dtype.is_floating_point or sampled.dtype.is_complex or sampled.dtype == torch.bool:
            raise ValueError(f"sampled must be an integer tensor, got dtype {sampled.dtype}")
        scores = self.state("scores")
        sampled = sampled.to(scores.device)
        if bool((sampled < 0).any()) or bool((sampled >= scores.numel()).any()):
            raise ValueError(f"sampled ids must be in [0, {scores.numel()}), got {sampled.tolist()}")
        if sampled.unique().numel() != sampled.numel():
            raise ValueError(f"sampled ids must be distinct, got {sampled.tolist()}")
        d = distances.to(device=scores.device, dtype=torch.float64)
        if not bool(torch.isfinite(d).all()) or bool((d < 0).any()):
            raise ValueError(f"distances must be finite and >= 0, got {distances.tolist()}")
        self._update(sampled, d)

    @torch.no_grad()
    def _update(self, sampled: Tensor, distances: Tensor) -> None:
        """:meth:`update` without its checks (the round's own distinct clients and norms), with no device read:
        the uniform fall-back for zero distances is a ``torch.where``."""
        d = distances.to(device=self.state("scores").device, dtype=torch.float64)
        total_d = d.sum()
        shares = torch.where(total_d > 0, d / total_d, torch.full_like(d, 1.0 / d.numel()))
        a = self.rows("scores", sampled)
        self.write_rows("scores", sampled, self.alpha * a + (1.0 - self.alpha) * shares * a.sum())

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, num_clients={self.num_clients}"


# A schedule given to FederatedModule is one of its hyper-parameters, so Lightning pickles it
# into every checkpoint; resuming loads checkpoints with torch.load(weights_only=True), which
# rebuilds only allow-listed classes. These hold plain numbers and run no code when rebuilt.
torch.serialization.add_safe_globals([ConstantFraction, StepwiseFraction, ExplicitFraction])
