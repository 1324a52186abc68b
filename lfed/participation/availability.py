"""Synchronous rounds on a simulated clock: cohorts drawn among the clients online now (issue 65; docs/traces.md).

:class:`AvailableSampler` is a sampler (the ``sampler`` role, docs/algorithms.md §5) that keeps simulated time with a
:class:`~lfed.participation.clock.SimulatedClock`, as FedScale's client manager does (Lai et al., ICML 2022:
``select_participants(num, cur_time)`` draws among ``getFeasibleClients(cur_time)``):

1. **Who is online.** At the round's time ``now`` (``sampler.clock._extra_state``, 0 at round 0) every client's next
   opening is read from the clock (a ``trace``, FedScale's ``client_behave_trace``; or periodic windows,
   ``availability_period``; or always). When nobody is online the server waits: ``now`` moves to the first opening,
   and the online clients are those whose interval opens then (``clock/wait``, the seconds waited).
2. **The cohort.** ``K_t`` of the ``A`` online clients, uniformly without replacement
   (:func:`~lfed.participation.draws.uniform_draw` on their positions, from the round's ``(seed, round, "sample")``
   generator), sorted; with ``A <= K_t`` all of them (said once as a warning, and every round in
   ``round/available``, the number online).
3. **Time moves** after the server step (:meth:`AvailableSampler.observe`): synchronous FedAvg waits for its whole
   cohort, so ``now`` advances by the slowest working member's duration (``clock/round_duration``), each client's from
   the clock's distribution (a device-capacity trace, ``distribution: device``: its examples processed and the model's
   size over its bandwidth; or ``constant``, ``lognormal``, ``file``). A client that did no work (a straggler model's
   inactive client) does not hold the round.

A client online at the round's start finishes its work even if it goes offline meanwhile (the trace governs who is
drawn, as in FedScale). Every draw is seeded and the time is checkpointed, so a resumed run draws exactly what the
uninterrupted one drew. A round whose cohort's work does not count (every client inactive) skips the server step and
leaves the time where it was.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.participation.clock import SimulatedClock, model_bits
from lfed.participation.draws import uniform_draw
from lfed.participation.sampling import ClientSampler

__all__ = ["AvailableSampler", "Online"]


class Online:
    """The clients online at one time, in ascending order, as a pattern of ``period`` (clients ``0..N-1``; client ``k``
    online iff ``k mod period`` is in ``on``, the online members of ``0..period-1``, ascending; ``on`` None: everyone).

    A trace of ``M`` rows gives ``period = M`` (client ``k`` follows row ``k mod M``), so the set of ``N`` clients is
    held in O(M) and its ``j``-th member found in O(1) (:meth:`select`): ``N = Q M + r`` clients are ``Q`` whole periods
    of ``R = |on|`` online clients each, then the part of ``on`` below ``r``.
    """

    def __init__(self, num_clients: int, on: Tensor | None, period: int) -> None:
        self.num_clients, self.on, self.period = num_clients, on, period
        if on is None:
            self.size = num_clients
        else:
            self.whole, rest = divmod(num_clients, period)
            self.tail = int((on < rest).sum())  # on is ascending: its first `tail` rows have a client in the last period
            self.size = self.whole * on.numel() + self.tail

    def select(self, positions: Tensor) -> Tensor:
        """The online clients at ``positions`` (0-based ranks in ascending order), long."""
        positions = positions.long()
        if self.on is None:
            return positions
        R = self.on.numel()
        q = torch.div(positions, R, rounding_mode="floor")
        return q * self.period + self.on[positions - q * R]  # the last period's ranks continue into on's first rows

    def distribution(self) -> Tensor:
        """``[N]`` float64: ``1/A`` for each online client, 0 for the others (what the draw is uniform over; for
        logging: one ``[N]`` gather)."""
        if self.on is None:
            return torch.tensor(1.0 / self.num_clients, dtype=torch.float64).expand(self.num_clients)
        row = torch.zeros(self.period, dtype=torch.float64)
        row[self.on] = 1.0 / self.size
        return row.repeat(-(-self.num_clients // self.period))[: self.num_clients]


class AvailableSampler(ClientSampler):
    """``K_t`` clients drawn uniformly among those online at the round's simulated time (module docstring).

    Args:
        clock: The :class:`~lfed.participation.clock.SimulatedClock` of availability and durations (default:
            ``constant`` durations, every client always online: the uniform sampler's cohorts, with a clock).
    """

    name = "available"
    #: the cohort has fewer than K_t clients only when fewer are online: a few shapes (at most K_t), each recorded once
    #: by the engine, not a new one almost every round (Poisson's)
    fixed_size = True

    def __init__(self, clock: SimulatedClock | None = None) -> None:
        super().__init__()
        if clock is not None and not isinstance(clock, SimulatedClock):
            raise TypeError(f"clock: a lfed.participation.clock.SimulatedClock or None, got {type(clock).__name__}")
        self.clock = clock if clock is not None else SimulatedClock("constant")
        self.seed = 0  # the run's (periodic windows' phases, log-normal speeds): set by check() before round 0
        self.bits = 0.0  # the model's size, down and up (a device trace)
        self._round: dict[str, float] = {}  # this round's availability, reported after the server step
        self._warned = False

    def hparams(self) -> dict[str, Any]:
        return {f"clock.{k}": v for k, v in self.clock.hparams().items()}

    def check(self, context) -> list[str]:
        """Read the clock's files now (one line naming the file and field), and learn the run's seed."""
        self.seed = int(context.seed)
        if context.num_clients is not None:
            self.clock.check_files(context.num_clients)
        return []

    def setup_state(self, store, num_examples: Tensor, num_params: int, like: Tensor) -> None:
        self.bits = model_bits(num_params, like.dtype)
        super().setup_state(store, num_examples, num_params, like)

    @property
    def now(self) -> float:
        """Simulated seconds at the start of the next round."""
        return self.clock.now

    def online(self) -> tuple[Online, float]:
        """``(online, t)``: the clients online at the next round's time ``t`` (``now``, or the first opening after it
        when nobody is online then), an :class:`Online` set in ascending order.

        With a trace, client ``k`` follows the trace's row ``k mod M``: whether it is online is its row's, so the rows
        are read (``M`` of them, each a bisection of its intervals) and the set is made of them, not of the ``N``
        clients: a round costs O(M log L + K), whatever N. Periodic windows have a phase per client: O(N)."""
        N, now = self.num_clients, self.clock.now
        if not self.clock.windows:
            return Online(N, None, N), now
        if self.clock.trace is not None:
            M = self.clock.availability_trace().num_clients
            rows = torch.arange(min(N, M), dtype=torch.long)  # client m < M is row m: the rows every client follows
            opens = self.clock.next_available(rows, now, self.seed, N)
            t = float(opens.min())
            return Online(N, torch.nonzero(opens == t).flatten(), M), t
        everyone = torch.arange(N, dtype=torch.long)
        opens = self.clock.next_available(everyone, now, self.seed, N)
        t = float(opens.min())
        return Online(N, torch.nonzero(opens == t).flatten(), N), t

    def sample(self, round: int, k: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        self._check_k(k)
        N, device = self.num_clients, generator.device
        available, t = self.online()
        wait = t - self.clock.now
        self.clock.now = t  # the server waited for the first client to come online
        A = available.size
        if A <= k:
            ids = available.select(torch.arange(A, dtype=torch.long))
            if A < k and not self._warned:
                self._warned = True
                warnings.warn(f"sampler: round {round}: {A} of the {N} clients are online at simulated time {t:g}, fewer "
                              f"than the cohort of {k}: the round takes all {A} (round/available logs it every round)",
                              stacklevel=2)
        else:
            ids = available.select(uniform_draw(A, k, generator).cpu()).sort().values
        self._round = {"round/available": float(A), "clock/wait": wait}
        return ids.to(device), available.distribution().to(device)

    def observe(self, cohort: Cohort, client_weights: Tensor, w_new: Tensor) -> None:
        """After the server step: ``now`` moves on by the round's duration, its slowest working client's."""
        host = cohort.host_values()
        working = host.steps_done > 0
        duration = 0.0
        if bool(working.any()):
            plan = cohort.plan
            d = self.clock.durations(host.clients[working], host.steps_done[working], cohort.round, cohort.seed,
                                     self.num_clients, num_examples=host.num_examples[working],
                                     batch_size=None if plan is None else plan.batch_size, bits=self.bits)
            duration = float(d.max())
        self.clock.now = self.clock.now + duration
        self._round["clock/round_duration"] = duration

    def report(self, cohort: Cohort) -> dict[str, float]:
        """The round's availability and simulated time (after the server step: the next round's start)."""
        return {**self._round, "clock/time": self.clock.now}

    def evaluation_metrics(self) -> dict[str, float]:
        """Every evaluation is also logged against simulated time."""
        return {"clock/time": self.clock.now}

    def extra_repr(self) -> str:
        return f"num_clients={self.num_clients}, now={self.clock.now:g}"
