"""DP-FedAvg: client-level differential privacy as a server combination (docs/algorithms.md §11).

McMahan, Ramage, Talwar, Zhang 2018 (Algorithm 1, the fixed-denominator estimator) with adaptive
clipping (Andrew, Thakkar, McMahan, Ramaswamy 2021, geometric update) and, for comparison, local
DP. Every counting client's update is clipped to L2 norm ``C`` (all ``[K, P]`` rows at once),
the clipped updates are summed, Gaussian noise ``N(0, z²C² I)`` is added once on the server (a
seeded stream, the same on every rank) and the sum is divided by the expected cohort ``m = qN``:

    Δ = (Σ_{k∈S} Δ_k · min(1, C / ‖Δ_k‖) + N(0, z²C² I)) / m

With Poisson sampling (:class:`lfed.participation.sampling.PoissonSampler`, rate ``q = m / N``) a round is the
sampled Gaussian mechanism; :class:`lfed.privacy.accountant.PrivacyAccountant` composes the rounds
and the round logs ``privacy/epsilon`` at ``δ`` (default ``1/N^1.1``). A round with no counting
client still releases its noise (never skipped: skipping would reveal that nobody took part).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from lfed.base.component import each_once
from lfed.base.declaration import Declaration, Releases, Supports, declaration
from lfed.checks import number
from lfed.engine.host import values
from lfed.privacy.accountant import ACCOUNTANTS, PrivacyAccountant, budget_stop, calibrate_noise, epsilon
from lfed.privacy.clipping import clip_factors, clip_rows
from lfed.privacy.releases import check_releases
from lfed.rng import NOISE_MODES, PrivateStreams
from lfed.server.combination import ServerCombination
from lfed.state.spec import StateSpec

__all__ = ["DPFedAvg", "check_neighbours"]


def check_neighbours(context, mechanism: str = "DP-FedAvg", poisson: bool = True) -> None:
    """Refuse, before round 0, the components whose values a client-level accountant of the clipped, noised sum cannot
    account: every declared release (:func:`lfed.privacy.releases.check_releases`), a sampler other than Poisson
    sampling (only with ``poisson``: an accountant that amplifies by it), unequal weights, a lossy channel.
    ``mechanism`` names the combination in the messages (DP-FedAvg; distributed DP reuses the checks)."""
    roles = context.components or {}
    check_releases(roles, context.net_releases, mechanism)  # every value the accountant cannot account (lfed.privacy.releases)
    sampler, weighting, channel = roles.get("sampler"), roles.get("weighting"), roles.get("channel")
    if poisson and sampler is not None and not declaration(sampler).supports.poisson:
        raise ValueError(f"sampler: {mechanism}'s accountant assumes Poisson sampling (each client independently "
                         f"with probability q), got {getattr(sampler, 'name', sampler)!r}; use sampler: poisson "
                         "(an accountant for fixed-size or attention sampling is not implemented)")
    if weighting is not None and not declaration(weighting).supports.equal_weights:
        raise ValueError(f"weighting: {mechanism} weighs every counting client by 1/m (bounded sensitivity C/m); "
                         f"{getattr(weighting, 'name', weighting)!r} weights are unbounded without a cap; use weighting: uniform")
    if channel is not None and not declaration(channel).supports.exact:
        raise ValueError(f"channel: {mechanism} clips each update before any compression, and ternary compression "
                         "with residuals feeds earlier rounds' updates into later ones (unbounded sensitivity); "
                         "use channel: false with DP")


class DPFedAvg(ServerCombination):
    """DP-FedAvg (module docstring).

    Args:
        noise_multiplier: ``z >= 0`` (0: no noise); None with ``target_epsilon``: calibrated before round 0.
        clip: The clipping norm ``C > 0`` (``inf``: no clipping, only with ``z = 0``); with
            ``target_quantile``, the initial ``C_0`` of adaptive clipping.
        target_epsilon: A privacy budget. The run stops (with its final evaluation and a checkpoint)
            before a round that would spend more; with ``noise_multiplier: null``, ``z`` is first
            calibrated to the smallest that keeps ``ε(δ)`` within it after the run's rounds (``trainer.max_steps``).
        delta: ``δ`` in (0, 1) (default ``1/N^1.1``).
        target_quantile: ``γ`` in (0, 1): adaptive clipping to that quantile of the update norms (None: fixed ``C``).
        clip_lr: ``η_C > 0``, the geometric step of adaptive clipping.
        count_noise: ``σ_b >= 0``, the noise of the clipped-count query (default ``m / 20``).
        local_noise: ``σ_l >= 0``: each client adds ``N(0, σ_l² C² I)`` to its clipped update (local DP; then ``z = 0``).
        accountant: ``rdp`` (default) or ``pld`` (dp-accounting's).
        log_unaccounted: False (default): the run logs only metrics computed from the noised releases or from
            server-held data (:attr:`private_metrics`, the test split; :mod:`lfed.base.metric_gate`). True: also the
            metrics read from the clients' data without noise (the training loss, the cohort's local accuracy, the
            realised cohort size, the clients' held-out accuracies), each renamed ``unaccounted/<name>``.
        noise: ``seeded`` (default): the noise and the Poisson cohort come from the run's seed (reproducible, exact
            resume; the guarantee holds against an adversary who does not know the seed, which ``config.yaml``, the
            W&B config and the checkpoint hold). ``secure``: from the operating system's cryptographic randomness,
            kept nowhere (:class:`lfed.rng.PrivateStreams`; a resumed run continues with fresh noise).
        common_noise: False (default): the seeded streams are keyed by the run's settings, so runs of other
            settings at one seed (a grid's members) never share noise or cohorts; True: common random numbers,
            every run of one seed draws the same (for paired comparisons; only with ``noise: seeded``).
    """

    name = "dp"
    ASYNCHRONOUS = ("is not implemented asynchronously (its sensitivity would be max_k a_k s(τ_k) x clip per server step "
                    "and its accountant would need sampling among the clients not in flight, docs/async.md); use a "
                    "non-private combination")

    def __init__(self, noise_multiplier: float | None = 1.0, clip: float = 1.0, target_epsilon: float | None = None,
                 delta: float | None = None, target_quantile: float | None = None, clip_lr: float = 0.2,
                 count_noise: float | None = None, local_noise: float = 0.0, accountant: str = "rdp",
                 log_unaccounted: bool = False, noise: str = "seeded", common_noise: bool = False) -> None:
        super().__init__()
        if not isinstance(log_unaccounted, bool):
            raise ValueError(f"log_unaccounted: must be true or false, got {log_unaccounted!r}")
        if noise not in NOISE_MODES:
            raise ValueError(f"noise: {noise!r} is not one of {NOISE_MODES} (seeded: reproducible from the run's seed; "
                             "secure: the operating system's cryptographic randomness)")
        if not isinstance(common_noise, bool):
            raise ValueError(f"common_noise: must be true or false, got {common_noise!r}")
        if common_noise and noise == "secure":
            raise ValueError("common_noise: shared noise streams need noise: seeded (secure noise is never drawn twice)")
        self.noise, self.common_noise = noise, common_noise
        self.streams = PrivateStreams(noise)  # keyed by the run's settings in check
        self.log_unaccounted = log_unaccounted
        if target_epsilon is not None:
            number("target_epsilon", target_epsilon, above=0)
            if noise_multiplier is not None:
                number("noise_multiplier", noise_multiplier, at_least=0)
        elif noise_multiplier is None:
            raise ValueError("noise_multiplier: give a noise multiplier z >= 0, or target_epsilon to calibrate it")
        else:
            number("noise_multiplier", noise_multiplier, at_least=0)
        is_inf = isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip == math.inf
        self.clip0 = math.inf if is_inf else number("clip", clip, above=0, detail=" or inf (no clipping)")
        if delta is not None:
            number("delta", delta, above=0, below=1)
        if target_quantile is not None:
            number("target_quantile", target_quantile, above=0, below=1)
            if math.isinf(self.clip0):
                raise ValueError("clip: adaptive clipping (target_quantile) starts from a finite clip C_0 > 0, got inf")
        number("clip_lr", clip_lr, above=0)
        if count_noise is not None:
            number("count_noise", count_noise, at_least=0)
        self.local_noise = number("local_noise", local_noise, at_least=0)
        if accountant not in ACCOUNTANTS:
            raise ValueError(f"accountant: {accountant!r} is not one of {ACCOUNTANTS}")
        z = 0.0 if noise_multiplier is None else float(noise_multiplier)
        if self.local_noise > 0 and (z > 0 or target_epsilon is not None):
            raise ValueError("local_noise: local DP adds each client's own noise and no server noise; "
                             f"set noise_multiplier: 0 (got {noise_multiplier}) and no target_epsilon")
        if self.local_noise > 0 and target_quantile is not None:
            raise ValueError("target_quantile: adaptive clipping sends each client's clipped-or-not bit to the server "
                             "un-noised, which local DP (local_noise > 0) does not account; use a fixed clip with local_noise")
        if math.isinf(self.clip0) and (z > 0 or target_epsilon is not None or self.local_noise > 0):
            raise ValueError("clip: noise is scaled by the clip norm, so an infinite clip (no clipping) gives unbounded "
                             "sensitivity; give a finite clip > 0 with noise")
        # the settings as given (None: resolved before round 0 by check): what the run fingerprint compares
        self._given = {"noise_multiplier": None if noise_multiplier is None else float(noise_multiplier),
                       "clip": self.clip0, "target_epsilon": target_epsilon, "delta": delta,
                       "target_quantile": target_quantile, "clip_lr": float(clip_lr), "count_noise": count_noise,
                       "local_noise": self.local_noise, "accountant": accountant, "noise": noise,
                       "common_noise": common_noise}
        self.noise_multiplier, self.target_epsilon, self.delta = z, target_epsilon, delta
        self._calibrate = noise_multiplier is None  # a budget and no multiplier: calibrate it; with both, the budget is a cap
        self.target_quantile, self.clip_lr, self.count_noise = target_quantile, float(clip_lr), count_noise
        self.accountant = PrivacyAccountant(accountant)
        self.update_multiplier = z  # z_Δ: the updates' share of z under adaptive clipping (check)
        self.shares: tuple[float, ...] = ()  # the components' own noised releases (their dp_shares, lfed.privacy.releases; check)
        self._report: dict[str, float] = {}

    @property
    def declares(self) -> Declaration:  # type: ignore[override]
        """DP releases its noise every round (also when nobody counts) and guards the run's metrics
        (:mod:`lfed.base.metric_gate`): ``mark`` with ``log_unaccounted``, else ``drop``. Its private metrics are what
        :meth:`report` computes from public settings and noised releases only: ε, ``z``, the clip (fixed: a setting;
        adaptive: ``C_t`` from the noised counts of earlier rounds) and, with adaptive clipping, the next clip and the
        clipped fraction ``1 - b̃`` from the noised count. Not ``privacy/clients`` (the realised cohort size) nor, with a
        fixed clip, ``privacy/clipped_fraction`` (an un-noised count)."""
        fixed = ("privacy/epsilon", "privacy/noise_multiplier", "privacy/clip", "final/privacy_*")  # (summary: settings, ε)
        private = fixed if self.target_quantile is None else fixed + ("privacy/clip_next", "privacy/clipped_fraction")
        return Declaration(releases=Releases(every_round=True, private_metrics=private,
                                             metric_policy="mark" if self.log_unaccounted else "drop"),
                           supports=Supports(asynchronous=self.ASYNCHRONOUS))

    def hparams(self) -> dict:
        """The settings as the user gave them, not as :meth:`check` resolves them.

        A checkpoint is written after ``check`` (δ = 1/N^1.1, a calibrated ``z``, ``count_noise = m/20``) and
        checked on resume before it runs again, so resolved values would differ from the unset ones on every resume.
        The resolved values are functions of these settings and of what the fingerprint holds already (``N``,
        ``fraction``, and the rounds when ``z`` is calibrated: :attr:`depends_on_total_rounds`), and the checkpoint
        restores them (:meth:`set_extra_state`): equal settings are an exact continuation.
        """
        return dict(self._given)

    @property
    def depends_on_total_rounds(self) -> bool:
        """Whether ``trainer.max_steps`` changes what the run computes: ``z`` calibrated for the run's rounds."""
        return self._calibrate

    def state_specs(self) -> list[StateSpec]:
        return [StateSpec("clip", shape=(), per_client=False, init=self.clip0, dtype=torch.float64)]

    # ------------------------------------------------------------------ before round 0
    def check(self, context) -> list[str]:
        """Refuse what the accountant cannot account for; fix δ; calibrate ``z``; split ``z`` for adaptive clipping;
        warn of a DP without noise."""
        self._resolve(context)
        if self.noise_multiplier == 0 and self.local_noise == 0:
            return ["DP-FedAvg with noise_multiplier=0 and no local noise gives no privacy (ε = inf): it only clips"]
        return []

    def _resolve(self, context) -> None:
        roles = context.components or {}
        check_neighbours(context)  # every value the accountant cannot account; Poisson sampling, equal weights, exact channel
        # the private draws (noise, the Poisson cohort, DP-SCAFFOLD's control noise) from one source, keyed by the
        # run's settings unless common random numbers are asked for; the components that draw them share it
        self.streams = PrivateStreams(self.noise, "" if self.common_noise else getattr(context, "run_key", ""))
        for c in each_once(roles.values()):
            if hasattr(c, "private_streams"):
                c.private_streams = self.streams
        self.shares = tuple(z for c in each_once(roles.values())
                            for z in declaration(c).releases.dp_shares)  # DP-SCAFFOLD's control updates
        if self.shares and self.local_noise > 0:
            raise ValueError("local_noise: a component's own noised release (DP-SCAFFOLD's control updates) is noised "
                             "on the server and accounted as a share of noise_multiplier; use server noise with it")
        N = context.num_clients
        if N is None:
            return
        if self.delta is None:
            self.delta = 1.0 / N ** 1.1
        sizes = context.cohort_sizes or []
        m = sum(sizes) / len(sizes) if sizes else None
        if self.target_quantile is not None:
            if self.count_noise is None:
                self.count_noise = (m or 1.0) / 20
        if self.target_epsilon is not None and self._calibrate:
            if not sizes:
                raise ValueError("target_epsilon: calibrating the noise needs the run's rounds (trainer.max_steps > 0)")
            rates = [k / N for k in sizes]
            self.noise_multiplier = calibrate_noise(self.target_epsilon, self.delta, rates, self.accountant.kind)
            self._calibrated_over = (len(sizes), m / N)  # rounds, mean sampling rate: said before round 0 (start_notice)
        self.update_multiplier = self._update_multiplier()

    def _update_multiplier(self) -> float:
        """``z_Δ = (z⁻² - (2σ_b)⁻² - Σ_i z_i⁻²)^(-1/2)``: the updates' share of ``z`` once the count query of adaptive
        clipping (multiplier ``2σ_b``) and the components' own releases (``z_i``, :attr:`shares`) take theirs; ``z``
        without either. The round's Gaussian mechanisms on one sampled cohort, each scaled by its noise, are one
        Gaussian mechanism of multiplier ``(Σ z_j⁻²)^(-1/2) = z``, which the accountant composes."""
        z = self.noise_multiplier
        shares = getattr(self, "shares", ())
        if (self.target_quantile is None and not shares) or z == 0:
            return z
        left = z ** -2
        if self.target_quantile is not None:
            two_sb = 2 * float(self.count_noise)
            if two_sb <= z:
                raise ValueError(f"count_noise: adaptive clipping needs 2·count_noise > noise_multiplier to keep the total "
                                 f"multiplier z = {z:.4g}; got count_noise = {self.count_noise:.4g}")
            left -= two_sb ** -2
        left -= sum(s ** -2 for s in shares)
        if left <= 0:
            raise ValueError(f"control_noise: the components' own noise multipliers {list(shares)} leave the updates no "
                             f"share of noise_multiplier z = {z:.4g} (need Σ z_i⁻² < z⁻²); give a larger control_noise "
                             "or a smaller noise_multiplier")
        return left ** -0.5

    def stop_before(self, round: int, cohort_size: int, num_clients: int) -> str | None:
        """Stop before a round that would spend more than ``target_epsilon``."""
        if self.target_epsilon is None or self.delta is None:
            return None
        q = 1.0 if self.local_noise > 0 else cohort_size / num_clients
        z = self.local_noise if self.local_noise > 0 else self.noise_multiplier
        events = dict(self.accountant.events)
        events[(q, z)] = events.get((q, z), 0) + 1
        after = epsilon(events, self.delta, self.accountant.kind)
        if after <= self.target_epsilon:  # (the spent ε only when the line is written)
            return None
        return budget_stop(round, after, self.target_epsilon, self.delta, self.accountant.rounds,
                           self.accountant.epsilon(self.delta))

    def start_notice(self) -> str:
        """At start-up: the noise multiplier a ``target_epsilon`` calibrated (before round 0, not only in the end-of-run
        summary), then where the noise comes from and what the guarantee then assumes."""
        calibrated = ""
        over = getattr(self, "_calibrated_over", None)
        if over is not None:
            calibrated = (f"DP noise multiplier z = {self.noise_multiplier:.4g}, calibrated for target_epsilon "
                          f"{self.target_epsilon:g} at delta {self.delta:.3g} over {over[0]} rounds at sampling rate "
                          f"{over[1]:.4g} ({self.accountant.kind} accountant)\n")
        if self.streams.secure:
            return calibrated + ("DP noise and Poisson cohorts: secure (the operating system's cryptographic randomness, "
                                 "kept nowhere; a resumed run continues with fresh noise)")
        return calibrated + ("DP noise and Poisson cohorts: seeded from the run's seed (reproducible; the guarantee holds "
                             "against an adversary who does not know the seed, which config.yaml, the loggers' config and "
                             "the checkpoint hold; model.combination.init_args.noise: secure draws them from the "
                             "operating system)")

    # ------------------------------------------------------------------ one round
    def combine(self, updates, weights, cohort):
        K, P = updates.shape
        counting = cohort.counting.to(updates.device)
        n_counting = sum(values(cohort.host_values().counting))  # host values: no device read (lfed.engine.host)
        m = float(cohort.expected_size)
        # the bound: a fixed one is the setting itself (a host float); an adaptive one moves every round on the
        # device (its next value comes from the norms) and is used there, read to the host only with the metrics.
        # C is C_t for the whole round: the clip, the count, the noise and privacy/clip (set_state below stores
        # C_{t+1} as a new tensor; this one keeps C_t, issue 49)
        C = self.clip0 if self.target_quantile is None else self.state("clip")
        norms = torch.linalg.vector_norm(updates, dim=1)
        # Σ_k Δ_k · min(1, C/‖Δ_k‖) / m as one weighted sum of the rows (no clipped copy of [K, P]); a client
        # whose work does not count weighs 0; with C = inf the weights are FedAvg's uniform 1/m
        a = torch.where(counting, torch.full((K,), 1.0 / m, dtype=torch.float64, device=updates.device),
                        torch.zeros((), dtype=torch.float64, device=updates.device))
        if isinstance(C, Tensor) or not math.isinf(C):
            a = a * clip_factors(norms.double(), C)
        streams = self.streams
        g = streams.generator(cohort.seed, cohort.round, "dp-noise")
        if self.local_noise > 0:  # local DP: each counting client's own noise, added to its clipped update before upload
            clipped, _ = clip_rows(updates, C)
            own = streams.normal((K, P), g, updates.dtype).to(updates.device, non_blocking=True)
            delta = torch.where(counting, 1.0 / m, 0.0).to(updates.dtype) @ (clipped + self.local_noise * C * own)
        else:
            delta = a.to(updates.dtype) @ updates
        report = {"privacy/clip": C, "privacy/clients": float(n_counting)}  # the realised cohort: unaccounted
        if self.target_quantile is None:  # the un-noised share of the cohort clipped: unaccounted (private_metrics)
            clipped_share = (((norms > C) & counting).double().sum() / n_counting) if n_counting else 0.0
            report["privacy/clipped_fraction"] = clipped_share
        else:  # Andrew et al.: the noised count of clients under the bound, b̃ = (Σ b_k + N(0, σ_b²)) / m
            below = ((norms <= C) & counting).double().sum()
            draw = streams.normal((), g, torch.float64).to(below.device, non_blocking=True)
            b_noised = (below + float(self.count_noise) * draw) / m
            C_next = C * torch.exp(-self.clip_lr * (b_noised - self.target_quantile))
            self.set_state("clip", C_next.to(self.state("clip").device))
            report["privacy/clip_next"] = C_next
            report["privacy/clipped_fraction"] = 1.0 - b_noised  # post-processing of b̃ (private)
        if self.update_multiplier > 0:
            noise = streams.normal(P, g, updates.dtype).to(updates.device, non_blocking=True)
            delta = delta + (self.update_multiplier * C / m) * noise
        q = m / cohort.num_clients
        if self.local_noise > 0:  # each client's release is its own Gaussian mechanism (counted as if in every round)
            self.accountant.step(1.0, self.local_noise)
        else:
            self.accountant.step(q, self.noise_multiplier)
        report["privacy/epsilon"] = self.accountant.epsilon(self.delta) if self.delta is not None else math.inf
        report["privacy/noise_multiplier"] = self.noise_multiplier
        self._report = report
        return delta, None

    def report(self, cohort) -> dict[str, float | Tensor]:
        return dict(self._report)

    def summary(self) -> dict[str, float]:
        """The end of the run: ε spent at δ, δ, and the noise multiplier z (calibrated, where target_epsilon gave it)."""
        out = {"final/privacy_noise_multiplier": float(self.noise_multiplier)}
        if self.delta is not None:
            out["final/privacy_epsilon"] = float(self.accountant.epsilon(self.delta))
            out["final/privacy_delta"] = float(self.delta)
        return out

    # ------------------------------------------------------------------ checkpoint
    def get_extra_state(self) -> dict[str, Any]:
        return {"accountant": self.accountant.state_dict(), "noise_multiplier": self.noise_multiplier,
                "delta": self.delta, "count_noise": self.count_noise}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.accountant.load_state_dict(state["accountant"])
        self.noise_multiplier, self.delta, self.count_noise = state["noise_multiplier"], state["delta"], state["count_noise"]
        self.update_multiplier = self._update_multiplier()
