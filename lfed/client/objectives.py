"""Local objectives (docs/algorithms.md §2): plain, prox, scaffold, igfl, efl.

Each objective is a :class:`ClientRule` component (:mod:`lfed.base.component`) that declares its
per-client and server state (:mod:`lfed.state.spec` allocates it, checkpoints it and checks its
shapes). Before local training it turns its state into a :class:`~lfed.engine.StepRule` for
the whole cohort (one general step, ``w ← w - eta_l (grad_scale g + decay ⊙ w + shift)``);
after local training it updates its state from the clients' final weights. Nothing here loops
over clients. A new objective is one subclass in its own file (see ``docs/extending.md`` and
:mod:`lfed.client.feddyn`).

Per-client state is ``N × P`` numbers per tensor (``N`` clients, ``P`` trainable parameters),
held on the device in the module's state dict:

=========  =====================================================  ==========================
objective  state                                                  numbers
=========  =====================================================  ==========================
plain      none                                                   0
prox       none (``w_start`` is the broadcast model)              0
scaffold   ``c_k`` (``client_control``), ``c`` (``control``)      ``N·P + P``
igfl       ``Δw_k`` (``history.previous_update``), ``Δw_ps``     ``N·P + P``
           (``history.global_change``), kept by the round
efl        ``u_k``, ``v_k`` (``fisher_u``, ``fisher_v``) and      ``2·N·P + 2·P``
           their sums ``U``, ``V``
=========  =====================================================  ==========================

For example SCAFFOLD on :class:`~lfed.models.zoo.McMahanCIFARCNN` at its default 32×32 input
(P = 1,756,426) with 100 clients keeps ``c_k`` in 100 × 1,756,426 × 4 B ≈ 703 MB (670 MiB) in
float32, twice that in float64; at the paper's 24×24 crops (P = 1,068,298) it is ≈ 427 MB.
EFL keeps two such tensors (≈ 1.4 GB at 32×32), IGFL one. The MNIST 2NN (P = 199,210) with
100 clients needs ≈ 80 MB per tensor. A checkpoint carries all of it; loading one whose state
was made for another ``N`` or ``P`` fails with a :class:`ValueError` naming the buffer and both
shapes (:func:`lfed.state.spec.check_state_shapes`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lfed.base.component import Cohort, Component, LocalWork
from lfed.base.declaration import Declaration, Needs, Releases, Supports, declaration
from lfed.checks import integer, number
from lfed.engine import LossTerm, StepRule
from lfed.engine.host import device_rows, values
from lfed.rng import round_generator, seeded_global_rng
from lfed.state.spec import StateSpec, check_state_shapes

__all__ = ["ClientRule", "Cohort", "EFL", "IGFL", "Plain", "Prox", "Scaffold",
           "check_state_shapes"]


class ClientRule(Component):
    """Base class of client rules (docs/algorithms.md §2): the plain FedAvg objective, ``w ← w - eta_l g_k(w)``.

    Hooks, in the order a round calls them:

    * :meth:`step_rule` (before local training): the cohort's :class:`~lfed.engine.StepRule`;
    * :meth:`loss_term` (before local training, optional): a :class:`~lfed.engine.LossTerm` added to
      each example's loss, for objectives that change the loss rather than the step (MOON,
      Ditto); the step rule stays the fast path;
    * :meth:`after_local` (after local training, before the server combines): update the
      declared state from the final weights; only rows of clients whose state may change.

    A rule that needs its own server combination (FedDyn) returns it from
    :meth:`server_combination`.
    """

    name = "client_rule"  # a rule of your own names itself (its fingerprint and logs say it); Plain is "plain"
    declares = Declaration(supports=Supports(asynchronous=(
        "keeps client or server state or changes the round, which is not defined asynchronously yet; use plain or prox")))

    def step_rule(self, cohort: Cohort, w_start: Tensor, lr: float) -> StepRule:
        """The cohort's local step rule."""
        return StepRule()

    def round_metrics(self, cohort: Cohort, lr: float) -> dict[str, float]:
        """Scalars to log for this round, read before local training (none by default)."""
        return {}

    def loss_term(self, cohort: Cohort, w_start: Tensor) -> LossTerm | None:
        """A term added to each example's local loss (None: the loss is the user's loss alone)."""
        return None

    def after_local(self, cohort: Cohort, w_start: Tensor, w_end: Tensor, lr: float, local: LocalWork) -> Tensor | None:
        """Update state from the cohort's final weights ``w_end`` ``[K, P]``; inactive clients keep theirs.

        ``local`` says where and how the cohort trained (EFL computes its Fisher reports from it).
        ``w_start`` is what :meth:`start_weights` returned (``[P]``, or ``[K, P]``). Return None, or
        ``[K, P]`` final weights that replace ``w_end`` as the clients' models (FedRep trains its
        body after the round's training of its head).
        """
        return None

    def server_combination(self):
        """A server combination this rule needs (None: any). See :mod:`lfed.client.feddyn`."""
        return None

    # ---------------------------------------------------------------- personalization (docs/algorithms.md §13)
    # A rule whose clients each have their own model declares Supports(personalized=True): every evaluation then also
    # evaluates each client's personalized model (personal_rows) on its own held-out split (personal/*).

    def personal_rows(self, clients: Tensor, w: Tensor, local: LocalWork) -> Tensor:
        """``[K, P]`` the personalized models of ``clients`` (any clients, not only a cohort) given the global ``w``.

        ``local`` is a :class:`~lfed.base.component.LocalWork` over these clients' training data (the run's
        batch size, its step budget as ``steps_done``, ``client_lr``), for a method whose personal
        model is trained at evaluation time (FedAvg-FT). The global model by default.
        """
        return w.expand(clients.numel(), -1)

    def personal_models(self, w: Tensor, local: Callable[[Tensor], LocalWork]) -> dict[str, Callable[[Tensor], Any]]:
        """The models each personalized evaluation scores beside the global ``w`` (docs/algorithms.md §13), by metric prefix:
        ``{"personal": clients -> personal_rows(clients, w, local(clients))}`` for a personalized rule, none for
        any other (the run then evaluates the global model alone). ``local(clients)`` is the
        :class:`~lfed.base.component.LocalWork` over those clients' training data."""
        if not declaration(self).supports.personalized:
            return {}
        return {"personal": lambda clients: self.personal_rows(clients, w, local(clients))}

    def check(self, context) -> list[str]:
        """A personalized rule says what a client's model is (:meth:`personal_rows`), and only a personalized one does."""
        personalized = declaration(self).supports.personalized
        if personalized and type(self).personal_rows is ClientRule.personal_rows:
            raise ValueError(f"objective: {type(self).__name__} says it is personalized but does not say what a "
                             "client's model is; define personal_rows(clients, w, local) -> [K, P] (docs/personalization.md)")
        if not personalized and type(self).personal_rows is not ClientRule.personal_rows:
            raise ValueError(f"objective: {type(self).__name__} defines personal_rows but is not personalized, so no "
                             "personal/* would be evaluated; declare declares = Declaration(supports=Supports("
                             "personalized=True)) on it")
        return []

    def make_sharing(self, net, layout):
        """The split of the model into shared and local parameters (:class:`lfed.personal.sharing.Sharing`),
        or None (default): every parameter is shared. Called once the net is known, before state is allocated."""
        return None

    def start_buffers(self, cohort: Cohort) -> dict[str, Tensor] | None:
        """``{name: [K, ...]}`` the cohort's own start values of some of the net's buffers (FedBN's running
        statistics; the loop backend), or None (default): every client starts from the global model's."""
        return None

    def start_weights(self, cohort: Cohort, w: Tensor) -> Tensor:
        """The cohort's start weights of local training: the global ``w [P]`` (default), or ``[K, P]`` per client
        (a rule with local parameters: the global shared part and each client's own local part)."""
        return w


