"""Hand-checked tests for lfed.server.weight_formulas (SPEC §3)."""

from __future__ import annotations

import warnings

import pytest
import torch

from lfed.server.weight_formulas import (
    PARTIAL_WORK,
    WEIGHT_RULES,
    DegenerateWeightsWarning,
    aggregation_weights,
    counting_mask,
    dwfed_weights,
    ish,
    label_distance,
    size_weights,
    uniform_weights,
)

F64 = torch.float64


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


def test_rule_names():
    assert WEIGHT_RULES == ("size", "uniform", "dwfed")
    assert PARTIAL_WORK == ("keep", "drop", "scale")


def test_size_weights_by_hand():
    # n = [10, 30, 60], Σ n = 100 -> a = [0.1, 0.3, 0.6]
    a = size_weights(torch.tensor([10, 30, 60]), dtype=F64)
    torch.testing.assert_close(a, t([0.1, 0.3, 0.6]), rtol=0, atol=1e-15)
    assert a.dtype == F64


def test_size_weights_default_dtype_and_errors():
    assert size_weights(torch.tensor([1, 1])).dtype == torch.get_default_dtype()
    with pytest.raises(ValueError, match="num_examples"):
        size_weights(torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="num_examples"):
        size_weights(torch.tensor([1, -1]))
    with pytest.raises(ValueError, match="num_examples"):
        size_weights(torch.ones(2, 2))


def test_uniform_weights_int_and_mask():
    torch.testing.assert_close(uniform_weights(4, dtype=F64), t([0.25] * 4), rtol=0, atol=0)
    # mask [T, F, T] -> 1/2 on the two counting clients, exact 0 on the other
    a = uniform_weights(torch.tensor([True, False, True]), dtype=F64)
    assert a.tolist() == [0.5, 0.0, 0.5]
    assert uniform_weights(torch.zeros(3, dtype=torch.bool), dtype=F64).tolist() == [0.0] * 3
    with pytest.raises(ValueError, match="num_clients_or_mask"):
        uniform_weights(0)
    with pytest.raises(ValueError, match="num_clients_or_mask"):
        uniform_weights(torch.tensor([1, 0]))


def test_label_distance_and_dwfed_by_hand():
    # Three clients, two classes; the population also holds other clients' examples.
    counts = torch.tensor([[8, 2], [2, 8], [5, 5]])
    population = torch.tensor([45, 15])  # P = [0.75, 0.25]
    # p_1 = [0.8, 0.2]:  D_1 = |0.8 - 0.75| + |0.2 - 0.25| = 0.1
    # p_2 = [0.2, 0.8]:  D_2 = 0.55 + 0.55 = 1.1
    # p_3 = [0.5, 0.5]:  D_3 = 0.25 + 0.25 = 0.5
    d = label_distance(counts, population)
    torch.testing.assert_close(d, t([0.1, 1.1, 0.5]), rtol=0, atol=1e-12)
    # ISH_k = (1 - D_k/3) / (1 + D_k):
    #   ISH_1 = (29/30) / 1.1 = 29/33 = 609/693
    #   ISH_2 = (1.9/3) / 2.1 = 19/63 = 209/693
    #   ISH_3 = (2.5/3) / 1.5 = 5/9   = 385/693
    torch.testing.assert_close(ish(d, 3), t([29 / 33, 19 / 63, 5 / 9]), rtol=0, atol=1e-12)
    # a_k = ISH_k / Σ ISH = [609, 209, 385] / 1203
    expected = t([609, 209, 385]) / 1203
    torch.testing.assert_close(dwfed_weights(d, 3, dtype=F64), expected, rtol=0, atol=1e-12)
    a = aggregation_weights(
        "dwfed",
        num_examples=torch.tensor([10, 10, 10]),
        steps_done=torch.tensor([5, 5, 5]),
        step_budget=torch.tensor([5, 5, 5]),
        client_label_counts=counts,
        population_label_counts=population,
        dtype=F64,
    )
    torch.testing.assert_close(a, expected, rtol=0, atol=1e-12)


def test_dwfed_identical_distributions_is_uniform():
    # Every client has p = [0.25, 0.75] = P, so D = 0, ISH = 1 for all, a = 1/3 each
    # (size weights would be [8, 4, 20] / 32 instead).
    counts = torch.tensor([[2, 6], [1, 3], [5, 15]])
    a = aggregation_weights(
        "dwfed",
        num_examples=counts.sum(1),
        steps_done=torch.tensor([1, 1, 1]),
        step_budget=torch.tensor([1, 1, 1]),
        client_label_counts=counts,
        population_label_counts=counts.sum(0),
        dtype=F64,
    )
    torch.testing.assert_close(a, t([1 / 3] * 3), rtol=0, atol=1e-15)


