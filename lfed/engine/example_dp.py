"""Example-level DP-SGD inside every client's local steps (Abadi et al. 2016, Algorithm 1; docs/algorithms.md §17).

Each local step of client ``k`` is DP-SGD on the client's own examples:

* the batch is a **Poisson sample** of the client's ``n_k`` examples, each taken independently with probability
  ``q_k = min(1, B / n_k)`` (:func:`poisson_schedule`); its expected size is ``q_k n_k``, which is ``B`` when
  ``n_k ≥ B`` and ``n_k`` when ``n_k < B`` (every example then in every batch); the realised batch may be empty;
* every example's gradient is **clipped** to L2 norm ``C`` over all trainable parameters,
  ``ḡ_i = g_i · min(1, C / (‖g_i‖ + 10⁻⁶))`` (Opacus's clip factor, so a noise-free step equals Opacus's exactly);
* the clipped gradients are **summed**, **noised** with ``N(0, σ² C² I)`` and divided by the batch size ``B`` (the
  setting, as Opacus divides by its ``expected_batch_size``; not the realised size, which would leak the sample's size,
  and also when ``n_k < B``, where the expected size is ``n_k``): ``g̃ = (Σ_i ḡ_i + σ C ξ) / B``;
* the objective's step rule then uses ``g̃`` as its gradient (post-processing: a rule's decay and shift read only the
  broadcast model and the client's own state).

:class:`ExampleNoise` is what a :class:`~lfed.engine.StepRule` carries to turn this on (``example_dp``); both
backends read it. The noise of client ``k``'s step ``t`` is the ``t``-th draw of the client's own generator,
seeded by ``(seed, round, "dp-sgd/<client id>")`` (or the secure source), so the vmapped cohort and the loop over
clients draw the same noise, whatever the cohort's order, chunks or ranks. The Poisson batches are drawn from the round's
``"batches"`` stream when seeded, and from ``batches`` (a secure generator) under ``noise: secure``: the amplification
by subsampling assumes nobody can regenerate the sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

__all__ = ["CLIP_EPSILON", "ExampleNoise", "clip_and_sum", "poisson_schedule"]

#: Added to every per-example norm before dividing (Opacus's ``DPOptimizer.clip_and_accumulate``).
CLIP_EPSILON = 1e-6


@dataclass
class ExampleNoise:
    """The example-level DP-SGD of a cohort's local steps (module docstring).

    Attributes:
        clip: ``C > 0``, the per-example L2 clip.
        noise_multiplier: ``σ >= 0``; each step adds ``N(0, σ² C² I)`` to the clipped sum.
        expected_batch: ``B``, the divisor (the batch size setting: the Poisson batch's expected size when ``n_k ≥ B``).
        generators: One generator per cohort row (in the cohort's order), each the row's own noise stream.
        normal: ``normal(shape, generator, dtype)``: standard normal draws (:meth:`lfed.rng.PrivateStreams.normal`).
        planted: Per row, None or an object whose ``step(P, dtype)`` returns the ``[P]`` sum of that step's sampled
            canary examples' (already clipped) gradients (the audit's canaries, :mod:`lfed.privacy.audit_examples`);
            empty: no row has any.
        counts: ``[K, T]`` each row's realised Poisson batch size at every step, on the host (set by
            :meth:`lfed.engine.CohortTrainer.train` from the schedule it draws; the vmap backend computes each step up
            to its largest, with no device read).
        batches: The CPU generator the Poisson batches are drawn from, or None: the training job's (the round's
            seeded ``"batches"`` stream). DP-SGD under ``noise: secure`` gives a secure one.
    """

    clip: float
    noise_multiplier: float
    expected_batch: float
    generators: list[torch.Generator] = field(default_factory=list)
    normal: object = None
    planted: list = field(default_factory=list)
    counts: Tensor | None = None
    batches: torch.Generator | None = None

    @property
    def std(self) -> float:
        """``σ C``: the standard deviation of the noise added to the clipped sum."""
        return self.noise_multiplier * self.clip

    def select(self, rows: Tensor | int | slice, num_clients: int) -> ExampleNoise:
        """The rows' generators (the same objects: a row's stream goes on where it was)."""
        def pick(items: list) -> list:
            if not items:
                return items
            if isinstance(rows, slice):
                return items[rows]
            if isinstance(rows, int):
                return [items[rows]]
            return [items[i] for i in rows.detach().cpu().tolist()]

        counts = self.counts
        if counts is not None:
            at = rows if isinstance(rows, (slice, int)) else rows.detach().cpu()
            counts = counts[at] if not isinstance(rows, int) else counts[rows : rows + 1]
        return replace(self, generators=pick(self.generators), planted=pick(self.planted), counts=counts)

    def draw(self, rows: int, num_params: int, dtype: torch.dtype, device: torch.device) -> Tensor | None:
        """``[rows, P]`` the next standard normal draw of each of the first ``rows`` rows' streams (None: no noise)."""
        if self.noise_multiplier == 0:
            return None
        draw = self.normal or (lambda shape, g, dt: torch.randn(shape, generator=g, dtype=dt, device=g.device))
        out = torch.stack([draw(num_params, g, dtype) for g in self.generators[:rows]])  # on the generators' device
        return out.to(device, non_blocking=True)

    def finish(self, summed: Tensor) -> Tensor:
        """``(Σ_i ḡ_i + σ C ξ) / B`` of the first ``n`` rows from their clipped sums ``[n, P]``: each row's next noise
        draw ``ξ`` (and the sum of its sampled canaries, where an audit planted some)."""
        n, P = summed.shape
        noise = self.draw(n, P, summed.dtype, summed.device)
        if noise is not None:
            summed = summed + self.std * noise
        if any(c is not None for c in self.planted[:n]):
            rows = [torch.zeros(P, dtype=summed.dtype) if c is None else c.step(P, summed.dtype) for c in self.planted[:n]]
            summed = summed + torch.stack(rows).to(summed.device)
        return summed / self.expected_batch