def _check_coefficient(name: str, value: float) -> float:
    return number(name, value, at_least=0)


def _check_fisher_samples(value: int) -> int:
    return integer("fisher_samples", value, at_least=1, detail=" (examples per client for the Fisher diagonal)")


class Plain(ClientRule):
    """FedAvg's local SGD (McMahan et al. 2017)."""

    name = "plain"
    declares = Declaration(supports=Supports(asynchronous=True))


class Prox(ClientRule):
    """FedProx (Li et al. 2020): ``w ← w - eta_l (g_k(w) + mu (w - w_start))``.

    Args:
        mu: Proximal coefficient, >= 0.
    """

    name = "prox"
    declares = Declaration(supports=Supports(asynchronous=True))

    def __init__(self, mu: float = 0.01) -> None:
        super().__init__()
        self.mu = _check_coefficient("mu", mu)

    def check(self, context) -> list[str]:
        return super().check(context) + (["objective='prox' with mu=0 is plain local SGD (FedAvg)"] if self.mu == 0 else [])

    def hparams(self) -> dict:
        return {"mu": self.mu}

    def step_rule(self, cohort: Cohort, w_start: Tensor, lr: float) -> StepRule:
        return StepRule(decay=self.mu, shift=-self.mu * w_start)


class Scaffold(ClientRule):
    """SCAFFOLD, option II (Karimireddy et al. 2020; docs/algorithms.md §2 scaffold).

    Step ``w ← w - eta_l (g_k(w) - c_k + c)``; after ``K`` steps
    ``c_k ← c_k - c + (w_start - w_end) / (K eta_l)`` and
    ``c ← c + (1/N) Σ_{k∈S} (c_k_new - c_k)`` (= ``|S|/N`` times the uniform mean).

    With ``control_clip`` ``C_c`` and ``control_noise`` ``z_c`` (DP-SCAFFOLD at the client level, docs/privacy.md):
    each counting client's control update ``Δc_k = c_k_new - c_k`` is clipped to L2 norm ``C_c`` and the sum is noised
    once on the server, ``c ← c + (Σ_{k∈S} clip(Δc_k, C_c) + N(0, z_c² C_c² I)) / N`` (the noise from the stream
    ``(seed, round, "dp-control-noise")``, or the secure source of DP-FedAvg's ``noise``:
    :class:`lfed.rng.PrivateStreams`), every round, also when nobody counts); the client keeps its own ``c_k``.
    A DP-FedAvg run accounts it as its own share of the round's multiplier (its declared ``Releases(dp_shares=...)``).

    Args:
        control_clip: ``C_c > 0`` (None: SCAFFOLD as published, refused under DP).
        control_noise: ``z_c > 0``, with ``control_clip``.
    """

    name = "scaffold"
    #: DP-FedAvg's source of private draws (:class:`lfed.rng.PrivateStreams`), set by it before round 0
    private_streams = None
    RELEASE = ("SCAFFOLD's server control variate c is averaged from the clients' raw control updates, unclipped "
               "and un-noised, and sent to every later cohort")

    def __init__(self, control_clip: float | None = None, control_noise: float | None = None) -> None:
        super().__init__()
        from lfed.checks import number

        if (control_clip is None) != (control_noise is None):
            raise ValueError("control_clip, control_noise: DP-SCAFFOLD clips the control updates to control_clip and "
                             f"noises their sum with control_noise; give both or neither (got {control_clip}, {control_noise})")
        self.control_clip = None if control_clip is None else number("control_clip", control_clip, above=0)
        self.control_noise = None if control_noise is None else number("control_noise", control_noise, above=0)

    @property
    def private(self) -> bool:
        """Whether the server control variate is built from clipped, noised control updates (DP-SCAFFOLD)."""
        return self.control_clip is not None

    @property
    def declares(self) -> Declaration:  # type: ignore[override]
        """Published SCAFFOLD releases its control variate raw; DP-SCAFFOLD releases it noised, as its own share."""
        if self.private:
            return Declaration(releases=Releases(dp_shares=(self.control_noise,)))
        return Declaration(releases=Releases(values=(self.RELEASE,)))

    def hparams(self) -> dict:
        return {"control_clip": self.control_clip, "control_noise": self.control_noise} if self.private else {}

    def state_specs(self) -> list[StateSpec]:
        return [StateSpec("control", per_client=False), StateSpec("client_control")]

    def step_rule(self, cohort: Cohort, w_start: Tensor, lr: float) -> StepRule:
        return StepRule(shift=self.state("control") - self.rows("client_control", cohort.clients))

    def after_local(self, cohort: Cohort, w_start: Tensor, w_end: Tensor, lr: float, local: LocalWork) -> None:
        steps = cohort.steps_done.to(w_end.dtype).clamp_min(1)[:, None]
        old = self.rows("client_control", cohort.clients)
        control = self.state("control")
        new = old - control + (w_start - w_end) / (steps * lr)
        change = torch.where(cohort.active[:, None], new - old, torch.zeros_like(new))
        self.write_rows("client_control", cohort.clients, old + change)
        if not self.private:
            self.set_state("control", control + change.sum(0) / cohort.num_clients)
            return
        from lfed.rng import PrivateStreams

        streams = self.private_streams or PrivateStreams()  # DP-FedAvg's source (seeded or secure), set before round 0
        counting = (cohort.active if cohort.counting is None else cohort.counting).to(change.device)
        norms = torch.linalg.vector_norm(change, dim=1)
        factor = torch.where(counting, (self.control_clip / norms.clamp_min(1e-300)).clamp(max=1.0),
                             torch.zeros((), dtype=norms.dtype, device=norms.device))  # min(1, C_c/‖Δc_k‖); 0 if not counting
        g = streams.generator(cohort.seed, cohort.round, "dp-control-noise")
        noise = streams.normal(change.shape[1], g, change.dtype).to(change.device, non_blocking=True)
        total = factor.to(change.dtype) @ change + (self.control_noise * self.control_clip) * noise
        self.set_state("control", control + total / cohort.num_clients)


