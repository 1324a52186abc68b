"""Simulated secure aggregation (lfed.privacy.secagg; Bonawitz et al. 2017): fixed point and wrap-around by hand, the
pairwise masks (uploads look uniform, the sum is exact, dropouts recovered exactly), overflow detected, the rounding
error bound, refusals before round 0, and a run through the round."""

from __future__ import annotations

import pytest
import torch
from conftest import flat_weights, run_rounds
from test_dp_fedavg import _cohort, _digits, _module

from lfed.base.component import CompositionContext
from lfed.privacy.secagg import SecureAggregation, check_range, decode, encode, masked_uploads, modular_sum, to_signed
from lfed.server.channel import TernaryTopK
from lfed.server.weighting import DWFedWeights, SizeWeights


def test_encode_and_decode_by_hand():
    """bits = 4 (M = 16), scale 1: -2 → 14, -8 → 8, 7 → 7; decoding maps [8, 16) back to [-8, 0)."""
    x = torch.tensor([3.0, -2.0, 7.0, -8.0, 0.0])
    e = encode(x, 1.0, 4)
    assert e.dtype == torch.long and e.tolist() == [3, 14, 7, 8, 0]
    assert decode(e, 1.0, 4).tolist() == [3.0, -2.0, 7.0, -8.0, 0.0]
    # round half to even (deterministic): 0.5 → 0, 1.5 → 2, 2.5 → 2, -0.5 → 0, -1.5 → -2; scale 4: 0.3·4 = 1.2 → 1
    assert to_signed(encode(torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5]), 1.0, 8), 8).tolist() == [0, 2, 2, 0, -2]
    assert decode(encode(torch.tensor([0.3, -0.3]), 4.0, 8), 4.0, 8).tolist() == [0.25, -0.25]
    with pytest.raises(ValueError, match="bits: at most 62"):
        encode(x, 1.0, 63)
    with pytest.raises(ValueError, match="rounding: 'up' is not one of"):
        encode(x, 1.0, 8, rounding="up")


def test_values_that_wrap_alone_but_not_in_sum_decode_exactly():
    """bits = 4: 12 encodes as 12 (alone it decodes as -4: wrapped), -9 as 7 (alone: 7, wrapped); their sum 3 is in
    [-8, 8) and decodes exactly: modular arithmetic only needs the sum in range."""
    rows = encode(torch.tensor([[12.0, 5.0], [-9.0, -7.0]]), 1.0, 4)
    assert rows.tolist() == [[12, 5], [7, 9]]
    assert decode(rows, 1.0, 4).tolist() == [[-4.0, 5.0], [7.0, -7.0]]  # each alone: 12 and -9 wrapped
    assert decode(modular_sum(rows, 4), 1.0, 4).tolist() == [3.0, -2.0]


def test_each_masked_upload_looks_uniform_and_the_masks_cancel_in_the_sum():
    """bits = 8, three clients of P = 20,000 small values: each upload differs from its plain encoding almost
    everywhere (a uniform mask leaves a coordinate unchanged with probability 1/256), its values have the mean
    127.5 and variance (256² - 1)/12 of the uniform on Z_256 (within 3%), and the uploads sum to the plain sum."""
    g = torch.Generator().manual_seed(0)
    rows = encode(torch.randint(-3, 4, (3, 20000), generator=g).double(), 1.0, 8)
    uploads = masked_uploads(rows, 8, [5, 2, 9], seed=1, round=0)
    for u, r in zip(uploads, rows):
        assert float((u == r).double().mean()) < 0.01
        assert abs(float(u.double().mean()) / 127.5 - 1) < 0.03
        assert abs(float(u.double().var()) / ((256 ** 2 - 1) / 12) - 1) < 0.03
    assert torch.equal(torch.remainder(uploads.sum(0), 256), torch.remainder(rows.sum(0), 256))
    assert torch.equal(modular_sum(rows, 8, ids=[5, 2, 9], seed=1), torch.remainder(rows.sum(0), 256))
    assert not torch.equal(masked_uploads(rows, 8, [5, 2, 9], seed=1, round=1), uploads)  # fresh masks every round


def test_dropouts_after_masking_are_recovered_exactly():
    """Four clients mask; clients 1 and 3 drop before uploading: the server removes their pair masks with the
    survivors and gets exactly x_0 + x_2 (mod M); with nobody left it gets 0."""
    rows = torch.tensor([[1, 2, 3], [10, 20, 30], [100, 200, 250], [7, 7, 7]])
    survived = torch.tensor([True, False, True, False])
    total = modular_sum(rows, 16, survived, ids=[4, 1, 8, 3], seed=3, round=2)
    assert total.tolist() == [101, 202, 253]
    assert modular_sum(rows, 16, torch.zeros(4, dtype=torch.bool)).tolist() == [0, 0, 0]


