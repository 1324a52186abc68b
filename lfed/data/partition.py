"""Split a training set among simulated clients (docs/algorithms.md §8).

Every partitioner returns one ``long`` tensor of example indices per client,
sorted ascending, on the device of ``labels``; :func:`partition_flat` gives the same split as one flat tensor
``(index, sizes)`` (the clients' lists concatenated in client order, CSR-style: no ``N`` tensors are made, which is
how :class:`~lfed.data.federated.FederatedDataset` builds a population of millions). All randomness comes from a CPU
``torch.Generator`` seeded with ``seed``, so a seed gives the same split on any
machine. The splits are disjoint; they cover the training set except where a
docstring says what is left out. Every client gets at least one example, or the
call raises ``ValueError``.

Quota rule (docs/algorithms.md §8): a total ``n`` divided into ``N`` equal parts gives every
part ``n // N`` and the first ``n mod N`` parts one more (:func:`quota_sizes`).

The splits made after partitioning (held-out and validation splits, packed indices, label counts) live in
:mod:`lfed.data.splits`; their names are importable from here too.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

from lfed.data.splits import (
    checked_int,
    holdout_split,
    label_counts,
    pack_indices,
    seeded_generator,
    validation_split,
)
from lfed.data.tensors import validate_labels

__all__ = [
    "PARTITIONS", "classes_partition", "dirichlet_partition", "holdout_split", "iid_partition", "label_counts",
    "natural_partition", "pack_indices", "partition", "partition_flat", "quota_sizes", "shards_partition",
    "validation_split",
]

#: Names accepted by :func:`partition`.
PARTITIONS: tuple[str, ...] = ("iid", "shards", "dirichlet", "classes", "natural")


def _labels(labels: Tensor, num_classes: int | None) -> tuple[Tensor, int]:
    """Check labels (1-D integer, in range); return them as CPU long and the class count C."""
    if not isinstance(labels, Tensor) or labels.dim() != 1 or labels.numel() == 0:
        shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"labels must be a non-empty 1-D integer tensor, got {shape}")
    if num_classes is None:
        validate_labels(labels, max(int(labels.max()) + 1, 1), "partition labels")
        num_classes = int(labels.max()) + 1
    validate_labels(labels, num_classes, "partition labels")
    return labels.detach().to("cpu", torch.long), num_classes


def _clients(num_clients: int, n: int) -> int:
    num_clients = checked_int("num_clients", num_clients, 1)
    if num_clients > n:
        raise ValueError(f"num_clients: must be <= the number of examples ({n}), got {num_clients}")
    return num_clients


def quota_sizes(total: int, parts: int) -> Tensor:
    """Equal quotas with the docs/algorithms.md §8 remainder rule: the first ``total mod parts`` get one more.

    Args:
        total: The amount to divide, ``>= 0``.
        parts: Number of parts, ``>= 1``.

    Returns:
        ``long [parts]`` summing to ``total``; e.g. ``quota_sizes(10, 4) = [3, 3, 2, 2]``.
    """
    total, parts = checked_int("total", total, 0), checked_int("parts", parts, 1)
    return torch.full((parts,), total // parts, dtype=torch.long) + (torch.arange(parts) < total % parts).long()


def _flat_by_owner(index: Tensor, owner: Tensor, num_clients: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Group ``index`` by ``owner`` (values >= num_clients are left out), ascending within each client, as
    ``(flat, sizes)``: client k's indices are ``flat[starts[k]:starts[k] + sizes[k]]`` (``sizes`` ``long [N]`` on
    the CPU, ``flat`` on ``device``). One sort of ``(owner, index)`` keys and one ``bincount``: no per-client tensor."""
    keep = owner < num_clients
    if not bool(keep.all()):
        index, owner = index[keep], owner[keep]
    order = torch.argsort(owner * (int(index.max()) + 1 if index.numel() else 1) + index)
    sizes = torch.bincount(owner, minlength=num_clients)
    if bool((sizes == 0).any()):
        raise ValueError(f"client {int((sizes == 0).nonzero()[0])} would get no example; use fewer clients")
    return index[order].to(device), sizes


def _as_list(flat: Tensor, sizes: Tensor) -> list[Tensor]:
    """The per-client list form of ``(flat, sizes)`` (views of ``flat``)."""
    return list(torch.split(flat, sizes.tolist()))


def _class_grouped(labels: Tensor, g: torch.Generator) -> Tensor:
    """Example indices grouped by class (ascending labels), in random order within each class."""
    perm = torch.randperm(labels.numel(), generator=g)
    return perm[torch.argsort(labels[perm], stable=True)]


