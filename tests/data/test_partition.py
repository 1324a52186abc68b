"""Tests for lfed.data.partition and lfed.data.splits (SPEC §8)."""

from __future__ import annotations

import warnings

import pytest
import torch

from lfed.data.partition import (
    PARTITIONS,
    _log_gamma_samples,
    classes_partition,
    dirichlet_partition,
    holdout_split,
    iid_partition,
    label_counts,
    natural_partition,
    pack_indices,
    partition,
    quota_sizes,
    shards_partition,
)


def _balanced(num_classes: int, per_class: int) -> torch.Tensor:
    """Labels sorted by class: [0]*per_class + [1]*per_class + ..."""
    return torch.arange(num_classes).repeat_interleave(per_class)


def _check_disjoint_cover(parts: list[torch.Tensor], n: int) -> None:
    flat = torch.cat(parts)
    assert flat.dtype == torch.long
    assert flat.numel() == n, "not covering (or overlapping)"
    assert torch.equal(torch.sort(flat).values, torch.arange(n)), "not a disjoint cover of 0..n-1"
    assert all(p.numel() >= 1 for p in parts)
    assert all(torch.equal(p, torch.sort(p).values) for p in parts), "indices not ascending within a client"


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_quota_sizes_by_hand() -> None:
    # 10 into 4: 10 // 4 = 2, 10 mod 4 = 2 -> the first two parts get 3.
    assert quota_sizes(10, 4).tolist() == [3, 3, 2, 2]
    # 3 into 5: 0 each, first 3 get one.
    assert quota_sizes(3, 5).tolist() == [1, 1, 1, 0, 0]
    assert quota_sizes(12, 3).tolist() == [4, 4, 4]
    with pytest.raises(ValueError, match="parts"):
        quota_sizes(3, 0)


def test_iid_sizes_cover_and_match_the_documented_shuffle() -> None:
    labels = torch.zeros(10, dtype=torch.long)
    parts = iid_partition(labels, 3, seed=5)
    _check_disjoint_cover(parts, 10)
    assert [p.numel() for p in parts] == [4, 3, 3]  # 10 = 3*3 + 1: client 0 gets the extra one
    # By hand: the shuffle is randperm(10) from Generator().manual_seed(5), cut 4 | 3 | 3.
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(5))
    expected = [torch.sort(perm[:4]).values, torch.sort(perm[4:7]).values, torch.sort(perm[7:]).values]
    assert _same(parts, expected)


@pytest.mark.parametrize("scheme", ["iid", "shards", "dirichlet", "classes"])
def test_every_scheme_is_deterministic_per_seed(scheme: str) -> None:
    labels = _balanced(10, 30)[torch.randperm(300, generator=torch.Generator().manual_seed(0))]
    a = partition(labels, 10, scheme, seed=3, rho=1.0)
    b = partition(labels, 10, scheme, seed=3, rho=1.0)
    c = partition(labels, 10, scheme, seed=4, rho=1.0)
    assert _same(a, b)
    assert not _same(a, c)
    _check_disjoint_cover(a, 300)


def test_shards_on_sorted_data_give_at_most_two_labels() -> None:
    # 10 classes x 20 = 200 sorted examples, N = 10, 2 shards each -> 20 shards of 10 examples,
    # each shard inside one class, so every client sees at most 2 labels and exactly 20 examples.
    labels = _balanced(10, 20)
    parts = shards_partition(labels, 10, seed=0, shards_per_client=2)
    _check_disjoint_cover(parts, 200)
    counts = label_counts(labels, parts, 10)
    assert ((counts > 0).sum(1) <= 2).all()
    assert [p.numel() for p in parts] == [20] * 10
    assert (counts % 10 == 0).all()  # whole shards of 10


def test_shards_by_hand_one_class_per_shard() -> None:
    # labels 0,0,1,1,2,2,3,3; N=2, 2 shards each -> 4 shards of 2 = one class each;
    # each client gets two whole classes: its label-count row has two 2s.
    labels = _balanced(4, 2)
    parts = shards_partition(labels, 2, seed=1)
    counts = label_counts(labels, parts, 4)
    assert sorted(counts[0].tolist()) == [0, 0, 2, 2]
    assert sorted(counts[1].tolist()) == [0, 0, 2, 2]
    assert torch.equal(counts.sum(0), torch.tensor([2, 2, 2, 2]))