def test_an_overflow_is_detected_not_decoded_wrong():
    """bits = 4 (range [-8, 8)): 5 + 4 = 9 would decode as -7; check_range raises naming bits and scale. 5 + 2 = 7:
    7/8 of the range."""
    with pytest.raises(ValueError, match=r"bits: the round's sum reaches \|9\| .* bits = 4 .*scale = 1"):
        check_range(torch.tensor([[5], [4]]), 4, 1.0)
    assert check_range(torch.tensor([[5], [2]]), 4, 1.0) == 7 / 8
    assert decode(modular_sum(encode(torch.tensor([[5.0], [4.0]]), 1.0, 4), 4), 1.0, 4).tolist() == [-7.0]  # the wrap


def test_the_combination_detects_an_overflow_every_round():
    """Scale given, no pre-round check: weights that sum to 3 (not a mean) with bits = 8 and scale 64 push
    3 · 1.0 · 64 = 192 past 128: the round raises instead of returning a wrapped mean."""
    sa = SecureAggregation(bits=8, clip=1.0, scale=64.0)
    with pytest.raises(ValueError, match="bits: the round's sum reaches"):
        sa.combine(torch.ones(3, 2, dtype=torch.float64), torch.ones(3, dtype=torch.float64), _cohort(0, 3, 3.0))