class IGFL(ClientRule):
    """IGFL-C (Huang et al., Algorithm 2 of 000; docs/algorithms.md §2 igfl).

    Each step ``Δ_I = -eta_l g``, ``Δ_G = (1/|S|)(Δ_I - Δw_k / T) + Δw_ps / T``,
    ``w ← w + Δ_I + Δ_G``, i.e. the step rule with ``grad_scale = 1 + 1/|S|`` and
    ``shift = (Δw_k / |S| - Δw_ps) / (eta_l T_k)``. ``Δw_k`` (the client's update from the
    last round it took part in) and ``Δw_ps`` (the global model's last change) are the round's
    update history (:class:`lfed.core.algorithm.UpdateHistory`, ``Needs(history=True)``).
    """

    name = "igfl"
    declares = Declaration(needs=Needs(history=True), releases=Releases(values=(
        "IGFL-C scales every client's step by 1 + 1/|S| with |S| the realised cohort, so one client's "
        "participation changes every other client's update (its sensitivity exceeds the clip C)",)))

    def step_rule(self, cohort: Cohort, w_start: Tensor, lr: float) -> StepRule:
        K = cohort.clients.numel()
        T = cohort.step_budget.to(w_start.dtype).clamp_min(1)[:, None]
        shift = (cohort.previous_update / K - cohort.global_change) / (lr * T)
        return StepRule(grad_scale=1.0 + 1.0 / K, shift=shift)