def test_dwfed_uses_number_of_counting_clients():
    # Client 3 is inactive, so K = 2 in eq. 12 (not 3).
    # D = [0.1, 1.1, 0.5] as in the hand example above.
    # ISH_1 = (1 - 0.05) / 1.1 = 19/22,  ISH_2 = (1 - 0.55) / 2.1 = 3/14
    # a_1 = (19/22) / (19/22 + 3/14) = 133/166,  a_2 = 33/166
    a = aggregation_weights(
        "dwfed",
        num_examples=torch.tensor([10, 10, 10]),
        steps_done=torch.tensor([5, 5, 0]),
        step_budget=torch.tensor([5, 5, 5]),
        client_label_counts=torch.tensor([[8, 2], [2, 8], [5, 5]]),
        population_label_counts=torch.tensor([45, 15]),
        dtype=F64,
    )
    torch.testing.assert_close(a, t([133 / 166, 33 / 166, 0.0]), rtol=0, atol=1e-12)
    assert a[2].item() == 0.0


def test_dwfed_clamp_for_two_or_fewer_clients():
    # K = 2, D = [2, 0.5]: ISH_1 = (1 - 1) / 3 = 0, ISH_2 = (1 - 0.25) / 1.5 = 0.5 -> a = [0, 1]
    torch.testing.assert_close(ish(t([2.0, 0.5]), 2), t([0.0, 0.5]), rtol=0, atol=1e-15)
    assert dwfed_weights(t([2.0, 0.5]), 2, dtype=F64).tolist() == [0.0, 1.0]
    # K = 1, D = 1.5: ISH = (1 - 1.5) / 2.5 = -0.2 -> clamped to 0 -> uniform fallback, warned
    assert ish(t([1.5]), 1).tolist() == [0.0]
    with pytest.warns(DegenerateWeightsWarning):
        assert dwfed_weights(t([1.5]), 1, dtype=F64).tolist() == [1.0]
    # K = 2, D = [2, 2]: both ISH are 0 -> uniform [0.5, 0.5]
    with pytest.warns(DegenerateWeightsWarning):
        assert dwfed_weights(t([2.0, 2.0]), 2, dtype=F64).tolist() == [0.5, 0.5]


def test_dwfed_fallback_through_aggregation_weights():
    # Only client 1 counts (K = 1). p_1 = [1, 0], P = [0.5, 0.5]: D_1 = 0.5 + 0.5 = 1,
    # ISH_1 = (1 - 1/1) / 2 = 0 -> all ISH zero -> uniform over the counting client, warned.
    with pytest.warns(DegenerateWeightsWarning):
        a = aggregation_weights(
            "dwfed",
            steps_done=torch.tensor([3, 0]),
            step_budget=torch.tensor([3, 3]),
            client_label_counts=torch.tensor([[10, 0], [0, 10]]),
            population_label_counts=torch.tensor([10, 10]),
            dtype=F64,
        )
    assert a.tolist() == [1.0, 0.0]


def test_dwfed_no_warning_when_not_degenerate():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DegenerateWeightsWarning)
        dwfed_weights(t([0.1, 1.1, 0.5]), 3)


@pytest.mark.parametrize(
    ("rule", "partial_work", "expected"),
    [
        # size, n = [10, 30, 60]; active = clients 1, 2 (client 3 did 0 steps)
        # keep:  base over {1, 2}: [10, 30] / 40 = [0.25, 0.75]
        ("size", "keep", [0.25, 0.75, 0.0]),
        # drop:  client 2 did 2 < 4 steps -> only client 1 counts -> [1, 0, 0]
        ("size", "drop", [1.0, 0.0, 0.0]),
        # scale: base [0.25, 0.75], client 2 x 4/2 = 2 -> [0.25, 1.5]; sum 1.75, not renormalised
        ("size", "scale", [0.25, 1.5, 0.0]),
        ("uniform", "keep", [0.5, 0.5, 0.0]),
        ("uniform", "drop", [1.0, 0.0, 0.0]),
        ("uniform", "scale", [0.5, 1.0, 0.0]),
    ],
)
def test_partial_work_by_hand(rule, partial_work, expected):
    a = aggregation_weights(
        rule,
        num_examples=torch.tensor([10, 30, 60]),
        steps_done=torch.tensor([4, 2, 0]),
        step_budget=torch.tensor([4, 4, 4]),
        partial_work=partial_work,
        dtype=F64,
    )
    torch.testing.assert_close(a, t(expected), rtol=0, atol=1e-15)
    assert a[2].item() == 0.0  # exact zero for the inactive client


