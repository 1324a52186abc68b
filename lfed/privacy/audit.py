"""A one-run privacy audit of DP-FedAvg by canary clients (Steinke, Nasr, Jagielski, NeurIPS 2023).

Steinke, Nasr, Jagielski, *Privacy Auditing with One (1) Training Run* (NeurIPS 2023): ``m`` canaries are each
included in the training data independently with probability 1/2 (``S_i`` uniform on {in, out}); after one run
the auditor scores every canary, guesses "in" for the ``k₊`` highest scores and "out" for the ``k₋`` lowest
(abstaining on the rest: ``r = k₊ + k₋`` guesses) and counts ``v`` correct ones. If the run is (ε, δ)-DP in each
canary, their Theorem 5.2 bounds the chance of ``v`` or more correct guesses:

    P[V ≥ v] ≤ p(ε, δ) = P[Bin(r, q_ε) ≥ v] + 2mδ · max_{1≤i≤v} (1/i) · P[v - i ≤ Bin(r, q_ε) < v],
    q_ε = e^ε / (1 + e^ε)

(the ``δ = 0`` case is their Theorem 3.1: ``V`` is stochastically dominated by ``Bin(r, q_ε)``, the accuracy of
ε-DP randomized response). :func:`p_value` is this bound, as their Appendix D computes it; the audit's lower bound
at confidence ``1 - β`` is the largest ε the observation rejects, ``ε_lower = sup{ε : p(ε, δ) < β}``
(:func:`epsilon_lower_bound`, by bisection as in their Appendix D): the run is not (ε, δ)-DP for any ε below it,
except with probability β.

Canaries in federated learning are clients (the unit of privacy): :class:`CanaryDPFedAvg` is DP-FedAvg with ``m``
canary clients beside the real ones. Canary ``i`` always uploads the same update ``C·u_i``, ``u_i`` a fixed random
unit direction of the shared parameters (its own seeded stream); an included canary takes part in each round
independently with the run's rate ``q``, as every client does under Poisson sampling, and is clipped, summed and
noised with the cohort. The auditor sees the released aggregates ``Δ_t`` and scores canary ``i`` by the cosine of
``u_i`` and ``Σ_t Δ_t`` (the global model's change, with a plain server step). Planted leaks check that the audit
can see a broken release: ``leak="no_noise"`` skips the server noise while the accountant still counts it,
``leak="no_clip"`` lets the canaries' updates (10·C) through unclipped. The canary machinery is the mixin
:class:`Canaries`; :class:`CanaryDistributedDP` audits distributed DP (:mod:`lfed.privacy.distributed_dp`) with it,
with one more planted leak, ``plaintext`` (the canaries' uploads seen in the clear beside the secure sum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from lfed.base.component import HostCohort
from lfed.checks import integer, number
from lfed.privacy.distributed_dp import DistributedDP
from lfed.privacy.dp_fedavg import DPFedAvg
from lfed.rng import round_generator

__all__ = ["AuditResult", "Canaries", "CanaryDPFedAvg", "CanaryDistributedDP", "epsilon_lower_bound", "guess", "p_value"]

LEAKS = (None, "no_noise", "no_clip")
#: The planted leaks of the distributed-DP audit.
DDP_LEAKS = (None, "no_noise", "no_clip", "plaintext")


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Steinke et al.'s Theorem 5.2 bound on ``P[V ≥ v]`` for an (ε, δ)-DP run (module docstring).

    Args:
        m: Canaries (each included independently with probability 1/2).
        r: Guesses (abstentions excluded), ``0 ≤ v ≤ r ≤ m``.
        v: Correct guesses.
        epsilon, delta: The null hypothesis, (ε, δ)-DP.
    """
    from scipy.stats import binom

    if not 0 <= v <= r <= m:
        raise ValueError(f"v, r, m: need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    number("epsilon", epsilon, at_least=0)
    number("delta", delta, at_least=0, below=1)
    q = 1.0 / (1.0 + math.exp(-epsilon))  # the accuracy of ε-DP randomized response
    tail = float(binom.sf(v - 1, r, q))  # P[Bin(r, q) >= v]
    if delta == 0:
        return min(tail, 1.0)
    alpha, below = 0.0, 0.0  # below = P[v > Bin(r, q) >= v - i]
    for i in range(1, v + 1):
        below += float(binom.pmf(v - i, r, q))
        alpha = max(alpha, below / i)
    return min(tail + 2 * m * delta * alpha, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, beta: float = 0.05) -> float:
    """``sup{ε : p(ε, δ) < β}``: the run is not (ε, δ)-DP for any smaller ε, at confidence ``1 - β`` (0 if the
    observation rejects no ε). ``p`` grows with ε; bisection to 1e-6 (Steinke et al., Appendix D)."""
    number("beta", beta, above=0, below=1)
    if p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) < beta:
        lo, hi = hi, hi * 2
        if hi > 1e3:  # every guess right with too few guesses to bound anything finite is not possible; a guard
            return math.inf
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p_value(m, r, v, mid, delta) < beta else (lo, mid)
    return lo