class EFL(ClientRule):
    """EFL's Fisher-elastic objective (Ma et al., §3.1 of 004; docs/algorithms.md §2 efl).

    Local objective ``f_k(w) + (λ/2) wᵀUw - λ wᵀV`` with ``U = Σ_i u_i``, ``V = Σ_i v_i`` over
    every client's latest report; step ``w ← w - eta_l (g + λ (U ⊙ w - V))``. After local
    work client k reports ``u_k = diag(F_k)`` at ``w_end`` and ``v_k = u_k ⊙ w_end``.

    Args:
        lam: Elastic coefficient λ, >= 0.
        fisher_samples: Examples per client for the empirical Fisher diagonal, >= 1.
    """

    name = "efl"
    declares = Declaration(releases=Releases(values=(
        "EFL's Fisher sums U and V add up every client's raw Fisher report, unclipped and un-noised, and go "
        "to every later cohort",)))

    def __init__(self, lam: float = 0.1, fisher_samples: int = 64) -> None:
        super().__init__()
        self.lam = _check_coefficient("efl_lambda", lam)
        self.fisher_samples = _check_fisher_samples(fisher_samples)

    def check(self, context) -> list[str]:
        if self.lam == 0:
            return super().check(context) + [
                "objective='efl' with efl_lambda=0 is plain local SGD, yet every client still computes a Fisher report"]
        return super().check(context)

    def hparams(self) -> dict:
        return {"lam": self.lam, "fisher_samples": self.fisher_samples}

    def state_specs(self) -> list[StateSpec]:
        return [StateSpec("fisher_u"), StateSpec("fisher_v"),
                StateSpec("fisher_u_sum", per_client=False), StateSpec("fisher_v_sum", per_client=False)]

    def step_rule(self, cohort: Cohort, w_start: Tensor, lr: float) -> StepRule:
        if self.lam == 0:
            return StepRule()
        return StepRule(decay=self.lam * self.state("fisher_u_sum"), shift=-self.lam * self.state("fisher_v_sum"))

    def round_metrics(self, cohort: Cohort, lr: float) -> dict[str, float | Tensor]:
        """``efl/max_lr_lambda_u``: ``max_i η λ U_i`` of this round's step (stable only below 2, docs/algorithms.md §2 efl);
        a device value, read with the round's other metrics (:mod:`lfed.engine.host`)."""
        return {"efl/max_lr_lambda_u": lr * self.lam * self.state("fisher_u_sum").max()}

    def after_local(self, cohort: Cohort, w_start: Tensor, w_end: Tensor, lr: float, local: LocalWork) -> None:
        from lfed.client.fisher import FisherJob, fisher_cohort

        host = cohort.host_values()
        if not any(values(host.active)):
            return
        active = device_rows(host.active, w_end.device)  # rows, not a boolean mask: no device read (lfed.engine.host)
        clients = cohort.clients[active.to(cohort.clients.device)]
        with seeded_global_rng(local.seed, local.round, "fisher_dropout", w_end.device):  # a model's dropout
            job = FisherJob(w_end[active], local.data_x, local.data_y, local.index[active.to(local.index.device)],
                            host.num_examples[host.active], self.fisher_samples,
                            round_generator(local.seed, local.round, "fisher"))
            u = fisher_cohort(local.engine, local.ranks, job)  # the clients' reports, split over the ranks like training
        v = u * w_end[active]
        self.set_state("fisher_u_sum", self.state("fisher_u_sum") + (u - self.rows("fisher_u", clients)).sum(0))
        self.set_state("fisher_v_sum", self.state("fisher_v_sum") + (v - self.rows("fisher_v", clients)).sum(0))
        self.write_rows("fisher_u", clients, u)
        self.write_rows("fisher_v", clients, v)
