"""Tests for lfed.participation: sampling, fractions, draws (SPEC §5), stragglers (SPEC §6); lfed.evaluation.communication."""

import io
import math

import pytest
import torch

from lfed.evaluation.communication import CommunicationMeter, rounds_to_reach
from lfed.participation.fractions import (
    ConstantFraction,
    ExplicitFraction,
    FractionSchedule,
    StepwiseFraction,
    as_schedule,
    cohort_size,
    round_half_up,
)
from lfed.participation.sampling import AttentionSampler, PoissonSampler, UniformSampler
from lfed.participation.stragglers import Stragglers
from lfed.rng import round_generator

F64 = torch.float64


# --------------------------------------------------------------------------- rounding


@pytest.mark.parametrize(
    "x, expected",
    [
        (0.29 * 100, 29),  # 28.999999999999996; int() gives 28
        (0.5, 1),
        (2.5, 3),
        (0.1 * 100, 10),
        (0.05 * 10, 1),  # 0.5 -> 1
        (0.145 * 100, 15),  # 14.499999999999998 is meant as 14.5 -> 15
        (1.4999, 1),
        (2.4, 2),
        (3.0, 3),
        (0, 0),
        (-0.5, 0),  # floor(-0.5 + 0.5) = 0
        (-2.5, -2),
    ],
)
def test_round_half_up(x, expected):
    assert round_half_up(x) == expected


def test_round_half_up_fixes_what_plain_formulas_get_wrong():
    # The cases above must be able to fail: the naive formulas are wrong on them.
    assert int(0.29 * 100) == 28
    assert math.floor(0.145 * 100 + 0.5) == 14
    assert round(2.5) == 2  # Python rounds halves to even


@pytest.mark.parametrize("x", [float("nan"), float("inf"), "1", None, True])
def test_round_half_up_rejects_non_finite(x):
    with pytest.raises(ValueError, match="x must be"):
        round_half_up(x)


@pytest.mark.parametrize(
    "fraction, n, expected",
    [
        (0.1, 100, 10),
        (0.29, 100, 29),
        (0.145, 100, 15),
        (0.5, 3, 2),  # 1.5 -> 2
        (0.05, 10, 1),  # 0.5 -> 1
        (0.001, 100, 1),  # 0.1 rounds to 0, max(1, .) gives 1
        (1.0, 7, 7),
        (0.3, 1, 1),
    ],
)
def test_cohort_size(fraction, n, expected):
    assert cohort_size(fraction, n) == expected


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.01, float("nan"), "0.1"])
def test_cohort_size_rejects_bad_fraction(fraction):
    with pytest.raises(ValueError, match="fraction"):
        cohort_size(fraction, 10)


@pytest.mark.parametrize("n", [0, -3, 2.0])
def test_cohort_size_rejects_bad_num_clients(n):
    with pytest.raises(ValueError, match="num_clients"):
        cohort_size(0.1, n)


# --------------------------------------------------------------------------- schedules


def test_constant_fraction():
    c = ConstantFraction(0.2)
    assert [c(r) for r in range(3)] == [0.2, 0.2, 0.2]
    assert c(5, 10) == 0.2
    with pytest.raises(ValueError, match="fraction"):
        ConstantFraction(0.0)
    with pytest.raises(ValueError, match="fraction"):
        ConstantFraction(1.5)
    with pytest.raises(ValueError, match="round"):
        c(-1)
    with pytest.raises(ValueError, match="total_rounds"):
        c(0, 0)


def test_stepwise_fraction_ten_rounds_five_stages():
    # stage(r) = floor(r * 5 / 10): rounds 0-1 stage 0, 2-3 stage 1, ..., 8-9 stage 4;
    # fractions linspace(0.1, 0.5, 5) = 0.1, 0.2, 0.3, 0.4, 0.5.
    s = StepwiseFraction(0.1, 0.5, 5)
    expected = [0.1, 0.1, 0.2, 0.2, 0.3, 0.3, 0.4, 0.4, 0.5, 0.5]
    assert [s(r, 10) for r in range(10)] == pytest.approx(expected, abs=1e-15)
    assert [cohort_size(s(r, 10), 100) for r in range(10)] == [10, 10, 20, 20, 30, 30, 40, 40, 50, 50]
    assert s(10, 10) == pytest.approx(0.5) and s(50, 10) == pytest.approx(0.5)  # past the end: last stage


