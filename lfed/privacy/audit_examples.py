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

from lfed.checks import integer, number
from lfed.engine.example_dp import sampling_rate
from lfed.engine.host import values
from lfed.privacy.audit import AuditResult, epsilon_lower_bound, guess
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


class CanaryDPSGD(DPSGD):
    """DP-SGD with ``canaries`` canary examples in client ``canary_client`` (module docstring); after the run, :meth:`audit`.

    Args:
        canaries: ``m`` canary examples (each included with probability 1/2, from ``canary_seed``).
        canary_client: The client that holds them (it should take part in many rounds: the audit sees its steps only).
        guesses: Guesses per side to try (default ``m/20``, ``m/10``, ``m/4``), each at ``beta / len(guesses)``.
        beta: ``1 -`` the bound's confidence.
        leak: None, ``"no_noise"`` or ``"no_clip"`` (planted; module docstring).
        canary_seed: The canaries' own seed.
        **dp: :class:`DPSGD`'s settings.
    """

    def __init__(self, canaries: int = 1000, canary_client: int = 0, guesses: list[int] | None = None,
                 beta: float = 0.05, leak: str | None = None, canary_seed: int = 0, **dp: Any) -> None:
        super().__init__(**dp)
        self.m = integer("canaries", canaries, at_least=2)
        self.canary_client = integer("canary_client", canary_client, at_least=0)
        ks = [max(1, canaries // 20), max(1, canaries // 10), max(1, canaries // 4)] if guesses is None else list(guesses)
        for k in ks:
            integer("guesses", k, at_least=1)
            if 2 * k > canaries:
                raise ValueError(f"guesses: {k} per side is more than half of the {canaries} canaries")
        self.guesses = sorted(set(ks))
        self.beta = number("beta", beta, above=0, below=1)
        if leak not in LEAKS:
            raise ValueError(f"leak: {leak!r} is not one of {LEAKS}")
        self.leak = leak
        self.canary_seed = integer("canary_seed", canary_seed, at_least=0)
        g = round_generator(self.canary_seed, 0, "canary-inclusion")
        self.included = torch.rand(self.m, generator=g, dtype=torch.float64) < 0.5
        self.sampled = torch.zeros(self.m, dtype=torch.long)
        self.released: Tensor | None = None  # Σ_t (w_{t+1} - w_t), float64
        self._directions: Tensor | None = None

    def directions(self, P: int) -> Tensor:
        """``[m, P]`` the canaries' unit directions (float64, their own stream)."""
        if self._directions is None or self._directions.shape[1] != P:
            u = torch.randn(self.m, P, generator=round_generator(self.canary_seed, 0, "canary-direction"),
                            dtype=torch.float64)
            self._directions = u / torch.linalg.vector_norm(u, dim=1, keepdim=True)
        return self._directions

    def step_rule(self, cohort, w_start: Tensor, lr: float):
        rule = super().step_rule(cohort, w_start, lr)
        dp = rule.example_dp
        clients = values(cohort.host_values().clients)
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
        """The auditor is the server: it sees the canary client's upload (what leaves that client) when it took part."""
        clients = values(cohort.host_values().clients)
        if self.canary_client not in clients:
            return
        mine = updates[clients.index(self.canary_client)].detach().double().cpu()
        self.released = mine if self.released is None else self.released + mine

    def scores(self) -> Tensor:
        """``[m]``: ``-cos(u_i, Σ_t Δ_t)`` (an included canary pushes the client's model against its direction)."""
        if self.released is None:
            raise RuntimeError("canaries: no round has run; there is nothing to score")
        total = self.released
        norm = float(torch.linalg.vector_norm(total)) or 1.0
        return -(self.directions(total.numel()) @ total) / norm

    def client_epsilon_of_canaries(self) -> float:
        """The canary client's ε(δ) (its accountant's)."""
        return float(self.state("dp_epsilon")[self.canary_client])

    def audit(self) -> AuditResult:
        """ε_lower against the canary client's ε at δ (:class:`lfed.privacy.audit.AuditResult`)."""
        scores = self.scores()
        beta = self.beta / len(self.guesses)
        per_k = {}
        for k in self.guesses:
            r, v = guess(scores, self.included, k, k)
            per_k[k] = (v, epsilon_lower_bound(self.m, r, v, self.delta, beta))
        k = max(per_k, key=lambda key: (per_k[key][1], -key))
        return AuditResult(epsilon=self.client_epsilon_of_canaries(), epsilon_lower=per_k[k][1], delta=self.delta,
                           beta=self.beta, m=self.m, included=int(self.included.sum()), k=k, r=2 * k, v=per_k[k][0],
                           per_k=per_k)