def _assign_from_counts(labels: Tensor, counts: Tensor, g: torch.Generator, device: torch.device) -> tuple[Tensor, Tensor]:
    """Give client k ``counts[k, j]`` random examples of class j (``counts`` column sums <= class sizes)."""
    num_clients, num_classes = counts.shape
    order = _class_grouped(labels, g)
    available = torch.bincount(labels, minlength=num_classes)
    # per class: a block for each client, then the unassigned rest (owner = num_clients)
    blocks = torch.cat([counts.T, (available - counts.sum(0)).unsqueeze(1)], dim=1)
    owner_ids = torch.arange(num_clients + 1).repeat(num_classes)
    owner = torch.repeat_interleave(owner_ids, blocks.reshape(-1))
    return _flat_by_owner(order, owner, num_clients, device)


def iid_partition(labels: Tensor, num_clients: int, seed: int = 0) -> list[Tensor]:
    """IID split (docs/algorithms.md §8): shuffle, then equal quotas by :func:`quota_sizes`.

    Args:
        labels: ``[n]`` labels (only their number and device are used).
        num_clients: ``N``, ``1 <= N <= n``.
        seed: Seed of the shuffle.

    Returns:
        ``N`` index tensors; client k holds ``n // N + (k < n mod N)`` examples.
    """
    return _as_list(*_iid(labels, num_clients, seed))


def _iid(labels: Tensor, num_clients: int, seed: int) -> tuple[Tensor, Tensor]:
    if not isinstance(labels, Tensor) or labels.dim() != 1 or labels.numel() == 0:
        raise ValueError(f"labels must be a non-empty 1-D tensor, got {getattr(labels, 'shape', labels)!r}")
    n = labels.numel()
    num_clients = _clients(num_clients, n)
    perm = torch.randperm(n, generator=seeded_generator(seed))
    owner = torch.repeat_interleave(torch.arange(num_clients), quota_sizes(n, num_clients))
    return _flat_by_owner(perm, owner, num_clients, labels.device)


def shards_partition(labels: Tensor, num_clients: int, seed: int = 0, shards_per_client: int = 2) -> list[Tensor]:
    """Sort-and-partition (McMahan et al. 2017; 000 cross-silo; docs/algorithms.md §8).

    Examples are shuffled, then stably sorted by label (so which examples of a
    class share a shard is random, not the dataset's order), cut into
    ``S = shards_per_client * N`` contiguous shards sized by :func:`quota_sizes`
    (the first ``n mod S`` shards one longer, so nothing is left out), and the
    shards are dealt to clients by a random permutation, ``shards_per_client`` each.

    Args:
        labels: ``[n]`` integer labels.
        num_clients: ``N >= 1``.
        seed: Seed of the shuffle and the dealing.
        shards_per_client: Shards per client, ``>= 1``, with ``shards_per_client * N <= n``.

    Returns:
        ``N`` index tensors.
    """
    return _as_list(*_shards(labels, num_clients, seed, shards_per_client))


def _shards(labels: Tensor, num_clients: int, seed: int, shards_per_client: int) -> tuple[Tensor, Tensor]:
    labels_cpu, _ = _labels(labels, None)
    n = labels_cpu.numel()
    num_clients = _clients(num_clients, n)
    shards_per_client = checked_int("shards_per_client", shards_per_client, 1)
    num_shards = shards_per_client * num_clients
    if num_shards > n:
        raise ValueError(f"shards_per_client * num_clients must be <= the number of examples ({n}), "
                         f"got {shards_per_client} * {num_clients} = {num_shards}")
    g = seeded_generator(seed)
    order = _class_grouped(labels_cpu, g)
    shard_of_position = torch.repeat_interleave(torch.arange(num_shards), quota_sizes(n, num_shards))
    client_of_shard = torch.empty(num_shards, dtype=torch.long)
    client_of_shard[torch.randperm(num_shards, generator=g)] = torch.arange(num_shards) // shards_per_client
    return _flat_by_owner(order, client_of_shard[shard_of_position], num_clients, labels.device)