def test_stepwise_fraction_uneven_stages():
    # R = 7, 3 stages: floor(r*3/7) for r = 0..6 is 0,0,0,1,1,2,2; stage i starts at ceil(7i/3) = 0, 3, 5.
    s = StepwiseFraction(0.2, 0.6, 3)
    assert [s.stage(r, 7) for r in range(7)] == [0, 0, 0, 1, 1, 2, 2]
    assert [s(r, 7) for r in range(7)] == pytest.approx([0.2, 0.2, 0.2, 0.4, 0.4, 0.6, 0.6])
    one = StepwiseFraction(0.3, 0.3, 1)
    assert one(0, 5) == 0.3 and one(4, 5) == 0.3


def test_stepwise_fraction_errors():
    with pytest.raises(ValueError, match="total_rounds"):
        StepwiseFraction()(0)
    with pytest.raises(ValueError, match="non-decreasing"):
        StepwiseFraction(0.5, 0.1)
    with pytest.raises(ValueError, match="start"):
        StepwiseFraction(0.0, 0.5)
    with pytest.raises(ValueError, match="end"):
        StepwiseFraction(0.1, 1.2)
    with pytest.raises(ValueError, match="stages"):
        StepwiseFraction(0.1, 0.5, 0)
    with pytest.raises(ValueError, match="stages=1"):
        StepwiseFraction(0.1, 0.5, 1)


def test_explicit_fraction():
    e = ExplicitFraction([(0, 0.1), (5, 0.3), [8, 0.5]])  # a YAML list pair is accepted
    assert [e(r) for r in range(10)] == [0.1] * 5 + [0.3] * 3 + [0.5] * 2
    assert e(1000) == 0.5
    assert ExplicitFraction([(0, 0.4)])(7) == 0.4


@pytest.mark.parametrize(
    "points, match",
    [
        ([(1, 0.1), (5, 0.3)], "round 0"),
        ([(0, 0.3), (5, 0.1)], "non-decreasing"),
        ([(0, 0.1), (5, 0.3), (5, 0.4)], "strictly increasing"),
        ([(0, 0.1), (3, 0.2), (2, 0.3)], "strictly increasing"),
        ([(0, 0.0)], "fraction"),
        ([(0, 1.1)], "fraction"),
        ([], "non-empty"),
        ([(0, 0.1, 2)], "pair"),
    ],
)
def test_explicit_fraction_errors(points, match):
    with pytest.raises(ValueError, match=match):
        ExplicitFraction(points)


def test_as_schedule():
    c = as_schedule(0.25)
    assert isinstance(c, ConstantFraction) and c(3) == 0.25
    s = StepwiseFraction()
    assert as_schedule(s) is s
    assert isinstance(as_schedule(1), FractionSchedule)
    for bad in ("0.1", 1.5, None):
        with pytest.raises(ValueError, match="fraction"):
            as_schedule(bad)


# --------------------------------------------------------------------------- samplers


def test_uniform_sampler():
    u = UniformSampler()
    u.setup(torch.tensor([5, 1, 1, 3, 2, 2, 9, 4, 1, 1]))
    ids, p = u.sample(0, 4, round_generator(0, 0, "sample"))
    assert ids.dtype == torch.long and ids.shape == (4,)
    assert torch.equal(ids, ids.sort().values) and ids.unique().numel() == 4
    assert bool(((ids >= 0) & (ids < 10)).all())
    assert torch.equal(p, torch.full((10,), 0.1, dtype=F64))
    ids2, _ = u.sample(0, 4, round_generator(0, 0, "sample"))
    assert torch.equal(ids, ids2)  # reproducible from the generator
    assert u.sample(0, 10, round_generator(0, 0, "sample"))[0].tolist() == list(range(10))


def test_uniform_sampler_frequencies():
    # Each client is in the cohort with probability k/N = 3/6 = 0.5.
    u = UniformSampler()
    u.setup(torch.ones(6))
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(6)
    for _ in range(4000):
        counts[u.sample(0, 3, g)[0]] += 1
    assert torch.allclose(counts / 4000, torch.full((6,), 0.5), atol=0.03)


@pytest.mark.parametrize("N, k, banned", [(40, 4, []), (40, 6, [3, 7, 11, 19]), (10, 6, [])],
                         ids=["rejection", "rejection-excluding", "permutation"])