def test_the_decoded_sum_is_within_k_over_2_scale_of_the_float_sum():
    """Deterministic rounding moves each encoding by at most 1/(2s): K = 10 rows, s = 2^10: the decoded sum is within
    K/(2s) of the float sum on every coordinate (and the bound is not loose by more than a factor 10 here)."""
    K, s = 10, 2.0 ** 10
    x = torch.rand(K, 5000, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2 - 1
    err = (decode(modular_sum(encode(x, s, 32), 32), s, 32) - x.sum(0)).abs()
    assert float(err.max()) <= K / (2 * s)
    assert float(err.max()) > K / (2 * s) / 10


def _sa(**kwargs) -> SecureAggregation:
    return SecureAggregation(**kwargs)


def test_the_weighted_mean_by_hand_with_a_dropout():
    """Two clients, uniform weights 1/2, L-infinity clip 1: updates (0.5, -2) and (0.25, 0.5) are clamped to
    (0.5, -1) and (0.25, 0.5); the mean (0.375, -0.25) is dyadic, so exact at any power-of-two scale. With dropouts
    the mean is the survivors' weighted mean (public weights rescaled), here computed from the drawn survivors."""
    updates = torch.tensor([[0.5, -2.0], [0.25, 0.5]], dtype=torch.float64)
    sa = _sa(bits=32, clip=1.0)
    delta, _ = sa.combine(updates, None, _cohort(0, 2, 2.0))
    assert delta.tolist() == [0.375, -0.25]
    assert sa.report(None) == {"secagg/dropped": 0.0, "secagg/max_abs_fraction_of_range": pytest.approx(0.375 * sa.scale / 2 ** 31)}
    rows = torch.tensor([[0.5, 0.25], [-0.75, 1.0], [0.125, -0.5], [1.0, 1.0]], dtype=torch.float64)
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    for r in range(6):
        sa = _sa(bits=32, clip=1.0, dropout=0.5)
        cohort = _cohort(r, 4, 4.0)
        alive = sa.survivors(4, cohort)
        delta, _ = sa.combine(rows, w, cohort)
        want = (w[alive, None] * rows[alive]).sum(0) / w[alive].sum() if alive.any() else torch.zeros(2, dtype=torch.float64)
        torch.testing.assert_close(delta, want, atol=4 / sa.scale, rtol=0)
        assert sa.report(None)["secagg/dropped"] == float((~alive).sum())


def _context(**components) -> CompositionContext:
    return CompositionContext(frozenset(), num_clients=10, total_rounds=3, cohort_sizes=[4, 4, 4],
                              components=components)


@pytest.mark.parametrize("components, match", [
    (dict(weighting=DWFedWeights()), "weighting: DWFed's weights come from each client's label counts.*which secure "
                                     "aggregation would show the server beside the sum"),
    (dict(channel=TernaryTopK(0.1)), "channel: a lossy channel shows the server each client's compressed update"),
])
def test_what_shows_the_server_more_than_the_sum_is_refused_before_round_0(components, match):
    sa = _sa()
    with pytest.raises(ValueError, match=match):
        sa.check(_context(combination=sa, **components))
    sa.check(_context(combination=sa, weighting=SizeWeights()))  # public size weights compose


def test_bits_too_few_for_the_cohort_are_refused_before_round_0():
    """bits = 8 (±128), clip 1, scale 64: 64 + K/2 < 128 for K = 4 but not for K = 130; derived scales: the largest
    power of two with c·s + K/2 < M/2."""
    _sa(bits=8, clip=1.0, scale=64.0).check(_context())
    with pytest.raises(ValueError, match=r"bits: 130 clients' weighted sum of clip·scale = 1·64 .* bits = 8"):
        _sa(bits=8, clip=1.0, scale=64.0).fix_scale(130)
    sa = _sa(bits=8, clip=0.5)
    sa.check(_context())
    assert sa.scale == 128.0  # (128 - 2 - 1) / 0.5 = 250 → 128
    with pytest.raises(ValueError, match="bits: 4 bits .* cannot hold the rounding of 20 clients"):
        _sa(bits=4).fix_scale(20)
    for kwargs, match in [(dict(bits=1), "bits: need an integer >= 2"), (dict(clip=0.0), "clip: must be"),
                          (dict(dropout=1.0), "dropout: must be"), (dict(rounding="up"), "rounding: 'up' is not one of")]:
        with pytest.raises(ValueError, match=match):
            _sa(**kwargs)


def test_three_rounds_on_digits_are_fedavg_up_to_the_rounding_bound():
    """3 rounds of FedAvg (size weights) on digits through the round: with 62 bits the scale is 2^60 / clip, so the
    secure mean differs from the plain mean by at most K/(2s) per round; updates stay inside the clip."""
    sa = SecureAggregation(bits=62, clip=10.0)
    m = _module(algorithm="fedavg", combination=sa)
    run_rounds(m, _digits(), 3)
    plain = _module(algorithm="fedavg")
    run_rounds(plain, _digits(), 3)
    torch.testing.assert_close(flat_weights(m), flat_weights(plain), atol=1e-12, rtol=0)
    assert m.last_round.extra["secagg/dropped"] == 0.0
    assert 0 < m.last_round.extra["secagg/max_abs_fraction_of_range"] < 1


def test_without_drawing_masks_the_sum_is_the_same_exactly():
    """masks=False sums the survivors' residues directly: equal to the masked protocol's sum, dropouts included."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 1 << 16, (6, 50), generator=g)
    survived = torch.tensor([True, False, True, True, False, True])
    masked = modular_sum(rows, 16, survived, ids=[9, 3, 7, 1, 12, 4], seed=5, round=3)
    assert torch.equal(modular_sum(rows, 16, survived, ids=[9, 3, 7, 1, 12, 4], seed=5, round=3, masks=False), masked)
    assert torch.equal(masked, torch.remainder(rows[survived].sum(0), 1 << 16))


@pytest.mark.parametrize("log_unaccounted", [False, True])
def test_secure_aggregation_hides_per_client_metrics_unless_marked(log_unaccounted):
    """The server sees only the sum: the clients' training losses and their own accuracies are not logged (or are
    marked unaccounted/ with log_unaccounted); the server-held test split and secagg/* are."""
    m = _module(algorithm="fedavg", combination=SecureAggregation(bits=62, clip=10.0, log_unaccounted=log_unaccounted))
    run_rounds(m, _digits(), 2, evaluate_every=2)
    logged = set(m.trainer.callback_metrics)
    assert {"test/acc", "secagg/dropped", "secagg/max_abs_fraction_of_range"} <= logged
    assert not any(k.startswith(("train/", "client/", "round/")) for k in logged)
    assert ("unaccounted/train/loss" in logged) == log_unaccounted


def test_example_level_dp_sgd_composes_with_secure_aggregation():
    """objective dp_sgd under combination secagg: each client's steps are DP-SGD, the server sees only the sum; both
    report (the clients' ε, the sum's range)."""
    from lfed.privacy import DPSGD

    m = _module(algorithm="fedavg", objective=DPSGD(noise_multiplier=1.0, clip=1.0),
                combination=SecureAggregation(bits=40, clip=10.0))
    run_rounds(m, _digits(), 2)
    extra = m.last_round.extra
    assert 0 < extra["privacy/example_epsilon_max"] < float("inf")
    assert 0 < extra["secagg/max_abs_fraction_of_range"] < 1 and extra["secagg/dropped"] == 0