def test_shards_quota_rule_covers_the_remainder() -> None:
    # n = 10, 4 shards -> shard sizes [3, 3, 2, 2]; clients get 2 shards: sizes in {4, 5, 6}, all 10 used.
    labels = torch.arange(10) % 3
    parts = shards_partition(labels, 2, seed=0)
    _check_disjoint_cover(parts, 10)
    assert sorted(p.numel() for p in parts) in ([4, 6], [5, 5])


def test_dirichlet_quota_rule_and_every_client_nonempty() -> None:
    labels = torch.arange(5003) % 10
    parts = dirichlet_partition(labels, 10, seed=0, rho=0.1)
    _check_disjoint_cover(parts, 5003)
    assert [p.numel() for p in parts] == [501, 501, 501] + [500] * 7
    # N = n: every client gets exactly one example even with a very skewed prior.
    parts = dirichlet_partition(torch.arange(10) % 3, 10, seed=2, rho=0.01)
    assert [p.numel() for p in parts] == [1] * 10
    _check_disjoint_cover(parts, 10)


def _mean_tv_to_uniform(labels: torch.Tensor, parts: list[torch.Tensor], num_classes: int) -> float:
    counts = label_counts(labels, parts, num_classes).double()
    p = counts / counts.sum(1, keepdim=True)
    return float((0.5 * (p - 1.0 / num_classes).abs().sum(1)).mean())


def test_dirichlet_concentration_controls_skew() -> None:
    # 10 classes x 500, 10 clients of 500. Statistic: mean total-variation distance between a
    # client's label mix and the uniform population mix. With rho = 1000 (alpha = 100 per class)
    # the prior is near uniform and only sampling noise remains (about 0.06); with rho = 0.1
    # (alpha = 0.01) each prior is nearly one-hot (about 0.7).
    labels = _balanced(10, 500)
    flat = _mean_tv_to_uniform(labels, dirichlet_partition(labels, 10, seed=0, rho=1000.0), 10)
    skew = _mean_tv_to_uniform(labels, dirichlet_partition(labels, 10, seed=0, rho=0.1), 10)
    assert flat < 0.15
    assert skew > 0.5


def test_dirichlet_skips_classes_without_examples() -> None:
    # num_classes = 12 but classes 10 and 11 have no examples: nobody can draw them.
    labels = _balanced(10, 20)
    parts = dirichlet_partition(labels, 5, seed=0, rho=1.0, num_classes=12)
    _check_disjoint_cover(parts, 200)
    assert label_counts(labels, parts, 12)[:, 10:].sum() == 0


@pytest.mark.parametrize("shape", [2.5, 0.3])
def test_log_gamma_sampler_moments(shape: float) -> None:
    # Gamma(a, 1) has mean a and variance a. 200k draws: standard error of the mean sqrt(a / 2e5) < 0.004.
    g = torch.Generator().manual_seed(0)
    x = _log_gamma_samples(shape, (200_000,), g).exp()
    assert x.dtype == torch.float64
    assert abs(float(x.mean()) - shape) < 0.02
    assert abs(float(x.var()) - shape) < 0.05 * shape + 0.02
    assert torch.isfinite(_log_gamma_samples(0.001, (1000,), g)).all()  # tiny alpha: no underflow to -inf


@pytest.mark.parametrize("num_clients,m", [(10, 2), (7, 3), (25, 1), (4, 10)])
def test_classes_gives_exactly_m_labels(num_clients: int, m: int) -> None:
    labels = _balanced(10, 30)[torch.randperm(300, generator=torch.Generator().manual_seed(1))]
    parts = classes_partition(labels, num_clients, seed=0, classes_per_client=m)
    _check_disjoint_cover(parts, 300)  # N * m >= 10 classes: everything is covered
    assert ((label_counts(labels, parts, 10) > 0).sum(1) == m).all()


def test_classes_by_hand_even_split_among_holders() -> None:
    # 4 classes x 6; N = 2, m = 2: windows start at positions 0 and 2 of the random class cycle,
    # so the two clients hold two different pairs, each class held once: 12 examples each.
    labels = _balanced(4, 6)
    parts = classes_partition(labels, 2, seed=0, classes_per_client=2)
    counts = label_counts(labels, parts, 4)
    assert sorted(counts[0].tolist()) == [0, 0, 6, 6]
    assert torch.equal(counts.sum(0), torch.tensor([6, 6, 6, 6]))
    # 2 classes x 5; N = 3, m = 2: every client holds both classes; 5 = 2 + 2 + 1 per class.
    labels = _balanced(2, 5)
    counts = label_counts(labels, classes_partition(labels, 3, seed=0), 2)
    assert counts.tolist() == [[2, 2], [2, 2], [1, 1]]