def test_uniform_draw_gives_every_allowed_client_the_same_inclusion_and_every_pair_alike(N, k, banned):
    """uniform_draw (issue 65: O(k) whatever N): k distinct clients, never a banned one; over 6,000 draws every allowed
    client is in with probability k/(N - |banned|) and every pair of them together with k(k-1)/((N-b)(N-b-1)) (a
    uniform k-subset), within 4.5 standard errors. (N, k) = (10, 6) takes the randperm path (k > N/2): both paths are
    uniform."""
    from lfed.participation.draws import uniform_draw

    allowed = N - len(banned)
    g = torch.Generator().manual_seed(1)
    counts = torch.zeros(N)
    pairs = torch.zeros(N, N)
    exclude = torch.tensor(banned, dtype=torch.long)
    for _ in range(6000):
        ids = uniform_draw(N, k, g, exclude=exclude)
        assert ids.numel() == k and ids.unique().numel() == k and not bool(torch.isin(ids, exclude).any())
        counts[ids] += 1
        pairs[ids[:, None], ids[None, :]] += 1
    p1 = k / allowed
    mask = torch.ones(N, dtype=torch.bool)
    mask[banned] = False
    assert float((counts[mask] / 6000 - p1).abs().max()) < 4.5 * math.sqrt(p1 * (1 - p1) / 6000)
    assert float(counts[~mask].sum()) == 0
    p2 = k * (k - 1) / (allowed * (allowed - 1))
    off = mask[:, None] & mask[None, :] & ~torch.eye(N, dtype=torch.bool)
    assert float((pairs[off] / 6000 - p2).abs().max()) < 4.5 * math.sqrt(p2 * (1 - p2) / 6000)


def test_uniform_draw_takes_k_draws_not_n_and_falls_back_to_the_permutation_for_a_large_share():
    """At N = 10^9 (no [N] tensor could be made here) uniform_draw(k = 100) returns at once; with k + |banned| > N/2
    it is randperm(N)'s first allowed k, exactly."""
    from lfed.participation.draws import uniform_draw

    ids = uniform_draw(10**9, 100, torch.Generator().manual_seed(0))
    assert ids.numel() == 100 and ids.unique().numel() == 100 and int(ids.max()) < 10**9
    want = torch.randperm(10, generator=torch.Generator().manual_seed(3))
    want = want[~torch.isin(want, torch.tensor([2]))][:5]
    assert torch.equal(uniform_draw(10, 5, torch.Generator().manual_seed(3), exclude=torch.tensor([2])), want)


def test_the_poisson_sampler_draws_a_binomial_count_then_that_many_uniformly():
    """q = 6/40: over 6,000 rounds each client is in with probability q and the cohort's size has mean Nq and variance
    Nq(1-q) (each client independently, as the accountant assumes), within 4.5 standard errors; lfed 0.5's draws
    (draws = "permutation") are N uniforms compared with q, kept for its runs."""
    N, k = 40, 6
    s = PoissonSampler()
    s.setup(torch.ones(N))
    g = torch.Generator().manual_seed(2)
    counts, sizes = torch.zeros(N), []
    for r in range(6000):
        ids, p = s.sample(r, k, g)
        assert torch.equal(ids, ids.sort().values) and ids.unique().numel() == ids.numel()
        counts[ids] += 1
        sizes.append(ids.numel())
    q = k / N
    assert float((counts / 6000 - q).abs().max()) < 4.5 * math.sqrt(q * (1 - q) / 6000)
    sz = torch.tensor(sizes, dtype=F64)
    assert abs(float(sz.mean()) - N * q) < 4.5 * math.sqrt(N * q * (1 - q) / 6000)
    assert abs(float(sz.var()) / (N * q * (1 - q)) - 1) < 0.08
    assert torch.equal(p, torch.full((N,), q, dtype=F64))
    s.draws = "permutation"
    g = torch.Generator().manual_seed(5)
    want = torch.nonzero(torch.rand(N, generator=torch.Generator().manual_seed(5), dtype=F64) < q).flatten()
    assert torch.equal(s.sample(0, k, g)[0], want)


def test_uniform_sampler_keeps_lfed_0_5s_draws_for_its_runs():
    """draws = "permutation": the first k of randperm(N), sorted (what a run made by 0.5 drew, and resumes drawing)."""
    u = UniformSampler()
    u.setup(torch.ones(30))
    u.draws = "permutation"
    want = torch.randperm(30, generator=round_generator(4, 2, "sample"))[:5].sort().values
    assert torch.equal(u.sample(2, 5, round_generator(4, 2, "sample"))[0], want)


