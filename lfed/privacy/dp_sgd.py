"""Example-level DP: DP-SGD (Abadi et al. 2016) in every client's local steps, each client its own accountant.

The unit of privacy is one **example** of one client (each silo protects its own records; the server, the other
clients and whoever sees the models are the adversary). Every local step is DP-SGD on the client's data
(:mod:`lfed.engine.example_dp`: Poisson batches at rate ``q_k = min(1, B/n_k)``, per-example clipping to ``C``,
Gaussian noise ``σC``, the expected batch ``B`` as divisor); the cohort's per-example gradients are one more
``vmap`` inside the engine's ``vmap`` over clients. Whatever leaves a client afterwards (its update, anything the
server computes from the updates) is post-processing of its DP-SGD steps.

**Accounting.** Client ``k``'s steps are a composition of Poisson-subsampled Gaussian mechanisms ``(q_k, σ)`` on its
own dataset; its ε after ``S_k`` steps (all rounds it trained in) at δ is dp-accounting's RDP accountant composing
``PoissonSampledDpEvent(q_k, GaussianDpEvent(σ))`` ``S_k`` times (:func:`lfed.privacy.accountant.epsilon`). The run
logs the largest and the median ε over the clients that have trained, and ends with their distribution
(``final/example_epsilon_{max,p90,median,min}``). ``n_k`` (and hence ``q_k``) is taken as public, as Opacus and every
DP-SGD accountant take the dataset's size.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from lfed.base.declaration import Declaration, Releases, Supports, declaration
from lfed.checks import number
from lfed.client.objectives import ClientRule
from lfed.engine.example_dp import ExampleNoise, expected_batch_check, sampling_rate
from lfed.engine.host import values
from lfed.engine.rule import StepRule
from lfed.privacy.accountant import ACCOUNTANTS, epsilon
from lfed.privacy.releases import SETTINGS
from lfed.rng import NOISE_MODES, PrivateStreams

__all__ = ["DPSGD"]


class DPSGD(ClientRule):
    """Local DP-SGD (module docstring): FedAvg's local SGD, or FedProx's with ``mu > 0``, on privatized gradients.

    Args:
        noise_multiplier: ``σ >= 0`` (0: clipping only, ε = inf).
        clip: ``C > 0``, the per-example L2 clip.
        delta: ``δ`` in (0, 1) of every client's ε (default 1e-5: below ``1/n_k`` for clients of up to 10⁵ examples).
        mu: FedProx's proximal coefficient ``μ >= 0`` (0: plain local SGD); the prox step reads only the broadcast
            model, so it is post-processing of the private gradient.
        accountant: ``rdp`` (default; each ``(q_k, σ)`` computed once) or ``pld`` (tighter, slower: per client).
        noise: ``seeded`` (default; reproducible, exact resume) or ``secure`` (the operating system's randomness),
            as :class:`lfed.privacy.DPFedAvg`'s.
        log_unaccounted: False (default): only metrics computed from private releases or server-held data are logged;
            True: the rest too, marked ``unaccounted/`` (the training loss is read from the clients' data without noise).
    """

    name = "dp_sgd"

    def __init__(self, noise_multiplier: float = 1.0, clip: float = 1.0, delta: float = 1e-5, mu: float = 0.0,
                 accountant: str = "rdp", noise: str = "seeded", log_unaccounted: bool = False) -> None:
        super().__init__()
        self.noise_multiplier = number("noise_multiplier", noise_multiplier, at_least=0)
        self.clip = number("clip", clip, above=0)
        self.delta = number("delta", delta, above=0, below=1)
        self.mu = number("mu", mu, at_least=0)
        if accountant not in ACCOUNTANTS:
            raise ValueError(f"accountant: {accountant!r} is not one of {ACCOUNTANTS}")
        self.accountant = accountant
        if noise not in NOISE_MODES:
            raise ValueError(f"noise: {noise!r} is not one of {NOISE_MODES} (seeded: reproducible from the run's seed; "
                             "secure: the operating system's cryptographic randomness)")
        if not isinstance(log_unaccounted, bool):
            raise ValueError(f"log_unaccounted: must be true or false, got {log_unaccounted!r}")
        self.noise, self.log_unaccounted = noise, log_unaccounted
        self.streams = PrivateStreams(noise)
        self.batch_size: int | None = None  # the run's B (check)
        self._eps_cache: dict[tuple[float, int], float] = {}
        self.steps: Tensor | None = None  # the ledger (_ledger): S_k per client, host float64
        self.eps: Tensor | None = None  # ε_k(δ) per client, host float64

    # ------------------------------------------------------------------ declarations
    def hparams(self) -> dict:
        return {"noise_multiplier": self.noise_multiplier, "clip": self.clip, "delta": self.delta, "mu": self.mu,
                "accountant": self.accountant, "noise": self.noise}

    def structure(self) -> dict:
        return {"example_dp": True}

    #: What :meth:`report` and :meth:`summary` compute from public settings and the clients' step counts alone.
    PRIVATE_METRICS = ("privacy/example_epsilon_max", "privacy/example_epsilon_median", "privacy/example_noise_multiplier",
                       "final/example_*")

    @property
    def declares(self) -> Declaration:  # type: ignore[override]
        """The run's metrics are gated (:mod:`lfed.base.metric_gate`): ``mark`` with ``log_unaccounted``, else ``drop``;
        not defined asynchronously."""
        return Declaration(releases=Releases(private_metrics=self.PRIVATE_METRICS,
                                             metric_policy="mark" if self.log_unaccounted else "drop"),
                           supports=Supports(asynchronous="(example-level DP-SGD) is not implemented asynchronously yet"))

    # The per-client ledger lives on the host (float64 ``[N]`` steps and ε): the accountant is host arithmetic and
    # every value it needs (the cohort's ids, sizes and steps done) is a host value of the round, so no round reads
    # the device for it. A checkpoint keeps it in the component's extra state, classified as client data
    # (lfed.privacy.contents: who trained, and how often).

    def _ledger(self, num_clients: int) -> None:
        """Make (or grow to ``num_clients``) the ledger: ``steps [N]`` (``S_k``) and ``eps [N]`` (``ε_k(δ)``)."""
        have = 0 if self.steps is None else self.steps.numel()
        if num_clients > have:
            grow = torch.zeros(num_clients - have, dtype=torch.float64)
            self.steps = grow if self.steps is None else torch.cat([self.steps, grow])
            self.eps = grow.clone() if self.eps is None else torch.cat([self.eps, grow])

    def get_extra_state(self) -> dict[str, Any]:
        return {"ledger": {"steps": self.steps, "epsilon": self.eps}}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.steps, self.eps = state["ledger"]["steps"], state["ledger"]["epsilon"]

    # ------------------------------------------------------------------ before round 0
    def check(self, context) -> list[str]:
        """Refuse what the per-client accountants would not cover; key the noise streams by the run's settings; warn of
        DP-SGD without noise."""
        out = super().check(context)
        training = getattr(context, "training", None)
        if training is not None:
            self.batch_size = expected_batch_check(training.batch_size)
        for role, component in (context.components or {}).items():
            if role == "weighting":  # weights computed from the clients' data (DWFed's label counts) leave un-noised
                for what in declaration(component).releases.values:
                    raise ValueError(f"{SETTINGS.get(role, role)}: {what}, which example-level DP-SGD does not "
                                     "account (it privatizes the local steps only); use weighting: size or uniform")
        for what in context.net_releases:
            raise ValueError(f"net: {what}; with example-level DP-SGD use a net without BatchNorm (GroupNorm or "
                             "LayerNorm): BatchNorm mixes a batch's examples, so per-example gradients are not defined")
        self.streams = PrivateStreams(self.noise, getattr(context, "run_key", ""))
        if context.num_clients is not None:
            self._ledger(context.num_clients)
        if self.noise_multiplier == 0:
            out.append("objective='dp_sgd' with noise_multiplier=0 gives no privacy (ε = inf): it only clips each example")
        return out

    # ------------------------------------------------------------------ one round
    def step_rule(self, cohort, w_start: Tensor, lr: float) -> StepRule:
        B = expected_batch_check(cohort.plan.batch_size if getattr(cohort, "plan", None) is not None else self.batch_size)
        clients = values(cohort.host_values().clients)
        # each client's noise stream on the training device: the steps' [n, P] draws are made there, not on the host
        generators = [self.streams.generator(cohort.seed, cohort.round, f"dp-sgd/{c}", w_start.device) for c in clients]
        # the Poisson batches: the round's seeded "batches" stream, or under noise: secure a secure generator, so that
        # nothing logged regenerates the sample the accountant's amplification assumes secret
        batches = self.streams.generator(cohort.seed, cohort.round, "dp-sgd-batches") if self.streams.secure else None
        dp = ExampleNoise(self.clip, self.noise_multiplier, float(B), generators, self.streams.normal, batches=batches)
        if self.mu == 0:
            return StepRule(example_dp=dp)
        return StepRule(decay=self.mu, shift=-self.mu * w_start, example_dp=dp)

    def client_epsilon(self, num_examples: int, steps: int) -> float:
        """ε(δ) of a client of ``num_examples`` examples after ``steps`` DP-SGD steps of the run's batch size."""
        if steps == 0:
            return 0.0
        if self.noise_multiplier == 0:
            return math.inf
        q = sampling_rate(num_examples, self.batch_size)
        key = (q, int(steps))
        if key not in self._eps_cache:
            self._eps_cache[key] = epsilon({(q, self.noise_multiplier): int(steps)}, self.delta, self.accountant)
        return self._eps_cache[key]

    def after_local(self, cohort, w_start: Tensor, w_end: Tensor, lr: float, local) -> None:
        """Each trained client's steps and ε (every step it took counts, also a straggler's whose update does not), from
        the round's host values."""
        if self.batch_size is None:
            self.batch_size = expected_batch_check(cohort.plan.batch_size)
        host = cohort.host_values()
        self._ledger(cohort.num_clients)
        ids = host.clients.long()
        self.steps[ids] += host.steps_done.double()
        self.eps[ids] = torch.tensor([self.client_epsilon(int(n), int(s)) for n, s in
                                      zip(values(host.num_examples), self.steps[ids].long().tolist())], dtype=torch.float64)
        return None

    def _trained(self) -> Tensor:
        """ε of every client that has trained (host, float64)."""
        if self.steps is None:
            return torch.zeros(0, dtype=torch.float64)
        return self.eps[self.steps > 0]

    def report(self, cohort) -> dict[str, float]:
        eps = self._trained()
        out = {"privacy/example_noise_multiplier": self.noise_multiplier}
        if eps.numel():
            out["privacy/example_epsilon_max"] = float(eps.max())
            out["privacy/example_epsilon_median"] = float(eps.median())
        return out

    def summary(self) -> dict[str, float]:
        """The distribution of the clients' ε at δ (those that trained), and δ."""
        eps = self._trained()
        out: dict[str, Any] = {"final/example_delta": self.delta, "final/example_noise_multiplier": self.noise_multiplier}
        if eps.numel():
            finite = eps[torch.isfinite(eps)]
            out["final/example_epsilon_max"] = float(eps.max())
            out["final/example_epsilon_min"] = float(eps.min())
            if finite.numel() == eps.numel():
                out["final/example_epsilon_median"] = float(eps.median())
                out["final/example_epsilon_p90"] = float(torch.quantile(eps, 0.9))
            out["final/example_clients"] = float(eps.numel())
        return out