def test_scale_uses_each_clients_own_budget():
    # budgets [6, 3], steps [2, 3]: client 1 is incomplete -> x 6/2 = 3; client 2 complete.
    # uniform base [0.5, 0.5] -> [1.5, 0.5]
    a = aggregation_weights(
        "uniform",
        steps_done=torch.tensor([2, 3]),
        step_budget=torch.tensor([6, 3]),
        partial_work="scale",
        dtype=F64,
    )
    assert a.tolist() == [1.5, 0.5]


@pytest.mark.parametrize("rule", WEIGHT_RULES)
@pytest.mark.parametrize("partial_work", PARTIAL_WORK)
def test_no_client_counts_gives_zeros(rule, partial_work):
    kwargs = dict(
        num_examples=torch.tensor([5, 7]),
        step_budget=torch.tensor([4, 4]),
        partial_work=partial_work,
        client_label_counts=torch.tensor([[1, 4], [3, 2]]),
        population_label_counts=torch.tensor([4, 6]),
        dtype=F64,
    )
    a = aggregation_weights(rule, steps_done=torch.tensor([0, 0]), **kwargs)
    assert a.tolist() == [0.0, 0.0]
    # all partial: with "drop" nobody counts either
    a = aggregation_weights(rule, steps_done=torch.tensor([1, 3]), **kwargs)
    if partial_work == "drop":
        assert a.tolist() == [0.0, 0.0]
    else:
        assert (a > 0).all()


def test_integer_and_float_inputs_agree_and_device_follows_steps():
    a = aggregation_weights("size", num_examples=torch.tensor([1.0, 3.0]),
                            steps_done=torch.tensor([2.0, 2.0]), step_budget=torch.tensor([2, 2]))
    assert a.dtype == torch.get_default_dtype()
    torch.testing.assert_close(a, torch.tensor([0.25, 0.75]))
    assert a.device == torch.tensor(0).device


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(rule="fedavg"), "rule"),
        (dict(partial_work="ignore"), "partial_work"),
        (dict(steps_done=torch.tensor([1, 1, 1])), "step_budget"),
        (dict(steps_done=torch.tensor([[1, 1]])), "steps_done"),
        (dict(steps_done=torch.tensor([5, 1])), "steps_done must not exceed"),
        (dict(steps_done=torch.tensor([-1, 1])), "steps_done"),
        (dict(step_budget=torch.tensor([0, 4])), "step_budget"),
        (dict(num_examples=torch.tensor([1, 2, 3])), "num_examples"),
        (dict(num_examples=None), "num_examples"),
        (dict(rule="dwfed"), "client_label_counts"),
        (dict(rule="dwfed", client_label_counts=torch.ones(3, 2), population_label_counts=torch.ones(2)),
         "client_label_counts"),
        (dict(rule="dwfed", client_label_counts=torch.ones(2, 2), population_label_counts=torch.ones(3)),
         "population_label_counts"),
        (dict(rule="dwfed", client_label_counts=torch.tensor([[1, 1], [0, 0]]),
              population_label_counts=torch.ones(2)), "no examples"),
        (dict(dtype=torch.int64), "dtype"),
    ],
)
def test_aggregation_weights_errors(kwargs, match):
    base = dict(rule="size", num_examples=torch.tensor([1, 2]), steps_done=torch.tensor([1, 1]),
                step_budget=torch.tensor([4, 4]))
    base.update(kwargs)
    rule = base.pop("rule")
    with pytest.raises(ValueError, match=match):
        aggregation_weights(rule, **base)


def test_dwfed_input_errors():
    with pytest.raises(ValueError, match="distance"):
        ish(t([2.5]), 1)
    with pytest.raises(ValueError, match="num_counting"):
        ish(t([0.5]), 0)
    with pytest.raises(ValueError, match="num_counting"):
        dwfed_weights(t([0.5, 0.5]), 1, mask=torch.tensor([True, True]))
    with pytest.raises(ValueError, match="mask"):
        dwfed_weights(t([0.5, 0.5]), mask=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="client_label_counts"):
        label_distance(torch.ones(3), torch.ones(3))
    with pytest.raises(ValueError, match="client_label_counts"):
        label_distance(torch.tensor([[1, -1]]), torch.ones(2))


def test_counting_mask():
    s, b = torch.tensor([4, 2, 0]), torch.tensor([4, 4, 4])
    assert counting_mask(s, b, "keep").tolist() == [True, True, False]
    assert counting_mask(s, b, "scale").tolist() == [True, True, False]
    assert counting_mask(s, b, "drop").tolist() == [True, False, False]
    with pytest.raises(ValueError, match="partial_work"):
        counting_mask(s, b, "all")
    # a counting client with weight exactly 0 (DWFed clamp, K = 2, D = [2, 0.5]) still counts
    assert dwfed_weights(t([2.0, 0.5]), mask=counting_mask(torch.tensor([1, 1]), torch.tensor([1, 1])),
                         dtype=F64).tolist() == [0.0, 1.0]