def _log_gamma_samples(shape: float, size: tuple[int, ...], g: torch.Generator) -> Tensor:
    """``log`` of Gamma(shape, 1) draws in float64, driven by ``g`` alone.

    Marsaglia & Tsang (2000) for shape ``a >= 1``; for ``a < 1`` the boost
    ``G(a) = G(a + 1) * U^(1/a)``, applied in log space so tiny concentrations
    (``rho / C = 0.01``) do not underflow to zero. Rejection runs in vectorised
    rounds over the pending draws (acceptance > 95 %).
    """
    a = shape + 1.0 if shape < 1.0 else shape
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    numel = math.prod(size)
    out = torch.empty(numel, dtype=torch.float64)
    pending = torch.arange(numel)
    while pending.numel():
        x = torch.randn(pending.numel(), generator=g, dtype=torch.float64)
        u = 1.0 - torch.rand(pending.numel(), generator=g, dtype=torch.float64)  # (0, 1]
        v = (1.0 + c * x) ** 3
        log_v = torch.log(v.clamp(min=1e-300))
        ok = (v > 0) & (torch.log(u) < 0.5 * x * x + d - d * v + d * log_v)
        out[pending[ok]] = math.log(d) + log_v[ok]
        pending = pending[~ok]
    if shape < 1.0:
        out += torch.log(1.0 - torch.rand(numel, generator=g, dtype=torch.float64)) / shape
    return out.reshape(size)


def dirichlet_partition(
    labels: Tensor, num_clients: int, seed: int = 0, rho: float = 1.0, num_classes: int | None = None
) -> list[Tensor]:
    """Dirichlet label skew (Hsu et al. 2019; 000 cross-device; docs/algorithms.md §8).

    Client k draws class proportions ``c_k ~ Dir(rho / C, ..., rho / C)`` and
    gets the quota ``n / N`` (:func:`quota_sizes`), filled by drawing labels from
    ``c_k`` renormalised over the classes not yet exhausted. The draws run in
    rounds: every client with quota left draws all of it at once (categorical
    draws with ``torch.multinomial``); a class asked for more than it has left
    grants its remaining examples to a uniformly random subset of the requests
    (as if all draws were made one at a time in random order) and is then
    exhausted; refused draws are redrawn next round. This ends after at most
    ``C + 1`` rounds, fills every quota exactly (so every client has
    ``>= 1`` example) and covers the training set. Which examples of a class a
    client gets is uniformly random.

    Args:
        labels: ``[n]`` integer labels.
        num_clients: ``N``, ``1 <= N <= n``.
        seed: Seed of the proportions and the draws.
        rho: Concentration ``rho > 0`` (``{1000, 1, 0.1}`` in 000); per-class
            ``alpha = rho / C`` (NIID-Bench's 0.5 on 10 classes is ``rho = 5``).
        num_classes: ``C``; default ``max(labels) + 1``. Classes without
            examples are exhausted from the start.

    Returns:
        ``N`` index tensors; client k holds ``n // N + (k < n mod N)`` examples.
    """
    return _as_list(*_dirichlet(labels, num_clients, seed, rho, num_classes))


def _dirichlet(labels: Tensor, num_clients: int, seed: int, rho: float, num_classes: int | None) -> tuple[Tensor, Tensor]:
    labels_cpu, num_classes = _labels(labels, num_classes)
    n = labels_cpu.numel()
    num_clients = _clients(num_clients, n)
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not rho > 0 or not math.isfinite(rho):
        raise ValueError(f"rho must be a finite number > 0, got {rho!r}")
    g = seeded_generator(seed)
    log_c = _log_gamma_samples(float(rho) / num_classes, (num_clients, num_classes), g)  # log of unnormalised c_k
    remaining = quota_sizes(n, num_clients)
    available = torch.bincount(labels_cpu, minlength=num_classes)
    counts = torch.zeros(num_clients, num_classes, dtype=torch.long)
    while bool((remaining > 0).any()):
        active = (remaining > 0).nonzero().squeeze(1)
        want = remaining[active]
        logits = log_c[active].masked_fill(available == 0, -math.inf)
        probs = torch.softmax(logits, dim=1)  # c_k renormalised over classes with examples left
        draws = torch.multinomial(probs, int(want.max()), replacement=True, generator=g)
        valid = torch.arange(draws.shape[1]) < want.unsqueeze(1)
        request = torch.zeros_like(probs, dtype=torch.long).scatter_add_(1, draws, valid.long())
        grant = request.clone()
        for j in (request.sum(0) > available).nonzero().squeeze(1).tolist():  # over-asked classes (<= C)
            units = torch.repeat_interleave(torch.arange(active.numel()), request[:, j])
            chosen = units[torch.randperm(units.numel(), generator=g)[: int(available[j])]]
            grant[:, j] = torch.bincount(chosen, minlength=active.numel())
        counts[active] += grant
        remaining[active] -= grant.sum(1)
        available -= grant.sum(0)
    return _assign_from_counts(labels_cpu, counts, g, labels.device)