def test_classes_leaves_out_unreached_classes_with_a_warning() -> None:
    # N * m = 2 * 2 = 4 < 10 classes: 6 classes are left out.
    labels = _balanced(10, 3)
    with pytest.warns(UserWarning, match="leaves out classes"):
        parts = classes_partition(labels, 2, seed=0, classes_per_client=2)
    assert sum(p.numel() for p in parts) == 4 * 3
    assert ((label_counts(labels, parts, 10) > 0).sum(1) == 2).all()


def test_natural_partition_by_hand() -> None:
    groups = torch.tensor([5, 5, 2, 7, 2])
    parts = natural_partition(groups)  # ids sorted: 2 -> [2, 4], 5 -> [0, 1], 7 -> [3]
    assert [p.tolist() for p in parts] == [[2, 4], [0, 1], [3]]
    assert [p.tolist() for p in natural_partition(groups, 2)] == [[2, 4], [0, 1]]
    via = partition(torch.zeros(5, dtype=torch.long), None, "natural", groups=groups)
    assert [p.tolist() for p in via] == [[2, 4], [0, 1], [3]]
    with pytest.raises(ValueError, match="num_clients"):
        natural_partition(groups, 4)
    with pytest.raises(ValueError, match="groups"):
        partition(torch.zeros(5, dtype=torch.long), 3, "natural")


def test_holdout_split_by_hand() -> None:
    clients = [torch.arange(10), torch.tensor([10]), torch.tensor([11, 12, 13]), torch.arange(14, 114)]
    train, hold = holdout_split(clients, 0.25, seed=0)
    # h = min(floor(0.25 n + 0.5), n - 1): 10 -> 3; 1 -> 0 (keeps its only example); 3 -> 1; 100 -> 25
    assert [h.numel() for h in hold] == [3, 0, 1, 25]
    assert [t.numel() for t in train] == [7, 1, 2, 75]
    for c, t, h in zip(clients, train, hold):
        assert torch.equal(torch.sort(torch.cat([t, h])).values, c)
        assert torch.equal(t, torch.sort(t).values)  # input order kept
    # 100 * 0.29 = 28.999999999999996 -> rounds to 29, and n - 1 caps large fractions
    assert holdout_split([torch.arange(100)], 0.29)[1][0].numel() == 29
    assert holdout_split([torch.arange(3)], 0.99)[1][0].numel() == 2
    zero_train, zero_hold = holdout_split(clients, 0.0)
    assert all(h.numel() == 0 for h in zero_hold) and _same(zero_train, clients)
    assert _same(holdout_split(clients, 0.25, seed=0)[1], hold)
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="fraction"):
            holdout_split(clients, bad)


def test_pack_indices_and_label_counts_by_hand() -> None:
    index, sizes = pack_indices([torch.tensor([3, 1]), torch.tensor([7]), torch.tensor([2, 4, 6])])
    assert index.tolist() == [[3, 1, 0], [7, 0, 0], [2, 4, 6]]
    assert sizes.tolist() == [2, 1, 3]
    labels = torch.tensor([0, 1, 1, 2, 0])
    # client 0 = examples 0, 1 -> labels 0, 1; client 1 = examples 2, 3, 4 -> labels 1, 2, 0
    counts = label_counts(labels, [torch.tensor([0, 1]), torch.tensor([2, 3, 4])], 3)
    assert counts.tolist() == [[1, 1, 0], [1, 1, 1]]
    with pytest.raises(ValueError, match="label 2"):
        label_counts(labels, [torch.tensor([3])], 2)


def test_int32_labels_and_output_dtype() -> None:
    labels = _balanced(4, 5).to(torch.int32)
    for scheme in ("iid", "shards", "dirichlet", "classes"):
        parts = partition(labels, 4, scheme)
        assert all(p.dtype == torch.long and p.device == labels.device for p in parts)
        _check_disjoint_cover(parts, 20)


