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

__all__ = ["AvailableSampler"]


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

    def online(self) -> tuple[Tensor, float]:
        """``([A] long, t)``: the clients online at the next round's time ``t`` (``now``, or the first opening after it
        when nobody is online then), ascending."""
        N = self.num_clients
        everyone = torch.arange(N, dtype=torch.long)
        if not self.clock.windows:
            return everyone, self.clock.now
        opens = self.clock.next_available(everyone, self.clock.now, self.seed, N)
        t = float(opens.min())
        return torch.nonzero(opens == t).flatten(), t

    def sample(self, round: int, k: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        self._check_k(k)
        N, device = self.num_clients, generator.device
        available, t = self.online()
        wait = t - self.clock.now
        self.clock.now = t  # the server waited for the first client to come online
        A = available.numel()
        if A <= k:
            ids = available
            if A < k and not self._warned:
                self._warned = True
                warnings.warn(f"sampler: round {round}: {A} of the {N} clients are online at simulated time {t:g}, fewer "
                              f"than the cohort of {k}: the round takes all {A} (round/available logs it every round)",
                              stacklevel=2)
        else:
            ids = available[uniform_draw(A, k, generator).cpu()].sort().values
        self._round = {"round/available": float(A), "clock/wait": wait}
        p = torch.zeros(N, dtype=torch.float64)
        p[available] = 1.0 / A
        return ids.to(device), p.to(device)

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