def classes_partition(
    labels: Tensor, num_clients: int, seed: int = 0, classes_per_client: int = 2, num_classes: int | None = None
) -> list[Tensor]:
    """Every client holds examples of exactly ``m`` classes (004 §5.2, "non-IID (m)"; docs/algorithms.md §8).

    004 says only that every client is assigned samples from exactly ``m``
    classes. lfed's reading, after the non-iid(m) split of Sattler et al. (2019,
    whose sparse ternary compression 004 builds on) where a client takes ``m``
    consecutive classes from a random start: the ``C'`` classes that have
    examples are put in a random cyclic order; window ``b = 0..N-1`` is the ``m``
    consecutive classes starting at position ``floor(b * C' / N)`` (evenly
    spread starts, so each class is held by about ``N m / C'`` clients), and a
    random permutation of the clients assigns the windows. Each class's examples
    are shuffled and divided equally among its holders (:func:`quota_sizes`, in
    client order). With ``N m >= C'`` the split covers the training set; with
    ``N m < C'`` the classes no window reaches are left out (a warning names them).

    Args:
        labels: ``[n]`` integer labels.
        num_clients: ``N``, ``1 <= N <= n``.
        seed: Seed of the class order, the client permutation and the shuffle.
        classes_per_client: ``m``, in ``[1, C]`` and at most the number of classes with examples.
        num_classes: ``C``; default ``max(labels) + 1``.

    Returns:
        ``N`` index tensors, each with examples of exactly ``m`` classes.

    Raises:
        ValueError: Bad arguments, or a class with fewer examples than holders.
    """
    return _as_list(*_classes(labels, num_clients, seed, classes_per_client, num_classes))


def _classes(labels: Tensor, num_clients: int, seed: int, classes_per_client: int, num_classes: int | None) -> tuple[Tensor, Tensor]:
    labels_cpu, num_classes = _labels(labels, num_classes)
    num_clients = _clients(num_clients, labels_cpu.numel())
    m = checked_int("classes_per_client", classes_per_client, 1)
    if m > num_classes:
        raise ValueError(f"classes_per_client must be in [1, {num_classes}] (num_classes), got {m}")
    available = torch.bincount(labels_cpu, minlength=num_classes)
    present = (available > 0).nonzero().squeeze(1)
    if m > present.numel():
        raise ValueError(f"classes_per_client must be <= the {present.numel()} classes that have examples, got {m}")
    g = seeded_generator(seed)
    cycle = present[torch.randperm(present.numel(), generator=g)]
    starts = torch.arange(num_clients) * present.numel() // num_clients
    windows = cycle[(starts.unsqueeze(1) + torch.arange(m)) % present.numel()]  # [N, m] distinct classes
    windows = windows[torch.argsort(torch.randperm(num_clients, generator=g))]  # client perm[b] gets window b
    holds = torch.zeros(num_clients, num_classes, dtype=torch.bool)
    holds[torch.arange(num_clients).unsqueeze(1), windows] = True
    holders = holds.sum(0)
    short = (holders > available).nonzero().squeeze(1)
    if short.numel():
        j = int(short[0])
        raise ValueError(f"class {j} has {int(available[j])} examples but {int(holders[j])} clients hold it; "
                         f"use fewer clients or a smaller classes_per_client")
    left_out = ((holders == 0) & (available > 0)).nonzero().squeeze(1)
    if left_out.numel():
        warnings.warn(f"classes partition leaves out classes {left_out.tolist()} "
                      f"({int(available[left_out].sum())} examples): num_clients * classes_per_client "
                      f"= {num_clients * m} < {present.numel()} classes", stacklevel=3)
    rank = holds.long().cumsum(0) - 1  # rank of a client among the holders of a class
    base, extra = available // holders.clamp(min=1), available % holders.clamp(min=1)
    counts = torch.where(holds, base + (rank < extra).long(), torch.zeros_like(rank))
    return _assign_from_counts(labels_cpu, counts, g, labels.device)


def natural_partition(groups: Tensor, num_clients: int | None = None) -> list[Tensor]:
    """One client per natural group, e.g. a LEAF writer or role (docs/algorithms.md §8).

    Args:
        groups: ``[n]`` integer group id of every example (``DatasetTensors.train_groups``).
        num_clients: ``None`` for every group, or ``N`` to keep the first ``N``
            groups in ascending id order (the other groups' examples are left out).

    Returns:
        One index tensor per kept group, in ascending group id order.
    """
    return _as_list(*_natural(groups, num_clients))