def test_sampler_arguments_are_checked():
    u = UniformSampler()
    with pytest.raises(ValueError, match="setup"):
        u.sample(0, 1, torch.Generator())
    u.setup(torch.ones(4))
    for k in (0, 5, 2.0):
        with pytest.raises(ValueError, match="k must be"):
            u.sample(0, k, torch.Generator())
    for bad in (torch.zeros(3), torch.tensor([1.0, -1.0]), torch.ones(2, 2), torch.tensor([])):
        with pytest.raises(ValueError, match="num_examples"):
            UniformSampler().setup(bad)


def test_attention_scores_start_at_size_shares():
    a = AttentionSampler()
    a.setup(torch.tensor([1, 2, 3, 4]))
    assert a.scores.dtype == F64
    assert torch.allclose(a.scores, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64), atol=1e-15)
    ids, p = a.sample(0, 2, torch.Generator().manual_seed(1))
    assert torch.equal(p, a.scores) and p is not a.scores  # a copy for logging
    assert ids.shape == (2,) and ids.unique().numel() == 2


def test_attention_update_two_rounds_by_hand():
    a = AttentionSampler(alpha=0.5)
    a.setup(torch.tensor([1, 2, 3, 4]))  # a = [0.1, 0.2, 0.3, 0.4]
    # Round 1: S = {0, 2}, d = [3, 1] -> shares [0.75, 0.25], Σ_S a = 0.4
    # a_0 = 0.5*0.1 + 0.5*0.75*0.4 = 0.05 + 0.15 = 0.2
    # a_2 = 0.5*0.3 + 0.5*0.25*0.4 = 0.15 + 0.05 = 0.2
    a.update(torch.tensor([0, 2]), torch.tensor([3.0, 1.0]))
    assert torch.allclose(a.scores, torch.tensor([0.2, 0.2, 0.2, 0.4], dtype=F64), atol=1e-15)
    # Round 2: S = {1, 2, 3}, d = [0, 1, 1] -> shares [0, 0.5, 0.5], Σ_S a = 0.8
    # a_1 = 0.5*0.2 + 0 = 0.1;  a_2 = 0.5*0.2 + 0.5*0.5*0.8 = 0.3;  a_3 = 0.5*0.4 + 0.2 = 0.4
    a.update(torch.tensor([1, 2, 3]), torch.tensor([0.0, 1.0, 1.0], dtype=torch.float32))
    assert torch.allclose(a.scores, torch.tensor([0.2, 0.1, 0.3, 0.4], dtype=F64), atol=1e-15)
    assert a.scores.sum().item() == pytest.approx(1.0, abs=1e-15)


def test_attention_update_all_zero_distances():
    a = AttentionSampler(alpha=0.5)
    a.setup(torch.tensor([2, 1, 3, 4]))  # a = [0.2, 0.1, 0.3, 0.4]
    # S = {0, 1}, d = [0, 0] -> shares 1/|S| = [0.5, 0.5], Σ_S a = 0.3
    # a_0 = 0.1 + 0.5*0.5*0.3 = 0.175;  a_1 = 0.05 + 0.075 = 0.125; a_2, a_3 unchanged
    a.update(torch.tensor([0, 1]), torch.zeros(2))
    assert torch.allclose(a.scores, torch.tensor([0.175, 0.125, 0.3, 0.4], dtype=F64), atol=1e-15)


def test_attention_update_default_alpha_single_client_is_fixed_point():
    # α = 0.9, S = {3}: share 1, Σ_S a = 0.4 -> 0.9*0.4 + 0.1*1*0.4 = 0.4 (unchanged).
    # S = {0, 3}, d = [1, 1]: a_0 = 0.09 + 0.1*0.5*0.5 = 0.115, a_3 = 0.36 + 0.025 = 0.385.
    a = AttentionSampler()
    a.setup(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    a.update(torch.tensor([3]), torch.tensor([2.0]))
    assert torch.allclose(a.scores, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64), atol=1e-15)
    a.update(torch.tensor([3, 0]), torch.tensor([1.0, 1.0]))
    assert torch.allclose(a.scores, torch.tensor([0.115, 0.2, 0.3, 0.385], dtype=F64), atol=1e-15)