def test_dirichlet_mnist_sized_split_is_valid() -> None:
    labels = torch.randint(0, 10, (60_000,), generator=torch.Generator().manual_seed(0))
    parts = dirichlet_partition(labels, 100, seed=0, rho=0.1)
    _check_disjoint_cover(parts, 60_000)
    assert [p.numel() for p in parts] == [600] * 100


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_clients=0, scheme="iid"), "num_clients"),
        (dict(num_clients=21, scheme="iid"), "num_clients"),
        (dict(num_clients=True, scheme="iid"), "num_clients"),
        (dict(num_clients=None, scheme="iid"), "num_clients"),
        (dict(num_clients=2, scheme="dirichlet", rho=0.0), "rho"),
        (dict(num_clients=2, scheme="dirichlet", rho=-1.0), "rho"),
        (dict(num_clients=2, scheme="dirichlet", rho=float("inf")), "rho"),
        (dict(num_clients=2, scheme="kmeans"), "iid.*shards.*dirichlet.*classes.*natural"),
        (dict(num_clients=5, scheme="shards", shards_per_client=5), "shards_per_client"),
        (dict(num_clients=2, scheme="shards", shards_per_client=0), "shards_per_client"),
        (dict(num_clients=2, scheme="classes", classes_per_client=0), "classes_per_client"),
        (dict(num_clients=2, scheme="classes", classes_per_client=5), "classes_per_client"),
        (dict(num_clients=2, scheme="classes", classes_per_client=5, num_classes=6), "classes that have examples"),
        (dict(num_clients=2, scheme="dirichlet", num_classes=3), "label 3"),
        (dict(num_clients=2, scheme="iid", seed=1.5), "seed"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, match: str) -> None:
    labels = _balanced(4, 5)  # n = 20, C = 4
    with pytest.raises(ValueError, match=match):
        partition(labels, **kwargs)


def test_classes_with_too_few_examples_for_its_holders_raises() -> None:
    # classes 0 (4 examples) and 1 (1 example); 3 clients x 2 classes: class 1 would need 3 holders.
    with pytest.raises(ValueError, match="class 1 has 1 examples but 3 clients"):
        classes_partition(torch.tensor([0, 0, 0, 0, 1]), 3, classes_per_client=2)


def test_bad_labels_raise() -> None:
    with pytest.raises(ValueError, match="labels"):
        partition(torch.zeros(2, 3, dtype=torch.long), 2, "shards")
    with pytest.raises(ValueError, match="label -1"):
        partition(torch.tensor([0, -1, 1]), 2, "dirichlet")
    with pytest.raises(ValueError, match="integer"):
        partition(torch.tensor([0.0, 1.0]), 2, "classes")
    assert PARTITIONS == ("iid", "shards", "dirichlet", "classes", "natural")


def test_no_warning_when_everything_is_covered() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        classes_partition(_balanced(10, 3), 5, classes_per_client=2)


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5])
def test_flat_helpers_equal_the_per_client_lists(fraction):
    """FederatedDataModule.build uses the concatenated forms (no tensor per client, for 10^5
    clients); they give exactly what the per-client list functions give."""
    from lfed.data.splits import (
        flatten_indices,
        holdout_split,
        holdout_split_flat,
        label_counts,
        label_counts_flat,
        pack_flat,
        pack_indices,
    )

    labels = torch.randint(0, 4, (300,), generator=torch.Generator().manual_seed(0))
    parts = dirichlet_partition(labels, 37, seed=3, rho=0.3)
    train, hold = holdout_split(parts, fraction, seed=5)
    flat, sizes = flatten_indices(parts)
    t_flat, t_sizes, h_flat, h_sizes = holdout_split_flat(flat, sizes, fraction, seed=5)
    assert torch.equal(torch.cat(train), t_flat) and torch.equal(torch.cat(hold), h_flat)
    assert t_sizes.tolist() == [t.numel() for t in train] and h_sizes.tolist() == [h.numel() for h in hold]
    index, packed_sizes = pack_indices(train)
    assert torch.equal(pack_flat(t_flat, t_sizes), index) and torch.equal(packed_sizes, t_sizes)
    assert torch.equal(label_counts_flat(labels, t_flat, t_sizes, 4), label_counts(labels, train, 4))


@pytest.mark.parametrize("given, partition, read_by", [({"rho": 0.01}, "iid", "dirichlet"),
                                                       ({"shards_per_client": 3}, "dirichlet", "shards"),
                                                       ({"classes_per_client": 4}, "shards", "classes")])
def test_a_partition_setting_the_partition_ignores_is_said_before_round_0(given, partition, read_by):
    """``rho`` with ``partition: iid`` (and the like) would change nothing: one warning naming who reads it (issue 51)."""
    from lfed.data.federated import FederatedDataset, UnusedSettingWarning

    (name, value), = given.items()
    with pytest.warns(UnusedSettingWarning) as caught:
        FederatedDataset(partition=partition, **given)
    assert [str(w.message) for w in caught] == [
        f"{name}: {value} does nothing with partition: {partition!r} (only partition: {read_by!r} reads it)"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnusedSettingWarning)
        FederatedDataset(partition=read_by, **given)  # read: nothing said
        FederatedDataset(partition=partition)  # the defaults: nothing said
