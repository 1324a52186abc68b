"""A one-run audit of example-level DP-SGD by canary examples (Steinke, Nasr, Jagielski, NeurIPS 2023).

The audit of :mod:`lfed.privacy.audit` with the example as the unit of privacy: ``m`` canary *examples* are given to
one client (``canary_client``), each included independently with probability 1/2. A canary is a gradient canary
(their white-box "Dirac" canaries, §6): its gradient is always ``C·u_i``, ``u_i`` a fixed random unit direction of the
trainable parameters, so clipping leaves it as it is. Like every example of that client, an included canary is in
each local step's Poisson batch with probability ``q_k = min(1, B/n_k)`` (``n_k`` the client's real examples: the rate
its accountant uses), and its gradient is added to the step's clipped sum before the noise
(:attr:`lfed.engine.example_dp.ExampleNoise.planted`). The auditor is the server (example-level DP's adversary sees
every client's upload): it scores canary ``i`` by ``-cos(u_i, Σ_t Δ_t)``, ``Δ_t`` the canary client's upload of round
``t`` (an SGD step moves against the gradient), and the bound is the one of
:func:`lfed.privacy.audit.epsilon_lower_bound`, against the canary client's ε. The canaries stand out of the
client's real gradients by about ``√P / n_k`` (a real step's projection on a random direction is ``~C/√P``, a
canary's ``q C / B = C / n_k``): audit a small client of a model with many parameters.

Planted leaks check that the audit sees a broken mechanism: ``no_noise`` (the steps are not noised; the accountant
still counts ``σ``), ``no_clip`` (the canaries' gradients, of norm 10·C, are not clipped).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lfed.checks import integer
from lfed.engine.example_dp import sampling_rate
from lfed.engine.host import values
from lfed.privacy.audit import Canaries
from lfed.privacy.dp_sgd import DPSGD
from lfed.rng import round_generator

__all__ = ["CanaryDPSGD"]

LEAKS = (None, "no_noise", "no_clip")


class _CanaryStream:
    """The canaries of one client in one round: at every step, each included canary is sampled with probability ``q``."""

    def __init__(self, directions: Tensor, included: Tensor, q: float, scale: float, generator: torch.Generator,
                 counts: Tensor) -> None:
        self.directions, self.included, self.q, self.scale, self.generator = directions, included, q, scale, generator
        self.counts = counts  # how often each canary was sampled (diagnostics), updated in place

    def step(self, P: int, dtype: torch.dtype) -> Tensor:
        taken = self.included & (torch.rand(self.included.numel(), generator=self.generator, dtype=torch.float64) < self.q)
        self.counts += taken.long()
        return (self.scale * self.directions[taken].sum(0)).to(dtype)


class CanaryDPSGD(Canaries, DPSGD):
    """DP-SGD with ``canaries`` canary examples in client ``canary_client`` (module docstring); after the run, :meth:`audit`.

    The canaries' inclusion, directions, guesses and bound are :class:`lfed.privacy.audit.Canaries`' (the client-level
    audits'); what differs is where a canary enters (an example of one client's DP-SGD steps) and what the auditor
    sees (that client's uploads).

    Args:
        canaries: ``m`` canary examples (each included with probability 1/2, from ``canary_seed``).
        canary_client: The client that holds them (it should take part in many rounds: the audit sees its steps only);
            None (default): the first client of the first round's cohort, so that it takes part at least once whatever
            the cohorts' draw.
        guesses: Guesses per side to try (default ``m/20``, ``m/10``, ``m/4``), each at ``beta / len(guesses)``.
        beta: ``1 -`` the bound's confidence.
        leak: None, ``"no_noise"`` or ``"no_clip"`` (planted; module docstring).
        canary_seed: The canaries' own seed.
        **dp: :class:`DPSGD`'s settings.
    """

    def __init__(self, canaries: int = 1000, canary_client: int | None = None, guesses: list[int] | None = None,
                 beta: float = 0.05, leak: str | None = None, canary_seed: int = 0, **dp: Any) -> None:
        super().__init__(**dp)  # super(): jsonargparse reads **dp through it (the config's DP-SGD settings)
        self.init_canaries(canaries, guesses, beta, leak, canary_seed, LEAKS)
        self.canary_client = None if canary_client is None else integer("canary_client", canary_client, at_least=0,
                                                                           detail=" or None (the first round's first client)")
        self.sampled = torch.zeros(self.m, dtype=torch.long)  # steps each canary was in a batch (diagnostics)
        self._directions: Tensor | None = None

    def directions(self, P: int) -> Tensor:
        """``[m, P]`` the canaries' unit directions :meth:`~lfed.privacy.audit.Canaries.direction` (made once)."""
        if self._directions is None or self._directions.shape[1] != P:
            self._directions = torch.stack([self.direction(i, P) for i in range(self.m)])
        return self._directions

    def step_rule(self, cohort, w_start: Tensor, lr: float):
        rule = super().step_rule(cohort, w_start, lr)
        dp = rule.example_dp
        clients = values(cohort.host_values().clients)
        if self.canary_client is None and clients:  # the first round's first client: it takes part at least once
            self.canary_client = int(clients[0])
        if self.canary_client in clients:
            row = clients.index(self.canary_client)
            n = int(values(cohort.host_values().num_examples)[row])
            q = sampling_rate(n, int(dp.expected_batch))
            scale = 10.0 * self.clip if self.leak == "no_clip" else self.clip
            stream = _CanaryStream(self.directions(w_start.shape[-1]), self.included, q, scale,
                                   round_generator(self.canary_seed, cohort.round, "canary-sampling"), self.sampled)
            dp.planted = [stream if i == row else None for i in range(len(clients))]
        if self.leak == "no_noise":
            dp.noise_multiplier = 0.0  # the planted leak: no noise; the accountant still counts σ
        return rule

    def end_round(self, cohort, updates: Tensor, w_old: Tensor, w_new: Tensor) -> None:
        """The auditor is the server: it sees the canary client's upload (what leaves that client) when it took part,
        and records its negative (an SGD step moves against a canary's gradient ``C·u_i``), so that
        :meth:`~lfed.privacy.audit.Canaries.scores` is the cosine of ``u_i`` and ``-Σ_t Δ_t``."""
        clients = values(cohort.host_values().clients)
        if self.canary_client in clients:
            self.record(-updates[clients.index(self.canary_client)])

    def scores(self) -> Tensor:
        """:meth:`lfed.privacy.audit.Canaries.scores`; a run in which the canary client never took part is refused in one
        line (the auditor saw nothing of it)."""
        if self.released is None:
            who = "no client was sampled" if self.canary_client is None else f"client {self.canary_client}"
            raise RuntimeError(f"canary_client: {who} took part in no round of this run, so the "
                               "auditor saw none of its uploads; choose a canary_client that takes part, or run more "
                               "rounds or a larger fraction")
        return super().scores()

    def claimed_epsilon(self) -> float:
        """The canary client's ε(δ) (its own accountant's)."""
        if self.eps is None or self.canary_client is None or self.canary_client >= self.eps.numel():
            return 0.0
        return float(self.eps[self.canary_client])