def test_attention_sampling_follows_successive_draws():
    # k = 2 of a = [.1, .2, .3, .4]: P(i in S) = a_i + Σ_{j≠i} a_j a_i / (1 - a_j)
    # P0 = .1 + .2*.1/.8 + .3*.1/.7 + .4*.1/.6 = .23452
    # P1 = .2 + .1*.2/.9 + .3*.2/.7 + .4*.2/.6 = .44127
    # P2 = .3 + .1*.3/.9 + .2*.3/.8 + .4*.3/.6 = .60833
    # P3 = .4 + .1*.4/.9 + .2*.4/.8 + .3*.4/.7 = .71587
    # (sum 2; inclusion proportional to the scores would give .2/.4/.6/.8)
    a = AttentionSampler()
    a.setup(torch.tensor([1, 2, 3, 4]))
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(4, dtype=F64)
    n = 20000
    for _ in range(n):
        ids, _ = a.sample(0, 2, g)
        assert ids[0] < ids[1]  # distinct and sorted
        counts[ids] += 1
    expected = torch.tensor([0.23452, 0.44127, 0.60833, 0.71587], dtype=F64)
    assert torch.allclose(counts / n, expected, atol=0.015)


def test_attention_sampling_reproducible_and_one_client_frequencies():
    a = AttentionSampler()
    a.setup(torch.tensor([1, 2, 3, 4]))
    first = [a.sample(r, 3, round_generator(5, r, "sample"))[0] for r in range(5)]
    again = [a.sample(r, 3, round_generator(5, r, "sample"))[0] for r in range(5)]
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    g = torch.Generator().manual_seed(1)
    counts = torch.zeros(4, dtype=F64)
    for _ in range(5000):
        counts[a.sample(0, 1, g)[0]] += 1
    assert torch.allclose(counts / 5000, a.scores, atol=0.025)  # k = 1: frequency = score


def test_attention_sampling_with_fewer_positive_scores_than_k():
    # α = 0, S = {0, 1}, d = [0, 2]: a_0 = 0, a_1 = 1 * Σ_S a = 1 -> only one positive score.
    a = AttentionSampler(alpha=0.0)
    a.setup(torch.tensor([1, 1, 2]))
    a.update(torch.tensor([0, 1]), torch.tensor([0.0, 2.0]))
    assert torch.allclose(a.scores, torch.tensor([0.0, 0.5, 0.5], dtype=F64))
    a.update(torch.tensor([2]), torch.tensor([1.0]))  # unchanged: share 1
    a.update(torch.tensor([1, 2]), torch.tensor([1.0, 0.0]))  # a = [0, 1, 0]
    assert torch.allclose(a.scores, torch.tensor([0.0, 1.0, 0.0], dtype=F64))
    ids, _ = a.sample(0, 2, torch.Generator().manual_seed(0))
    assert 1 in ids.tolist() and ids.unique().numel() == 2
    assert a.sample(0, 3, torch.Generator().manual_seed(0))[0].tolist() == [0, 1, 2]


@pytest.mark.parametrize("alpha", [1.0, -0.1, 1.5, True])
def test_attention_alpha_must_be_in_unit_interval(alpha):
    with pytest.raises(ValueError, match="alpha"):
        AttentionSampler(alpha=alpha)


@pytest.mark.parametrize(
    "sampled, distances, match",
    [
        (torch.tensor([0, 0]), torch.tensor([1.0, 1.0]), "distinct"),
        (torch.tensor([0, 4]), torch.tensor([1.0, 1.0]), r"\[0, 4\)"),
        (torch.tensor([0, 1]), torch.tensor([1.0]), "same length"),
        (torch.tensor([0, 1]), torch.tensor([1.0, -1.0]), "distances"),
        (torch.tensor([0, 1]), torch.tensor([1.0, float("nan")]), "distances"),
        (torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0]), "integer"),
    ],
)
def test_attention_update_rejects_bad_input(sampled, distances, match):
    a = AttentionSampler()
    a.setup(torch.ones(4))
    with pytest.raises(ValueError, match=match):
        a.update(sampled, distances)


