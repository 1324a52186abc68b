"""How a cohort is drawn uniformly: :data:`DRAWS` (the two rules a run may keep) and :func:`uniform_draw` (O(k) whatever
``N``), the draw of :class:`~lfed.participation.sampling.UniformSampler` and of asynchronous dispatch."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["DRAWS", "uniform_draw"]


#: How a cohort is drawn: ``"rejection"`` (0.6 on: O(K), :func:`uniform_draw`) or ``"permutation"`` (lfed 0.5 and
#: earlier: the first ``k`` of ``randperm(N)``, O(N)). A run keeps the draws it was made with: a checkpoint of 0.5 resumes
#: with ``"permutation"`` (:meth:`lfed.core.run.FederatedRun.load_extra_state`).
DRAWS = ("rejection", "permutation")


def uniform_draw(num_clients: int, k: int, generator: torch.Generator, exclude: Tensor | None = None) -> Tensor:
    """``[k]`` distinct clients of ``range(num_clients)`` not in ``exclude``, uniformly without replacement, in draw order.

    With ``k + |exclude| ≤ N/2``, in O(k) expected time and memory whatever ``N``: batches of ``max(2 m, 16)`` integers
    uniform in ``[0, N)`` (``m`` the clients still missing) from ``generator``, each kept at its first appearance unless
    excluded, until ``k`` are kept (every ``k``-subset of the allowed clients equally likely: the first ``k`` distinct
    values of an i.i.d. uniform sequence, rejection keeping uniformity). Otherwise (a large share of the population)
    the first ``k`` allowed clients of ``randperm(N)``, O(N). Drawn on the generator's device.
    """
    N = int(num_clients)
    device = generator.device
    banned = set() if exclude is None else set(exclude.detach().cpu().long().tolist())  # (the dispatch's few busy)
    if k + len(banned) > N / 2:
        perm = torch.randperm(N, generator=generator, device=device)
        if banned:
            perm = perm[~torch.isin(perm, torch.tensor(sorted(banned), dtype=perm.dtype, device=device))]
        return perm[:k]
    kept = torch.zeros(0, dtype=torch.long, device=device)
    seen = torch.tensor(sorted(banned), dtype=torch.long, device=device)  # the excluded, then those kept
    while kept.numel() < k:
        m = max(2 * (k - kept.numel()), 16)
        draws = torch.randint(0, N, (m,), generator=generator, device=device)
        values_, inverse = torch.unique(draws, return_inverse=True)  # each value's first position in the batch:
        first = torch.full_like(values_, m).scatter_reduce(0, inverse, torch.arange(m, device=device), "amin")
        new = ~torch.isin(values_, seen)
        order = first[new].argsort()  # the new values in the order they first appeared
        taken = values_[new][order][: k - kept.numel()]
        kept = torch.cat([kept, taken])
        seen = torch.cat([seen, taken])
    return kept
