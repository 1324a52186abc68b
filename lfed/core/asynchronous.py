"""Asynchronous federated training on a simulated clock: FedBuff and FedAsync as a composition choice (issue 40).

An :class:`Asynchronous` component (``model.asynchronous``) turns the run's round into a *server step*
of buffered asynchronous training; the driver, the engine, the other components and the checkpoint
are the synchronous run's own. One server step ``t`` (one Lightning ``training_step``, so
``global_step == t`` counts server steps):

1. **Dispatch.** Clients are dispatched to keep ``concurrency`` ``C`` in flight (``C`` at step 0,
   ``M`` after): drawn uniformly among the clients not in flight (``randperm(N)`` seeded by
   ``(seed, t, "sample")``, the clients in flight skipped, the first ones sorted: with none in
   flight exactly the synchronous uniform sampler's draw), each with its full step budget. All of
   them start from the current model ``w^t`` (model version ``t``), so they train together as ONE
   engine call now (:func:`lfed.core.round.prepare_round`, the driver's :func:`lfed.core.lockstep.train_together`):
   a client's update does not depend on when it arrives. Each client's result waits in a slot of the
   client state store (``asynchronous.update``, ``[C, P]``: on the device, in host memory or on disk,
   ``client_state``) until its arrival time ``now + d_k`` (``d_k`` from the :class:`~lfed.participation.clock.SimulatedClock`).
   With availability windows (``clock.availability_period``, or a ``clock.trace``) only the clients available at a time are drawn
   (FedScale's rule); while slots are free and fewer than ``M`` arrivals precede it, the server waits for the
   next window to open and dispatches there, still with ``w^t`` (:meth:`Asynchronous._dispatch_plan`).
2. **Arrivals.** The ``M`` (``buffer``) earliest arrivals are popped (ties in dispatch order); the
   clock moves to the last one's arrival time. A popped client dispatched at version ``v`` has
   staleness ``τ = t - v``.
3. **Server update.** With the weighting component's ``a_k`` over the popped clients (``uniform``:
   ``1/M``, FedBuff's mean; ``size``: ``n_k / Σ n``) and the staleness weight ``s(τ)``:

   * FedBuff (``mixing=None``; Nguyen et al., AISTATS 2022, Algorithm 1):
     ``Δ = Σ_k a_k s(τ_k) Δ_k``, ``Δ_k = w_k - w^{v_k}`` the client's own update; the server optimizer
     steps on the pseudo-gradient ``-Δ`` (SGD with ``lr = η_g``: ``w ← w + η_g Δ``, FedBuff's server
     learning rate; FedAdam etc. compose).
   * FedAsync (``mixing=α``; Xie, Koyejo, Gupta 2019, Algorithm 1 / Eq. "x_t = (1 - α_t) x_{t-1} + α_t x_new",
     ``α_t = α s(t - τ)``): ``Δ = Σ_k a_k α s(τ_k) (w_k - w^t)``, so with ``M = 1`` and server SGD ``lr = 1``,
     ``w ← (1 - α s(τ)) w + α s(τ) w_k``.

   Staleness weights ``s(τ)``: ``constant`` 1; ``polynomial`` ``(1 + τ)^{-a}`` (FedBuff uses
   ``a = 1/2``); ``hinge`` 1 for ``τ <= b``, else ``1 / (a (τ - b) + 1)`` (FedAsync).

   A net with BatchNorm running statistics: each dispatched client's buffers wait in its slot with its update
   (``asynchronous.stats``), and the server step sets the global model's buffers as a synchronous round does
   (:meth:`lfed.core.run.FederatedRun.aggregate_buffers`, the one function both use): the floating ones to the
   arrivals' mean with the step's weights ``a_k α s(τ_k)`` normalised, ``num_batches_tracked`` to the arrivals'
   largest. Like the synchronous round's, this replaces the global statistics whatever the server optimizer or
   ``α``: statistics are not a gradient.

Synchronous FedAvg is the special case ``C = M = K`` with equal durations (``clock.distribution:
constant``): every step dispatches the sampler's cohort, all arrive with ``τ = 0``, and the server
update is the synchronous round's, bit for bit (``tests/core/test_asynchronous.py``).

Dispatch happens after each server step (all ``M`` freed slots refilled with the new model at once).
With ``M = 1`` this is FLSim's event order exactly; with ``M > 1``, FLSim refills a slot at each arrival
with the model of that moment (the same version until the buffer fills), so clients freed before the
buffer fills start later here (at the server step's time) but from the same model version. docs/async.md.

State (all in the state dict, so a checkpoint resumes exactly): the slot rows (the store), the event
queue, the model version counter and the simulated time (``asynchronous._extra_state``,
``asynchronous.clock._extra_state``), and with running statistics each slot's buffers (``asynchronous.stats``).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from lfed.base.async_ready import asynchronous_refusal, declared_refusal
from lfed.base.component import Component, CompositionContext
from lfed.checks import integer, number, one_of
from lfed.engine.host import to_device
from lfed.evaluation.scores import is_classification, local_accuracy
from lfed.participation.clock import SimulatedClock, model_bits
from lfed.participation.sampling import uniform_draw
from lfed.state.spec import StateSpec

__all__ = ["STALENESS", "Asynchronous", "FedAsync", "FedBuff", "asynchronous_refusal", "declared_refusal", "staleness_weight"]

STALENESS = ("constant", "polynomial", "hinge")


def staleness_weight(tau: int, kind: str, a: float = 0.5, b: int = 0) -> float:
    """``s(τ)``: ``constant`` 1; ``polynomial`` ``(1 + τ)^{-a}``; ``hinge`` 1 if ``τ <= b`` else ``1 / (a (τ - b) + 1)``."""
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((1.0 + tau) ** (-a))
    if kind == "hinge":
        return 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)
    raise ValueError(f"staleness: {kind!r} is not one of {STALENESS}")


class Asynchronous(Component):
    """Buffered asynchronous training on a simulated clock (module docstring).

    Args:
        concurrency: ``C``, clients in flight (``<= N``).
        buffer: ``M``, arrivals per server step (``1 <= M <= C``).
        staleness: ``constant``, ``polynomial`` or ``hinge``.
        staleness_exponent: ``a`` of ``polynomial`` and ``hinge``.
        hinge_start: ``b`` of ``hinge``.
        mixing: None: FedBuff's update (the clients' own deltas); a number ``α`` in (0, 1]: FedAsync's
            mixing ``w ← (1 - α s) w + α s w_k``.
        clock: The :class:`~lfed.participation.clock.SimulatedClock` (default: log-normal speeds).
        staleness_offset: Added to ``τ`` before ``s``: 0 (default) counts an update trained on the current model
            as ``τ = 0`` (FedBuff's reading, Nguyen et al. 2022); 1 is Xie et al. 2019's ``s(t - τ)`` with server
            epochs from 1 (Algorithm 1), whose freshest update has ``t - τ = 1`` (docs/algorithms.md §14).
    """

    name = "async"
    #: How idle clients are drawn without availability windows (lfed.participation.sampling.DRAWS): "rejection" (O(k)),
    #: or "permutation" for a run lfed 0.5 made (set when its checkpoint is loaded)
    draws = "rejection"

    def __init__(self, concurrency: int = 10, buffer: int = 10,
                 staleness: Literal["constant", "polynomial", "hinge"] = "polynomial", staleness_exponent: float = 0.5,
                 hinge_start: int = 0, mixing: float | None = None, clock: SimulatedClock | None = None,
                 staleness_offset: int = 0) -> None:
        super().__init__()
        self.staleness_offset = integer("staleness_offset", staleness_offset, at_least=0, detail=" (0: FedBuff's τ; 1: FedAsync's t - τ)")
        self.concurrency = integer("concurrency", concurrency, at_least=1)
        self.buffer = integer("buffer", buffer, at_least=1)
        if self.buffer > self.concurrency:
            raise ValueError(f"buffer: {buffer} arrivals per server step cannot exceed concurrency={concurrency} "
                             "clients in flight")
        one_of("staleness", staleness, STALENESS)
        self.staleness = staleness
        self.staleness_exponent = number("staleness_exponent", staleness_exponent, at_least=0)
        self.hinge_start = integer("hinge_start", hinge_start, at_least=0)
        if mixing is not None:
            mixing = number("mixing", mixing, above=0, at_most=1, detail=" (FedAsync's α) or None (FedBuff)")
            if self.buffer != 1:  # Xie et al. 2019 mix each arrival on its own; a mix over a buffer is no paper's
                raise ValueError(f"mixing: FedAsync mixes one arrival per server step (Xie et al. 2019, Algorithm 1), so "
                                 f"mixing needs buffer: 1, got buffer: {buffer}; for buffered updates use FedBuff "
                                 "(mixing: null)")
        self.mixing = mixing
        self.clock = clock if clock is not None else SimulatedClock()
        # the event queue: (arrival, seq, slot, client, version, steps); and the counters
        self.events: list[tuple[float, int, int, int, int, int]] = []
        self.seq = 0
        self.times: list[float] = []  # simulated time after each server step
        self._plan: list[tuple[int, float, float, int]] = []  # this step's dispatch (client, start, duration, steps)
        #: per slot: the accuracy of its client's locally trained model w_k on the client's own held-out split
        #: (docs/algorithms.md §9's local accuracy, scored at dispatch; reported when the result arrives); NaN: none
        self.local_acc: Tensor | None = None
        #: the net's buffers ``(name, shape, dtype)`` when it has running statistics (:meth:`attach`), else empty
        self.net_buffers: list[tuple[str, torch.Size, torch.dtype]] = []

    def attach(self, net: torch.nn.Module) -> None:
        """Learn the net's buffers before the state is allocated (:meth:`lfed.core.run.FederatedRun.setup`): with
        BatchNorm running statistics every slot keeps its client's buffers until it arrives (module docstring, 3.)."""
        from lfed.engine.norm import has_running_stats

        self.net_buffers = [(n, b.shape, b.dtype) for n, b in net.named_buffers()] if has_running_stats(net) else []

    # ------------------------------------------------------------------ what it is
    def structure(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "buffer": self.buffer, "mixing": self.mixing is not None}

    def hparams(self) -> dict[str, Any]:
        out = {"staleness": self.staleness, "staleness_exponent": self.staleness_exponent,
               "hinge_start": self.hinge_start, "mixing": self.mixing, "staleness_offset": self.staleness_offset}
        out.update({f"clock.{k}": v for k, v in self.clock.hparams().items()})
        return out

    def describe(self) -> str:
        """One line for the run's start-up message."""
        kind = "FedBuff" if self.mixing is None else f"FedAsync(mixing={self.mixing:g})"
        return (f"{kind}(concurrency={self.concurrency}, buffer={self.buffer}, staleness={self.staleness}, "
                f"clock={self.clock.distribution})")

    # ------------------------------------------------------------------ the schedule's reports (lfed.core.synchronous)
    #: The run's settings this schedule does not read (left out of the start-up line; warned when set explicitly).
    unused = ("fraction",)

    def composition(self) -> dict[str, str]:
        """Its entry in the run's composition line."""
        return {"asynchronous": self.describe()}

    def evaluation_metrics(self) -> dict[str, float]:
        """Every evaluation is also logged against simulated time."""
        return {"clock/time": self.now}

    def step_times(self) -> list[float]:
        """Simulated seconds after each server step."""
        return list(self.times)

    def state_specs(self) -> list[StateSpec]:
        specs = [StateSpec("update")]  # one row per slot: FedBuff Δ_k, FedAsync w_k
        if self.net_buffers:  # and its client's buffers, every one flattened (float64 holds float32 and the counts exactly)
            specs.append(StateSpec("stats", shape=(sum(math.prod(shape) for _, shape, _ in self.net_buffers),),
                                   dtype=torch.float64))
        return specs

    def _flat_buffers(self, buffers: dict[str, Tensor] | None, K: int) -> Tensor:
        """``[K, S]`` the engine's per-client buffers, flattened in the net's order (float64)."""
        if buffers is None:
            raise RuntimeError("asynchronous: the engine returned no per-client buffers for a net with running statistics")
        return torch.cat([buffers[n].reshape(K, -1).to(torch.float64) for n, _, _ in self.net_buffers], 1)

    def _unflat_buffers(self, rows: Tensor) -> dict[str, Tensor]:
        """``{name: [M, *shape]}`` of ``rows [M, S]`` (:meth:`_flat_buffers`' inverse), each in its own dtype."""
        out, lo = {}, 0
        for name, shape, dtype in self.net_buffers:
            n = math.prod(shape)
            out[name] = rows[:, lo : lo + n].reshape(rows.shape[0], *shape).to(dtype)
            lo += n
        return out

    def setup_state(self, store, num_examples: Tensor, num_params: int, like: Tensor) -> None:
        """The rows are per slot (``C``), not per client: memory ``C x P`` whatever ``N``."""
        super().setup_state(store, torch.zeros(self.concurrency, dtype=num_examples.dtype), num_params, like)

    def s(self, tau: int) -> float:
        """The staleness weight ``s(τ + staleness_offset)``."""
        return staleness_weight(tau + self.staleness_offset, self.staleness, self.staleness_exponent, self.hinge_start)

    @property
    def now(self) -> float:
        """Simulated seconds at the last server step."""
        return self.clock.now

    # ------------------------------------------------------------------ checks before round 0
    def check(self, context: CompositionContext) -> list[str]:
        """Refuse, before round 0, what is not defined asynchronously: each other component says for itself
        (:func:`asynchronous_refusal`), then the stragglers and ``C <= N``; warn of a fraction, which is not used."""
        for role, component in (context.components or {}).items():
            reason = None if component is self else asynchronous_refusal(component, self)
            if reason:
                raise ValueError(f"asynchronous: {role}: {reason}")
        if context.p_inactive > 0 or context.p_incomplete > 0:
            raise ValueError("asynchronous: p_inactive / p_incomplete: the simulated clock is the asynchronous run's "
                             "straggler model; set them to 0")
        if context.num_clients is not None and self.concurrency > context.num_clients:
            raise ValueError(f"asynchronous: concurrency: {self.concurrency} clients in flight, but the data has "
                             f"{context.num_clients} clients")
        if context.num_clients is not None:  # its files (durations, traces) read and checked now, not at dispatch
            self.clock.check_files(context.num_clients)
        if "fraction" in context.explicit:
            return ["fraction is not used by asynchronous training: concurrency and buffer set who trains"]
        return []

    # ------------------------------------------------------------------ one server step
    def _in_flight(self) -> tuple[set[int], set[int]]:
        return {e[3] for e in self.events}, {e[2] for e in self.events}

    def _dispatch_plan(self, run: Any, step: int) -> list[tuple[int, float, float, int]]:
        """Who is dispatched at server step ``step``: ``(client, start, duration, steps)`` sorted by client.

        Without availability windows every one of the ``k = C - in flight`` clients starts now. With windows
        (FedScale's rule, :mod:`lfed.participation.clock`) only the clients available at a time are drawn (in the step's
        ``randperm`` order); while slots are free and fewer than ``M`` arrivals precede it, the server waits for the
        next window to open and dispatches there, still with the model ``w^t`` (no server step came between).
        Slots still free when the ``M``-th arrival comes first stay free until the next step."""
        from lfed.rng import round_generator

        data, clock, now = run.data, self.clock, self.clock.now
        N = data.num_clients
        busy, _ = self._in_flight()
        k = self.concurrency - len(self.events)
        g = round_generator(run.seed, step, "sample")
        if not clock.windows and self.draws != "permutation":  # k of the idle clients in O(k), as the uniform sampler
            perm = uniform_draw(N, k, g, exclude=torch.tensor(sorted(busy), dtype=torch.long))
        else:  # availability windows order every idle client by its next window (and lfed 0.5's draws: randperm)
            perm = torch.randperm(N, generator=g)
            if busy:
                perm = perm[~torch.isin(perm, torch.tensor(sorted(busy), dtype=perm.dtype))]
        sizes = data.host("client_sizes")
        bits = model_bits(run.layout.num_params, next(run.net.parameters()).dtype)  # a device trace's download and upload

        def batch(clients: Tensor, t: float, generator: torch.Generator | None) -> list[tuple[int, float, float, int]]:
            clients = clients.sort().values
            steps = run.training_plan.step_budget(sizes[clients])
            d = clock.durations(clients, steps, step, run.seed, N, generator=generator, num_examples=sizes[clients],
                                batch_size=run.training_plan.batch_size, bits=bits)
            return [(int(c), t, float(x), int(n)) for c, x, n in zip(clients.tolist(), d.tolist(), steps.tolist())]

        if not clock.windows:
            return batch(perm[:k], now, None)
        generator = round_generator(run.seed, step, "clock")
        opens = clock.next_available(perm, now, run.seed, N).tolist()
        arrivals = sorted(e[0] for e in self.events)
        plan: list[tuple[int, float, float, int]] = []
        order = sorted(range(perm.numel()), key=lambda i: (opens[i], i))  # by opening time, then the draw's order
        i = 0
        while i < len(order) and len(plan) < k:
            t = opens[order[i]]
            if t > now:  # wait for this window only while fewer than M arrivals come before it
                server_step = arrivals[self.buffer - 1] if len(arrivals) >= self.buffer else float("inf")
                if t >= server_step:  # the M-th arrival comes first: the rest wait for the next model
                    break
            j = i
            while j < len(order) and opens[order[j]] == t:
                j += 1
            new = batch(perm[order[i:j][: k - len(plan)]], t, generator)
            plan += new
            arrivals = sorted(arrivals + [start + d for _, start, d, _ in new])
            i = j
        return sorted(plan)

    def dispatch(self, run: Any, step: int, total_rounds: int | None, ranks: Any = None) -> Any:
        """Dispatch clients to keep ``C`` in flight with the current model: the engine job of the step."""
        from lfed.core.round import prepare_round

        self._plan = self._dispatch_plan(run, step)
        w = run.layout.module_vector(run.net)
        if not self._plan:  # availability windows: nobody available before the buffer fills
            return _NoDispatch(step, w, list(run.layout.sizes))
        clients = torch.tensor([c for c, *_ in self._plan], dtype=torch.long)
        budget = torch.tensor([n for *_, n in self._plan], dtype=torch.long)
        return prepare_round(run.components, w, run.data, run.training_plan, run.engine,
                             round=step, seed=run.seed, clients=clients, steps_done=budget, total_rounds=total_rounds,
                             sizes=run.layout.sizes, ranks=ranks)

    def arrivals(self, run: Any, prepared: Any, result: Any, ranks: Any) -> Any:
        """Queue the dispatched clients' results, pop the ``M`` earliest arrivals: what the server steps on
        (:class:`lfed.core.round.Uploads`; the server half is the synchronous round's, :func:`lfed.core.round.server_update`)."""
        from lfed.core.record import RoundRecord
        from lfed.core.round import Uploads, draw_cohort

        alg, data = run.components, run.data
        idle = isinstance(prepared, _NoDispatch)
        if prepared.skipped and not idle:
            raise RuntimeError("asynchronous: a dispatch trained nobody (every dispatched client has a zero budget)")
        step, w = (prepared.round, prepared.w) if idle else (prepared.record.round, prepared.w)
        device = w.device
        rows = None
        dispatched = 0
        if not idle:
            job, host = prepared.job, prepared.record.cohort.host_values()
            # 1. the dispatched clients' results wait in free slots until their arrival times
            _, used = self._in_flight()
            free = [i for i in range(self.concurrency) if i not in used][: host.clients.numel()]
            slots = torch.tensor(free, dtype=torch.long)
            rows = result.weights - job.w_start if self.mixing is None else result.weights
            device = rows.device
            self.write_rows("update", to_device(slots, device), rows)
            if self.net_buffers:  # its buffers (BatchNorm statistics) wait with its update
                self.write_rows("stats", to_device(slots, device), self._flat_buffers(result.buffers, rows.shape[0]))
            if run.round_local_accuracy and is_classification(data.train_y):  # w_k on its own split, known at dispatch
                if self.local_acc is None:
                    self.local_acc = torch.full((self.concurrency,), math.nan, dtype=torch.float64, device=device)
                self.local_acc = self.local_acc.to(device)  # restored from a checkpoint on the host
                acc = local_accuracy(run.net, run.layout, result.weights, data, prepared.record.cohort.clients,
                                     host_clients=host.clients)
                self.local_acc[to_device(slots, device)] = acc.to(self.local_acc.dtype)
            plan = {c: (t, d) for c, t, d, _ in self._plan}
            for slot, client, steps in zip(free, host.clients.tolist(), host.steps_done.tolist()):
                start, d = plan[client]
                heapq.heappush(self.events, (start + d, self.seq, slot, client, step, int(steps)))
                self.seq += 1
            dispatched = host.clients.numel()
        # 2. the M earliest arrivals, their weights a_k α s(τ_k)
        popped = [heapq.heappop(self.events) for _ in range(self.buffer)]
        self.clock.now = popped[-1][0]
        self.times.append(self.clock.now)
        clients_p = torch.tensor([e[3] for e in popped], dtype=torch.long)
        taus = [step - e[4] for e in popped]
        cohort = draw_cohort(alg, data, run.training_plan, step, run.seed, clients=clients_p,
                             steps_done=torch.tensor([e[5] for e in popped]))
        a = alg.weighting.weights(cohort, data.label_counts_of(cohort.host.clients), data.population_label_counts())
        cohort.host.counting = alg.weighting.counting(cohort).detach().cpu()
        cohort.counting = to_device(cohort.host.counting, cohort.clients.device)
        alpha = 1.0 if self.mixing is None else self.mixing
        scale = torch.tensor([alpha * self.s(t) for t in taus], dtype=torch.float64)
        if not all(x == 1.0 for x in scale.tolist()):  # s = 1 leaves the weights (and the sync case) untouched
            a = a.detach().cpu() * scale
        weights = to_device(a, cohort.clients.device)
        # 3. their uploads: FedBuff's own deltas Δ_k; FedAsync's w_k mixed against the current model, w_k - w^t
        popped_slots = to_device(torch.tensor([e[2] for e in popped]), device)  # one host-to-device copy a step
        stored = self.rows("update", popped_slots)
        updates = stored if self.mixing is None else stored - w
        bits_down = 0 if idle else prepared.record.bits_down
        record = RoundRecord(step, cohort, weights, losses=None, bits_down=bits_down)
        record.result = result
        if not idle:  # the dispatched clients' results (the popped cohort's were checked when they were dispatched)
            dispatched_clients = prepared.record.cohort.clients
            record.check(result.loss[:, None], "training losses", dispatched_clients)
            record.check(rows, "client updates", dispatched_clients)
        buffers = self._unflat_buffers(self.rows("stats", popped_slots)) if self.net_buffers else None
        metrics: dict[str, Any] = {
            "round/clients": float(len(popped)), "round/dispatched": float(dispatched),
            "round/weight_sum": weights.sum(),
            "async/staleness_mean": sum(taus) / len(taus), "async/staleness_max": float(max(taus)),
            "async/in_flight": float(len(self.events)), "clock/time": self.clock.now,
        }
        if not idle:
            metrics["train/loss"] = result.loss.mean()
        if self.local_acc is not None:  # the arrivals' local accuracy (client/local_acc_mean, bmta_local: docs/algorithms.md §9)
            metrics["client/local_acc_mean"] = torch.nanmean(self.local_acc[popped_slots.to(self.local_acc.device)])
        return Uploads(record, updates, w, prepared.sizes, buffers=buffers, label="server step",
                       warnings=[] if idle else prepared.record.warnings, measured=metrics)

    def step_metrics(self, run: Any, uploads: Any) -> dict[str, Any]:
        """The server step's metrics: arrivals, dispatches, staleness, clients in flight, simulated time, the arrivals'
        local accuracy (measured at :meth:`arrivals`)."""
        return uploads.measured

    # ------------------------------------------------------------------ checkpoint state
    def get_extra_state(self) -> dict[str, Any]:
        return {"events": [list(e) for e in self.events], "seq": self.seq, "times": list(self.times),
                "local_acc": None if self.local_acc is None else  # plain floats (None: NaN), read at a checkpoint only
                [None if math.isnan(v) else v for v in self.local_acc.tolist()]}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.events = [tuple(e) for e in state["events"]]
        heapq.heapify(self.events)
        self.seq = int(state["seq"])
        self.times = [float(t) for t in state["times"]]
        saved = state.get("local_acc")  # absent in a checkpoint written before the local accuracy was kept
        self.local_acc = None if saved is None else torch.tensor([math.nan if v is None else v for v in saved],
                                                                 dtype=torch.float64)




@dataclass
class _NoDispatch:
    """A server step that dispatches nobody (availability windows): the driver skips the engine."""

    round: int
    w: Tensor
    sizes: list[int]
    job: None = None
    skipped: bool = True


class FedBuff(Asynchronous):
    """FedBuff (Nguyen et al., AISTATS 2022): ``Δ = Σ a_k (1 + τ_k)^{-1/2} Δ_k``; the server learning rate is the
    server optimizer's (SGD ``lr = η_g``). Arguments as :class:`Asynchronous` without ``mixing``."""

    def __init__(self, concurrency: int = 10, buffer: int = 10,
                 staleness: Literal["constant", "polynomial", "hinge"] = "polynomial", staleness_exponent: float = 0.5,
                 hinge_start: int = 0, clock: SimulatedClock | None = None, staleness_offset: int = 0) -> None:
        super().__init__(concurrency, buffer, staleness, staleness_exponent, hinge_start, None, clock, staleness_offset)


class FedAsync(Asynchronous):
    """FedAsync (Xie, Koyejo, Gupta 2019): ``M = 1``, ``w ← (1 - α s(τ)) w + α s(τ) w_k`` (server SGD ``lr = 1``).

    Args:
        concurrency: ``C``, clients in flight.
        mixing: ``α`` in (0, 1].
        staleness, staleness_exponent, hinge_start: ``s(τ)`` (FedAsync's hinge: ``a``, ``b``).
        clock: The simulated clock.
        staleness_offset: 0 (default, lfed's reading: a fresh update has ``τ = 0``) or 1 (the paper's ``t - τ``).
    """

    def __init__(self, concurrency: int = 10, mixing: float = 0.6,
                 staleness: Literal["constant", "polynomial", "hinge"] = "hinge", staleness_exponent: float = 0.5,
                 hinge_start: int = 4, clock: SimulatedClock | None = None, staleness_offset: int = 0) -> None:
        super().__init__(concurrency, 1, staleness, staleness_exponent, hinge_start, mixing, clock, staleness_offset)