def test_attention_state_dict_round_trip():
    a = AttentionSampler(alpha=0.5)
    a.setup(torch.tensor([1, 2, 3, 4]))
    a.update(torch.tensor([0, 2]), torch.tensor([3.0, 1.0]))  # -> [0.2, 0.2, 0.2, 0.4]
    parent = torch.nn.Module()
    parent.sampler = a
    buffer = io.BytesIO()
    torch.save(parent.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer)
    assert set(state) == {"sampler.scores"}
    # Load before setup: the buffer takes the checkpoint's size.
    fresh = torch.nn.Module()
    fresh.sampler = AttentionSampler(alpha=0.5)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.sampler.scores, a.scores) and fresh.sampler.num_clients == 4
    # Load after setup (Lightning's order): restored scores replace the initial ones.
    after = AttentionSampler(alpha=0.5)
    after.setup(torch.tensor([1, 2, 3, 4]))
    after.load_state_dict(a.state_dict())
    assert torch.allclose(after.scores, torch.tensor([0.2, 0.2, 0.2, 0.4], dtype=F64), atol=1e-15)
    g = lambda: round_generator(0, 9, "sample")  # noqa: E731
    assert torch.equal(after.sample(9, 2, g())[0], a.sample(9, 2, g())[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_attention_sampler_on_cuda_with_cpu_generator_matches_cpu():
    cpu = AttentionSampler()
    cpu.setup(torch.tensor([1, 2, 3, 4]))
    gpu = AttentionSampler().cuda()
    gpu.setup(torch.tensor([1, 2, 3, 4], device="cuda"))
    gpu.update(torch.tensor([0, 2], device="cuda"), torch.tensor([3.0, 1.0], device="cuda"))
    cpu.update(torch.tensor([0, 2]), torch.tensor([3.0, 1.0]))
    assert gpu.scores.is_cuda and torch.allclose(gpu.scores.cpu(), cpu.scores)
    ids_gpu, p = gpu.sample(0, 2, round_generator(0, 0, "sample"))
    ids_cpu, _ = cpu.sample(0, 2, round_generator(0, 0, "sample"))
    assert torch.equal(ids_gpu, ids_cpu) and ids_gpu.device.type == "cpu"
    budget = torch.full((8,), 5, device="cuda")
    steps = Stragglers(0.3, 0.3).draw(budget, round_generator(0, 0, "stragglers", device="cuda"))
    assert steps.is_cuda and bool((steps <= 5).all())


def test_registry():
    from lfed.core.registry import component_class

    assert component_class("sampler", "uniform") is UniformSampler
    assert component_class("sampler", "attention") is AttentionSampler
    u = UniformSampler()
    u.setup(torch.ones(3))
    u.update(torch.tensor([0]), torch.tensor([1.0]))  # default no-op
    assert u.state_dict() == {}


# --------------------------------------------------------------------------- stragglers


def test_stragglers_off_returns_budget_and_draws_nothing():
    s = Stragglers()
    g = torch.Generator().manual_seed(0)
    before = g.get_state()
    budget = torch.tensor([3, 1, 7], dtype=torch.int32)
    out = s.draw(budget, g)
    assert torch.equal(out, budget) and out.dtype == torch.int32 and out is not budget
    assert torch.equal(g.get_state(), before)
    assert not s.enabled


def test_stragglers_reproducible():
    s = Stragglers(p_inactive=0.2, p_incomplete=0.3)
    budget = torch.full((50,), 10)
    a = s.draw(budget, round_generator(1, 3, "stragglers"))
    b = s.draw(budget, round_generator(1, 3, "stragglers"))
    c = s.draw(budget, round_generator(1, 4, "stragglers"))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_stragglers_frequencies():
    s = Stragglers(p_inactive=0.2, p_incomplete=0.3)
    budget = torch.full((40000,), 10)
    steps = s.draw(budget, torch.Generator().manual_seed(0))
    assert steps.dtype == budget.dtype
    inactive = (steps == 0).double().mean().item()
    incomplete_mask = (steps >= 1) & (steps <= 9)
    complete = (steps == 10).double().mean().item()
    assert inactive == pytest.approx(0.2, abs=0.01)
    assert incomplete_mask.double().mean().item() == pytest.approx(0.3, abs=0.01)
    assert complete == pytest.approx(0.5, abs=0.01)
    # incomplete counts are U{1..9}: each value about 1/9 of the incomplete clients
    hist = torch.bincount(steps[incomplete_mask], minlength=10)[1:].double()
    assert torch.allclose(hist / hist.sum(), torch.full((9,), 1 / 9, dtype=F64), atol=0.015)


def test_stragglers_edge_budgets():
    g = torch.Generator().manual_seed(0)
    always_incomplete = Stragglers(p_incomplete=1.0)
    budget = torch.tensor([0, 1, 1, 2, 2, 5, 5, 5])
    out = always_incomplete.draw(budget, g)
    assert out[:3].tolist() == [0, 1, 1]  # T = 0 -> 0; T = 1 cannot be incomplete -> completes its step
    assert out[3:5].tolist() == [1, 1]  # U{1..1}
    assert bool(((out[5:] >= 1) & (out[5:] <= 4)).all())
    assert Stragglers(p_inactive=1.0).draw(budget, g).tolist() == [0] * 8


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"p_inactive": 0.6, "p_incomplete": 0.5}, "p_inactive \\+ p_incomplete"),
        ({"p_inactive": -0.1}, "p_inactive"),
        ({"p_incomplete": 1.5}, "p_incomplete"),
        ({"p_incomplete": float("nan")}, "p_incomplete"),
    ],
)
def test_stragglers_bad_probabilities(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Stragglers(**kwargs)


def test_stragglers_bad_budget():
    s = Stragglers(p_inactive=0.5)
    g = torch.Generator()
    with pytest.raises(ValueError, match="integer"):
        s.draw(torch.tensor([1.0, 2.0]), g)
    with pytest.raises(ValueError, match=">= 0"):
        s.draw(torch.tensor([1, -2]), g)
    with pytest.raises(ValueError, match="1-D"):
        s.draw(torch.ones(2, 2, dtype=torch.long), g)


# --------------------------------------------------------------------------- communication


def test_meter_reproduces_adafl_upload_counts():
    # 003: M = 100, 0.1 -> 0.5 in 5 equal stages over 1000 rounds (200 per stage).
    # "423 (6690)": 200*10 + 200*20 + 23*30 = 6690;  "761 (18440)": 2000 + 4000 + 6000 + 161*40 = 18440.
    schedule = StepwiseFraction(0.1, 0.5, 5)
    meter = CommunicationMeter()
    for r in range(1000):
        metrics = meter.record(cohort_size(schedule(r, 1000), 100))
        meter.log_accuracy(0.95 if meter.rounds >= 761 else 0.905 if meter.rounds >= 423 else 0.5)
    assert metrics["comm/uploads"] == 50.0
    assert meter.uploads == 200 * (10 + 20 + 30 + 40 + 50)
    assert meter.rounds_to_reach(0.90) == (423, 6690)
    assert meter.rounds_to_reach(0.91) == (761, 18440)
    assert meter.rounds_to_reach(0.99) is None


def test_meter_bits_and_state_dict():
    meter = CommunicationMeter()
    meter.record(3, bits_up=300, bits_down=96)
    m = meter.record(2, bits_up=200, bits_down=64)
    assert m == {
        "comm/uploads": 2.0,
        "comm/uploads_total": 5.0,
        "comm/bits_up": 200.0,
        "comm/bits_up_total": 500.0,
        "comm/bits_down": 64.0,
        "comm/bits_down_total": 160.0,
    }
    meter.log_accuracy(0.3)
    meter.log_accuracy(0.4)  # same round: replaces
    other = CommunicationMeter()
    other.load_state_dict(meter.state_dict())
    assert other == meter and other.history == [(2, 5, 0.4)]
    with pytest.raises(ValueError, match="uploads"):
        meter.record(-1)
    with pytest.raises(ValueError, match="bits_up"):
        meter.record(1, bits_up=-5)


def test_rounds_to_reach():
    history = [(1, 10, 0.5), (2, 20, 0.89), (3, 30, 0.9), (4, 40, 0.85), (5, 50, 0.95)]
    assert rounds_to_reach(history, 0.9) == (3, 30)  # first time, >= counts
    assert rounds_to_reach(history, 0.93) == (5, 50)
    assert rounds_to_reach(history, 0.96) is None
    assert rounds_to_reach([], 0.1) is None
    with pytest.raises(ValueError, match="increasing"):
        rounds_to_reach([(2, 10, 0.1), (2, 20, 0.2)], 0.1)
    with pytest.raises(ValueError, match="uploads"):
        rounds_to_reach([(1, 10, 0.1), (2, 5, 0.2)], 0.1)


def test_a_fraction_that_rounds_to_no_client_is_said_before_round_0():
    """fraction 0.01 of 20 clients is 0.2 clients: each round samples 1 (SPEC §5's max(1, .)); the run says so once."""
    from lfed.core import registry
    from lfed.core.settings import build_run

    def warnings_of(fraction, N=20, rounds=5):
        alg = build_run(fraction=fraction).components
        return [m for m in registry.validate_composition(alg, num_clients=N, total_rounds=rounds) if m.startswith("fraction:")]

    assert warnings_of(0.01) == ["fraction: 0.01 of 20 clients is 0.2 clients a round, so round 0 samples 1 client "
                                 "(a round trains at least one): a share of 0.05, not 0.01"]
    assert warnings_of(0.05) == []  # 1 client a round, as asked
    assert warnings_of(0.025) == []  # 0.5 clients rounds half up to 1
    assert len(warnings_of(StepwiseFraction(0.01, 0.5, 5))) == 1  # said once, at the first such round


def test_the_sum_tree_by_hand_and_a_moved_tree_is_a_fresh_one_bit_for_bit():
    from lfed.participation.sum_tree import SumTree

    t = SumTree(torch.tensor([0.1, 0.0, 0.3, 0.2, 0.4], dtype=F64))  # padded to 8 leaves
    assert [lvl.numel() for lvl in t.levels] == [8, 4, 2, 1] and t.positive == 4
    assert t.levels[1].tolist() == pytest.approx([0.1, 0.5, 0.4, 0.0]) and t.total == pytest.approx(1.0)
    # cumulative masses: [0, .1) -> 0; leaf 1 has none; [.1, .4) -> 2; [.4, .6) -> 3; [.6, 1) -> 4
    u = torch.tensor([0.0, 0.05, 0.1, 0.39, 0.4, 0.59, 0.6, 0.99], dtype=F64)
    assert t.descend(u).tolist() == [0, 0, 2, 2, 3, 3, 4, 4]
    g = torch.Generator().manual_seed(3)
    w = torch.rand(1000, generator=g, dtype=F64)
    moved = SumTree(w)
    for _ in range(20):  # rows moved as AdaFL's update moves them; parents recomputed, never shifted by a difference
        ids = torch.randperm(1000, generator=g)[:7]
        w[ids] = torch.rand(7, generator=g, dtype=F64) * (torch.rand(7, generator=g) > 0.3)
        moved.set(ids, w[ids])
    fresh = SumTree(w)
    assert all(torch.equal(a, b) for a, b in zip(moved.levels, fresh.levels)) and moved.positive == fresh.positive


def test_attention_draws_through_the_tree_follow_the_scores_and_0_5s_draws_stay_multinomial():
    """The tree's draws (0.6) have the law of torch.multinomial without replacement (the successive-draw test above
    runs them); lfed 0.5's runs (draws = "permutation") draw exactly torch.multinomial's cohorts. After updates the
    tree the sampler keeps is the tree of its scores, so a resumed run (which rebuilds it from the checkpointed
    scores) draws the same cohorts."""
    a = AttentionSampler(alpha=0.5)
    a.setup(torch.arange(1, 41))
    for r in range(5):
        ids, p = a.sample(r, 6, round_generator(0, r, "sample"))
        assert torch.equal(p, a.scores)
        a.update(ids, torch.rand(6, generator=torch.Generator().manual_seed(r), dtype=F64))
    tree = a._tree_now()
    from lfed.participation.sum_tree import SumTree

    assert all(torch.equal(x, y) for x, y in zip(tree.levels, SumTree(a.scores).levels))
    b = AttentionSampler(alpha=0.5)
    b.setup(torch.arange(1, 41))
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.sample(5, 6, round_generator(0, 5, "sample"))[0], a.sample(5, 6, round_generator(0, 5, "sample"))[0])
    a.draws = "permutation"
    want = torch.multinomial(a.scores, 6, replacement=False, generator=round_generator(0, 6, "sample")).sort().values
    assert torch.equal(a.sample(6, 6, round_generator(0, 6, "sample"))[0], want)


def test_the_set_draws_of_a_0_5_checkpoint_reach_the_attention_sampler():
    from lfed.core import registry

    alg = registry.build(registry.resolve("adafl"))
    assert alg.sampler.draws == "rejection"
    from lfed.core.algorithm import LocalTraining
    from lfed.core.run import FederatedRun

    run = FederatedRun(alg, LocalTraining(), lambda p: torch.optim.SGD(p, lr=1.0))
    run.set_draws("permutation")
    assert alg.sampler.draws == "permutation"