def guess(scores: Tensor, included: Tensor, k_in: int, k_out: int) -> tuple[int, int]:
    """``(r, v)``: guess "in" for the ``k_in`` highest ``scores``, "out" for the ``k_out`` lowest; ``v`` of the
    ``r = k_in + k_out`` guesses agree with ``included`` (ties broken by the canary's index)."""
    m = scores.numel()
    if k_in + k_out > m:
        raise ValueError(f"guesses: {k_in} + {k_out} guesses of {m} canaries")
    order = torch.sort(scores.double().cpu(), stable=True).indices
    inc = included.bool().cpu()
    v = int(inc[order[m - k_in:]].sum()) + int((~inc[order[:k_out]]).sum())  # order[m:] is empty when k_in = 0
    return k_in + k_out, v


@dataclass
class AuditResult:
    """One audit: ``epsilon`` the accountant's ε at ``delta``, ``epsilon_lower`` the audit's lower bound at
    confidence ``1 - beta`` (the largest over ``guesses``, each tested at ``beta / len(guesses)``: a union bound),
    ``k`` the guesses per side that gave it, ``r`` and ``v`` its guesses and correct ones, ``m`` canaries, ``included``
    how many were in; ``per_k``: ``{k: (v, ε_lower)}``."""

    epsilon: float
    epsilon_lower: float
    delta: float
    beta: float
    m: int
    included: int
    k: int
    r: int
    v: int
    per_k: dict[int, tuple[int, float]]