def clip_and_sum(per_example: dict[str, Tensor], mask: Tensor, clip: float) -> dict[str, Tensor]:
    """``Σ_i mask_i · min(1, C / (‖g_i‖ + 10⁻⁶)) · g_i`` per parameter, from ``{name: [B, *shape]}`` per-example gradients.

    The norm of example ``i`` is over all of its parameters' gradients. Works on one client's ``[B, ...]`` (inside
    the cohort's ``vmap``, or in the loop backend).
    """
    sq = None
    for g in per_example.values():  # the squared norms without a squared copy of the gradients (one read each)
        s = torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1).square()
        sq = s if sq is None else sq + s
    factor = (clip / (sq.sqrt() + CLIP_EPSILON)).clamp(max=1.0) * mask.to(sq.dtype)
    return {name: torch.tensordot(factor.to(g.dtype), g, dims=1) for name, g in per_example.items()}


def poisson_schedule(num_examples: Tensor, num_steps: int, batch_size: int, generator: torch.Generator
                     ) -> tuple[Tensor, Tensor]:
    """Poisson batches: at every step each of client ``k``'s examples is in its batch with probability ``min(1, B/n_k)``.

    Args:
        num_examples: ``[K]`` client sizes ``n_k`` (host).
        num_steps: Steps to schedule.
        batch_size: ``B``, the expected batch.
        generator: CPU generator (both backends and every device read the same schedule).

    Returns:
        ``positions [K, T, B']`` and ``valid [K, T, B']`` as :func:`lfed.engine.batch_schedule`'s (the sampled examples
        lead each batch, in their order in the client's list), ``B'`` the largest realised batch (at least 1).
    """
    n = num_examples.detach().cpu().long()
    K, max_n, T = n.numel(), max(n.tolist(), default=0), max(int(num_steps), 0)
    if T == 0 or max_n == 0:
        empty = torch.zeros(K, T, 1, dtype=torch.long)
        return empty, empty.bool()
    q = (float(batch_size) / n.clamp_min(1).double()).clamp(max=1.0)  # [K]
    draws = torch.rand(K, T, max_n, generator=generator, dtype=torch.float64)
    taken = (draws < q[:, None, None]) & (torch.arange(max_n) < n[:, None])[:, None, :]
    counts = taken.sum(-1)
    width = max(int(counts.max()), 1)
    order = torch.sort((~taken).to(torch.uint8), dim=-1, stable=True).indices[..., :width]  # the sampled ones first
    valid = torch.arange(width) < counts[..., None]
    return order, valid


def expected_batch_check(batch_size: int | None) -> int:
    """The expected batch ``B`` of DP-SGD: a positive integer (full-batch steps have no sampling to amplify by)."""
    if batch_size is None or isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"training.batch_size: example-level DP-SGD samples each step's batch with probability B/n_k "
                         f"and divides by B; give an integer batch_size >= 1, got {batch_size!r}")
    return batch_size


def sampling_rate(num_examples: int, batch_size: int) -> float:
    """``q_k = min(1, B / n_k)`` (:func:`poisson_schedule`'s rate, for one client)."""
    return min(1.0, batch_size / max(int(num_examples), 1))
