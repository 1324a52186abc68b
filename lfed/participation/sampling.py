"""Client samplers (docs/algorithms.md §5): who takes part in a round of ``K_t`` clients, uniformly
(:class:`UniformSampler`), by Poisson sampling (:class:`PoissonSampler`) or by AdaFL's attention scores
(:class:`AttentionSampler`, whose scores are declared state, :mod:`lfed.state.spec`, so they ride in the checkpoint).

``K_t = cohort_size(γ_t, N)`` and the fraction schedules ``γ_t`` live in :mod:`lfed.participation.fractions`, the uniform
draw in :mod:`lfed.participation.draws`; their names are importable here too (the paths configs name, e.g.
``lfed.participation.sampling.ExplicitFraction``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lfed.base.component import Cohort, Component, standalone_store
from lfed.base.declaration import Declaration, Releases, Supports
from lfed.engine.host import device_rows, values
from lfed.participation.draws import DRAWS, uniform_draw
from lfed.participation.fractions import (
    ConstantFraction,
    ExplicitFraction,
    FractionSchedule,
    StepwiseFraction,
    as_schedule,
    cohort_size,
    is_int,
    round_half_up,
)
from lfed.state.spec import StateSpec

__all__ = [
    "DRAWS", "AttentionSampler", "PoissonSampler", "ClientSampler", "ConstantFraction",
    "ExplicitFraction", "FractionSchedule", "StepwiseFraction", "UniformSampler",
    "as_schedule", "cohort_size", "round_half_up", "uniform_draw",
]  # fmt: skip


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
    # its kind's reason; a sampler where each client is drawn independently with the same probability q = K_t / N
    # (Poisson sampling, as DP-FedAvg's accountant assumes: PoissonSampler) declares Supports(poisson=True)
    declares = Declaration(supports=Supports(asynchronous=(
        "is not used: asynchronous dispatch draws uniformly among the clients not in flight; leave sampler unset")))
    #: Whether every round's cohort has the planned size. A sampler of random cohort sizes (Poisson) sets False, and the
    #: engine then runs its steps eagerly instead of recording one graph per shape (a new size almost every round).
    fixed_size = True

    def __init__(self) -> None:
        super().__init__()
        self.num_clients = 0

    def setup_state(self, store, num_examples: Tensor, num_params: int, like: Tensor) -> None:
        self.setup(num_examples, store=store)

    def observe(self, cohort: Cohort, client_weights: Tensor, w_new: Tensor) -> None:
        """After the server step: the cohort's final local weights ``[K, P]`` and the new global model."""

    def evaluation_metrics(self) -> dict[str, float]:
        """What every evaluation adds (none; a sampler on a simulated clock: ``clock/time``)."""
        return {}

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
        if not is_int(k, 1) or k > self.num_clients:
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


def _constant(num_clients: int, value: float, device) -> Tensor:
    """``[N]`` float64 all ``value``, as a broadcast view of one number (no O(N) allocation)."""
    return torch.tensor(value, dtype=torch.float64, device=device).expand(num_clients)


class UniformSampler(ClientSampler):
    """``k`` clients without replacement, uniformly (FedAvg; docs/algorithms.md §5), in O(k) (:func:`uniform_draw`;
    ``draws = "permutation"``: lfed 0.5's ``randperm(N)[:k]``, kept for the runs it made)."""

    declares = Declaration(supports=Supports(asynchronous=True))
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
    declares = Declaration(supports=Supports(poisson=True))
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
    declares = Declaration(releases=Releases(values=(
        "AdaFL's sampling scores move with each client's raw distance ||w^(t+1) - w_k^(t)||, un-noised, "
        "and choose later cohorts",)))

    def check(self, context) -> list[str]:
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
        self.__dict__["_tree"] = None  # rebuilt from the new scores at the next draw

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
        self.__dict__["_tree"] = None  # the loaded scores: the sum tree is rebuilt from them at the next draw
        saved = state_dict.get(prefix + "scores")
        if isinstance(saved, Tensor) and saved.shape != self.scores.shape:
            self.scores = torch.empty_like(saved, device=self.scores.device, dtype=torch.float64)
            self.num_clients = int(saved.numel())
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    #: How cohorts are drawn (:data:`lfed.participation.draws.DRAWS`): ``"rejection"`` (0.6 on: successive sampling
    #: through a sum tree of the scores, O(k log N) a round, :mod:`lfed.participation.sum_tree`) or ``"permutation"``
    #: (lfed 0.5's ``torch.multinomial`` over all ``N`` scores, O(N), kept for the runs it made). The same law.
    draws = "rejection"

    def _tree_now(self):
        """The sum tree of the scores on the host: built from the state once (after set-up or a load), then moved by
        the rows :meth:`_update` wrote (``K`` values read to the host here, at the next draw)."""
        from lfed.participation.sum_tree import SumTree

        tree = self.__dict__.get("_tree")
        if tree is None:
            tree = self.__dict__["_tree"] = SumTree(self.state("scores"))
            self.__dict__["_pending"] = []
        for ids, values_ in self.__dict__.pop("_pending", []):
            tree.set(ids, values_)
        self.__dict__["_pending"] = []
        return tree

    def sample(self, round: int, k: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """``k`` clients by successive draws proportional to the scores (class docstring); ``p`` the scores the draw
        used (with ``draws = "rejection"`` the sum tree's leaves on the host, valid until the next :meth:`observe`)."""
        self._check_k(k)
        if self.draws != "permutation" and generator.device.type == "cpu":
            from lfed.participation.sum_tree import weighted_draw

            tree = self._tree_now()
            ids = weighted_draw(tree, k, generator)
            if ids is not None:
                return ids.sort().values, tree.levels[0][: self.num_clients]
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
        new = self.alpha * a + (1.0 - self.alpha) * shares * a.sum()
        self.write_rows("scores", sampled, new)
        if self.__dict__.get("_tree") is not None:  # the sum tree takes the same rows at the next draw
            self.__dict__.setdefault("_pending", []).append((sampled, new))

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, num_clients={self.num_clients}"


# A schedule given to FederatedModule is one of its hyper-parameters, so Lightning pickles it
# into every checkpoint; resuming loads checkpoints with torch.load(weights_only=True), which
# rebuilds only allow-listed classes. These hold plain numbers and run no code when rebuilt.
torch.serialization.add_safe_globals([ConstantFraction, StepwiseFraction, ExplicitFraction])