class Canaries:
    """The canary clients of an audit, for any private server combination (a mixin, first in the bases; module
    docstring): their inclusion ``S_i``, directions ``u_i``, per-round participation, their rows appended to the
    cohort (:meth:`with_canaries`), what the auditor saw (:attr:`released`, and :attr:`plaintext` where a planted leak
    shows it uploads in the clear), the scores and the audit. The combination supplies ``accountant``, ``delta`` and
    ``clip`` (the canaries' update norm ``C``)."""

    def init_canaries(self, canaries: int, guesses: list[int] | None, beta: float, leak: str | None,
                      canary_seed: int, leaks: tuple) -> None:
        self.m = integer("canaries", canaries, at_least=2)
        ks = [max(1, canaries // 20), max(1, canaries // 10), max(1, canaries // 4)] if guesses is None else list(guesses)
        for k in ks:
            integer("guesses", k, at_least=1)
            if 2 * k > canaries:
                raise ValueError(f"guesses: {k} per side is more than half of the {canaries} canaries")
        self.guesses = sorted(set(ks))
        self.audit_beta = number("beta", beta, above=0, below=1)  # not .beta: a combination may have its own
        if leak not in leaks:
            raise ValueError(f"leak: {leak!r} is not one of {leaks}")
        self.leak = leak
        self.canary_seed = integer("canary_seed", canary_seed, at_least=0)
        g = round_generator(self.canary_seed, 0, "canary-inclusion")
        self.included = torch.rand(self.m, generator=g, dtype=torch.float64) < 0.5  # S_i
        self.released: Tensor | None = None  # Σ_t Δ_t, float64
        self.plaintext: Tensor | None = None  # Σ_t of the uploads a planted leak showed in the clear
        self.canary_rounds = torch.zeros(self.m, dtype=torch.long)  # rounds each canary took part in (diagnostics)

    def direction(self, i: int, P: int) -> Tensor:
        """``u_i``: canary ``i``'s unit direction in the ``P`` shared parameters (float64, its own stream)."""
        u = torch.randn(P, generator=round_generator(self.canary_seed, i, "canary-direction"), dtype=torch.float64)
        return u / torch.linalg.vector_norm(u)

    def taking_part(self, cohort) -> Tensor:
        """The ids of the included canaries that take part in the round (each with the run's rate ``q``)."""
        q = float(cohort.expected_size) / cohort.num_clients
        g = round_generator(self.canary_seed, cohort.round, "canary-sampling")
        taking_part = self.included & (torch.rand(self.m, generator=g, dtype=torch.float64) < q)
        self.canary_rounds += taking_part.long()
        return taking_part.nonzero().squeeze(1)

    def canary_rows(self, ids: Tensor, P: int, norm: float) -> Tensor:
        """``[n, P]`` the canaries' updates ``norm · u_i``."""
        return (torch.stack([self.direction(int(i), P) for i in ids]) * norm if ids.numel()
                else torch.zeros(0, P, dtype=torch.float64))

    @staticmethod
    def with_canaries(updates: Tensor, weights: Tensor | None, cohort, ids: Tensor, rows: Tensor):
        """The cohort's updates, weights (canaries weigh 0 before the combination's own) and cohort with the canaries
        appended as counting clients (ids ``N + i``, one example, one step)."""
        n = ids.numel()
        host = cohort.host_values()
        ones = torch.ones(n, dtype=host.num_examples.dtype)
        more_host = HostCohort(torch.cat([host.clients, cohort.num_clients + ids]),
                               torch.cat([host.num_examples, ones]), torch.cat([host.step_budget, ones]),
                               torch.cat([host.steps_done, ones.to(host.steps_done.dtype)]),
                               torch.cat([host.counting, torch.ones(n, dtype=torch.bool)]))
        dev = updates.device
        more = replace(cohort, clients=more_host.clients.to(dev), num_examples=more_host.num_examples.to(dev),
                       step_budget=more_host.step_budget.to(dev), steps_done=more_host.steps_done.to(dev),
                       counting=more_host.counting.to(dev), host=more_host)
        all_updates = torch.cat([updates, rows.to(dev, updates.dtype)])
        all_weights = None if weights is None else torch.cat([weights, torch.zeros(n, dtype=weights.dtype,
                                                                                   device=weights.device)])
        return all_updates, all_weights, more

    def record(self, delta: Tensor, plaintext: Tensor | None = None) -> None:
        """What the auditor saw this round: the release ``Δ_t`` (and the uploads a leak showed in the clear)."""
        self.released = delta.double().cpu() if self.released is None else self.released + delta.double().cpu()
        if plaintext is not None:
            p = plaintext.double().cpu()
            self.plaintext = p if self.plaintext is None else self.plaintext + p

    def scores(self) -> Tensor:
        """``[m]`` the cosine of each canary's direction and what the auditor saw, ``Σ_t Δ_t`` (plus the uploads it saw
        in the clear, under the planted ``plaintext`` leak)."""
        if self.released is None:
            raise RuntimeError("canaries: no round has run; there is nothing to score")
        total = self.released if self.plaintext is None else self.released + self.plaintext
        norm = float(torch.linalg.vector_norm(total)) or 1.0
        P = total.numel()
        return torch.tensor([float(self.direction(i, P) @ total) / norm for i in range(self.m)], dtype=torch.float64)

    def claimed_epsilon(self) -> float:
        """The ε the audit tests: the mechanism's accountant's at the run's δ."""
        return self.accountant.epsilon(self.delta)

    def audit(self) -> AuditResult:
        """The audit of the run so far (:class:`AuditResult`): ε_lower against :meth:`claimed_epsilon`."""
        scores = self.scores()
        beta = self.audit_beta / len(self.guesses)
        per_k = {}
        for k in self.guesses:
            r, v = guess(scores, self.included, k, k)
            per_k[k] = (v, epsilon_lower_bound(self.m, r, v, self.delta, beta))
        k = max(per_k, key=lambda key: (per_k[key][1], -key))
        return AuditResult(epsilon=self.claimed_epsilon(), epsilon_lower=per_k[k][1], delta=self.delta,
                           beta=self.audit_beta, m=self.m, included=int(self.included.sum()), k=k, r=2 * k, v=per_k[k][0],
                           per_k=per_k)


class CanaryDPFedAvg(Canaries, DPFedAvg):
    """DP-FedAvg with ``canaries`` canary clients (module docstring); after the run, :meth:`audit`.

    Args:
        canaries: ``m``, the canary clients (each included with probability 1/2, from ``canary_seed``).
        guesses: Guesses per side ``k`` to try (each "in" for the top ``k``, "out" for the bottom ``k``); the bound
            takes the best, each at ``beta / len(guesses)`` (default: ``m/20``, ``m/10`` and ``m/4``).
        beta: ``1 -`` the confidence of the bound (0.05: 95%).
        leak: None (the mechanism as it is), ``"no_noise"`` (planted: the server noise skipped but accounted) or
            ``"no_clip"`` (planted: the canaries' updates, of norm 10·C, not clipped).
        canary_seed: The canaries' own seed (directions, inclusion, participation).
        **dp: :class:`DPFedAvg`'s settings (a fixed clip and server noise: adaptive clipping and local DP are not
            audited here).
    """

    name = "dp"

    def __init__(self, canaries: int = 1000, guesses: list[int] | None = None, beta: float = 0.05,
                 leak: str | None = None, canary_seed: int = 0, **dp: Any) -> None:
        super().__init__(**dp)  # super(), not DPFedAvg.__init__: jsonargparse reads **dp through it (the config's settings)
        self.init_canaries(canaries, guesses, beta, leak, canary_seed, LEAKS)
        if self.target_quantile is not None or self.local_noise > 0:
            raise ValueError("canaries: the audit is of DP-FedAvg with a fixed clip and server noise "
                             "(no target_quantile, no local_noise)")

    def combine(self, updates, weights, cohort):
        K, P = updates.shape
        ids = self.taking_part(cohort)
        C = self.clip0
        scale = 10.0 * C if self.leak == "no_clip" else C
        rows = self.canary_rows(ids, P, scale)
        n = ids.numel()
        all_updates, all_weights, more = self.with_canaries(updates, weights, cohort, ids, rows)
        dev = updates.device
        kept = self.update_multiplier
        if self.leak == "no_noise":
            self.update_multiplier = 0.0  # the planted leak: no noise; the accountant still steps with z
        try:
            delta, attention = DPFedAvg.combine(self, all_updates, all_weights, more)
        finally:
            self.update_multiplier = kept
        if self.leak == "no_clip" and n:  # the planted leak: the canaries' rows as they are, not clipped to C
            m = float(cohort.expected_size)
            delta = delta + ((rows - rows * (C / scale)).sum(0) / m).to(dev, delta.dtype)
        self.record(delta)
        return delta, attention


class CanaryDistributedDP(Canaries, DistributedDP):
    """Distributed DP (:class:`~lfed.privacy.distributed_dp.DistributedDP`) with ``canaries`` canary clients; after
    the run, :meth:`audit`.

    A canary takes part as a client (clipped, rotated, rounded, masked and summed with the cohort) but adds no noise
    share: the noise is the real cohort's, which the accountant counts, so each canary's inclusion is a neighbouring
    input of the accounted mechanism. Planted leaks: ``no_noise`` (the clients skip their noise shares, the accountant
    still counts them), ``no_clip`` (the canaries' updates, of norm 10·C, neither clipped nor norm-checked) and
    ``plaintext`` (secure aggregation broken for the canaries: the server sees each taking-part canary's upload in the
    clear beside the sum, and the auditor adds it to what it scores).

    Args:
        canaries, guesses, canary_seed: As :class:`CanaryDPFedAvg`'s.
        audit_beta: ``1 -`` the confidence of the bound (``beta`` is distributed DP's rounding setting).
        leak: None, ``no_noise``, ``no_clip`` or ``plaintext``.
        **ddp: :class:`~lfed.privacy.distributed_dp.DistributedDP`'s settings.
    """

    name = "distributed_dp"

    def __init__(self, canaries: int = 1000, guesses: list[int] | None = None, audit_beta: float = 0.05,
                 leak: str | None = None, canary_seed: int = 0, **ddp: Any) -> None:
        super().__init__(**ddp)  # super(): jsonargparse reads **ddp through it
        self.init_canaries(canaries, guesses, audit_beta, leak, canary_seed, DDP_LEAKS)

    def combine(self, updates, weights, cohort):
        K, P = updates.shape
        ids = self.taking_part(cohort)
        n = ids.numel()
        rows = self.canary_rows(ids, P, 10.0 * self.clip if self.leak == "no_clip" else self.clip)
        all_updates, all_weights, more = self.with_canaries(updates, weights, cohort, ids, rows)
        real = torch.cat([torch.ones(K, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)])
        delta, attention = DistributedDP.combine(self, all_updates, all_weights, more, noisy=real,
                                                 skip_noise=self.leak == "no_noise",
                                                 unclipped=~real if self.leak == "no_clip" else None)
        self.record(delta, rows.sum(0) if self.leak == "plaintext" and n else None)
        return delta, attention