def _natural(groups: Tensor, num_clients: int | None) -> tuple[Tensor, Tensor]:
    if not isinstance(groups, Tensor) or groups.dim() != 1 or groups.numel() == 0 \
            or groups.dtype.is_floating_point or groups.dtype == torch.bool:
        raise ValueError(f"groups must be a non-empty 1-D integer tensor, got {getattr(groups, 'shape', groups)!r}")
    groups_cpu = groups.detach().to("cpu", torch.long)
    ids = torch.unique(groups_cpu)
    if num_clients is None:
        num_clients = ids.numel()
    num_clients = checked_int("num_clients", num_clients, 1)
    if num_clients > ids.numel():
        raise ValueError(f"num_clients: must be <= the {ids.numel()} groups for the natural partition, "
                         f"got {num_clients}")
    owner = torch.searchsorted(ids, groups_cpu)
    return _flat_by_owner(torch.arange(groups_cpu.numel()), owner, num_clients, groups.device)


def partition(
    labels: Tensor,
    num_clients: int | None,
    scheme: str,
    seed: int = 0,
    *,
    rho: float = 1.0,
    shards_per_client: int = 2,
    classes_per_client: int = 2,
    num_classes: int | None = None,
    groups: Tensor | None = None,
) -> list[Tensor]:
    """Split a training set among clients with one of :data:`PARTITIONS` (docs/algorithms.md §8).

    Args:
        labels: ``[n]`` integer training labels.
        num_clients: ``N``; ``None`` only for ``natural`` (one client per group).
        scheme: ``iid``, ``shards``, ``dirichlet``, ``classes`` or ``natural``.
        seed: Seed of the split.
        rho: Dirichlet concentration (``dirichlet``).
        shards_per_client: Shards per client (``shards``).
        classes_per_client: Classes per client ``m`` (``classes``).
        num_classes: ``C`` (``dirichlet``, ``classes``); default ``max(labels) + 1``.
        groups: ``[n]`` natural group ids (``natural``).

    Returns:
        One ``long`` index tensor per client, on the device of ``labels`` (:func:`partition_flat` concatenated).
    """
    return _as_list(*partition_flat(labels, num_clients, scheme, seed, rho=rho, shards_per_client=shards_per_client,
                                    classes_per_client=classes_per_client, num_classes=num_classes, groups=groups))


def partition_flat(
    labels: Tensor,
    num_clients: int | None,
    scheme: str,
    seed: int = 0,
    *,
    rho: float = 1.0,
    shards_per_client: int = 2,
    classes_per_client: int = 2,
    num_classes: int | None = None,
    groups: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`partition` as one flat tensor: the clients' index lists concatenated in client order, and their sizes.

    The same split as :func:`partition` for every scheme and seed (the list is ``torch.split(index, sizes)``), built
    with one sort and one ``bincount`` and never a tensor per client: the form a population of millions is built in.

    Returns:
        ``(index, sizes)``: ``index`` ``long [sum n_k]`` on the device of ``labels``, client k's sorted indices at
        ``index[s_k : s_k + sizes[k]]`` with ``s_k = sizes[:k].sum()``; ``sizes`` ``long [N]`` on the CPU, all ``>= 1``.
    """
    if scheme not in PARTITIONS:
        raise ValueError(f"scheme must be one of {PARTITIONS}, got {scheme!r}")
    if scheme == "natural":
        if groups is None:
            raise ValueError("groups must be given for scheme='natural' (e.g. DatasetTensors.train_groups), got None")
        if not isinstance(labels, Tensor) or groups.shape != labels.shape:
            raise ValueError(f"groups must have the shape of labels {tuple(getattr(labels, 'shape', ()))}, "
                             f"got {tuple(groups.shape)}")
        index, sizes = _natural(groups, num_clients)
        return index.to(labels.device), sizes
    if num_clients is None:
        raise ValueError(f"num_clients must be an int >= 1 for scheme={scheme!r}, got None")
    if scheme == "iid":
        return _iid(labels, num_clients, seed)
    if scheme == "shards":
        return _shards(labels, num_clients, seed, shards_per_client)
    if scheme == "dirichlet":
        return _dirichlet(labels, num_clients, seed, rho, num_classes)
    return _classes(labels, num_clients, seed, classes_per_client, num_classes)
