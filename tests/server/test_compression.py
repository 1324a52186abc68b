"""Hand-checked tests for lfed.server.compression (SPEC §7; EFL 004 Algorithm 2)."""

from __future__ import annotations

import math

import pytest
import torch

from lfed.server.compression import (
    compress_with_residual,
    dense_bits,
    kept_count,
    ternary,
    ternary_bits,
    ternary_per_tensor,
    validate_sparsity,
)

F64 = torch.float64


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


def test_ternary_by_hand_half_sparsity():
    # n = 4, q = 0.5 -> k = 2; the two largest |x| are |-4| and |3| -> μ = (4 + 3) / 2 = 3.5
    out = ternary(t([3.0, -1.0, 2.0, -4.0]), 0.5)
    assert out.tolist() == [3.5, 0.0, 0.0, -3.5]


def test_ternary_q_one_is_not_identity():
    # k = n = 4: μ = (3 + 1 + 2 + 4) / 4 = 2.5 and every entry becomes ±2.5
    out = ternary(t([3.0, -1.0, 2.0, -4.0]), 1.0)
    assert out.tolist() == [2.5, -2.5, 2.5, -2.5]


def test_ternary_tiny_q_keeps_one():
    # floor(4 * 1e-6) = 0 -> k = max(0, 1) = 1: only -4 survives, μ = 4
    assert kept_count(4, 1e-6) == 1
    assert ternary(t([3.0, -1.0, 2.0, -4.0]), 1e-6).tolist() == [0.0, 0.0, 0.0, -4.0]


def test_kept_count_decimal_sparsity():
    assert math.floor(100 * 0.29) == 28  # the float product alone would give 28
    assert kept_count(100, 0.29) == 29
    assert kept_count(6, 1 / 3) == 2
    assert kept_count(10, 0.25) == 2  # floor(2.5) = 2
    assert kept_count(7, 1.0) == 7
    assert kept_count(1, 0.01) == 1


def test_ternary_hundred_entries_q029_keeps_29():
    # x = [1, -2, 3, -4, ..., -100]: the 29 largest magnitudes are 72..100, μ = (72 + 100) / 2 = 86
    mags = torch.arange(1, 101, dtype=F64)
    x = mags * torch.tensor([1.0, -1.0], dtype=F64).repeat(50)
    out = ternary(x, 0.29)
    nz = torch.nonzero(out).flatten()
    assert nz.numel() == 29
    assert nz.tolist() == list(range(71, 100))
    torch.testing.assert_close(out[nz], 86.0 * torch.sign(x[nz]), rtol=0, atol=1e-12)


def test_ternary_rows_are_independent_and_ties_keep_exactly_k():
    x = t([[3.0, -1.0, 2.0, -4.0],
           [0.0, 0.0, 0.0, 0.0],
           [1.0, 1.0, -1.0, 0.0]])
    out = ternary(x, 0.5)
    assert out[0].tolist() == [3.5, 0.0, 0.0, -3.5]
    assert out[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # all-zero row: μ = 0, no NaN
    # row 3: three entries tied at |1|, exactly k = 2 kept, each ±1 with its own sign
    assert (out[2] != 0).sum().item() == 2
    kept = out[2] != 0
    assert torch.equal(out[2][kept], x[2][kept])
    assert out[2][3].item() == 0.0


@pytest.mark.parametrize("q", [0.3, 1.0])
def test_ternary_all_zero_tensor(q):
    out = ternary(torch.zeros(2, 5), q)
    assert torch.equal(out, torch.zeros(2, 5))
    assert not torch.isnan(out).any()


def test_ternary_keeps_dtype_and_shape():
    x = torch.tensor([[0.5, -2.0, 1.0]], dtype=torch.float32)
    out = ternary(x, 0.34)  # floor(1.02) = 1 -> keep -2
    assert out.dtype == torch.float32 and out.shape == x.shape
    assert out.tolist() == [[0.0, -2.0, 0.0]]


def test_ternary_per_tensor_segments_independent():
    flat = t([3.0, -1.0, 2.0, -4.0, 10.0, -20.0])
    # segment 1 (n=4, k=2): [3.5, 0, 0, -3.5]; segment 2 (n=2, k=1): keep -20, μ = 20
    out = ternary_per_tensor(flat, [4, 2], 0.5)
    assert out.tolist() == [3.5, 0.0, 0.0, -3.5, 0.0, -20.0]
    # ST over the whole vector would keep k=3 (-20, 10, -4) with μ = 34/3 instead
    whole = ternary(flat, 0.5)
    assert not torch.equal(out, whole)
    # [K, P]: each client row compressed on its own
    cohort = torch.stack([flat, -flat, torch.zeros(6, dtype=F64)])
    out2 = ternary_per_tensor(cohort, [4, 2], 0.5)
    assert out2[0].tolist() == out.tolist()
    assert out2[1].tolist() == (-out).tolist()
    assert out2[2].tolist() == [0.0] * 6


def test_residual_recursion_two_rounds_by_hand():
    sizes, q = [4], 0.5
    r0 = torch.zeros(4, dtype=F64)
    # Round 1: Δ1 = [3, -1, 2, -4]; Δ1' = R0 + Δ1 = Δ1; ST keeps {3, -4}, μ = 3.5
    d1 = t([3.0, -1.0, 2.0, -4.0])
    sent1, r1 = compress_with_residual(d1, r0, sizes, q)
    assert sent1.tolist() == [3.5, 0.0, 0.0, -3.5]
    # R1 = Δ1 - ST(Δ1) = [3 - 3.5, -1, 2, -4 + 3.5]
    assert r1.tolist() == [-0.5, -1.0, 2.0, -0.5]
    # Round 2: Δ2 = [1, 2, 1, 0.5]; Δ2' = R1 + Δ2 = [0.5, 1, 3, 0]
    # ST keeps {3, 1}, μ = 2 -> sent2 = [0, 2, 2, 0]; R2 = [0.5, -1, 1, 0]
    d2 = t([1.0, 2.0, 1.0, 0.5])
    sent2, r2 = compress_with_residual(d2, r1, sizes, q)
    assert sent2.tolist() == [0.0, 2.0, 2.0, 0.0]
    assert r2.tolist() == [0.5, -1.0, 1.0, 0.0]


def test_residual_plus_sent_equals_previous_plus_update_exactly():
    gen = torch.Generator().manual_seed(0)
    # multiples of 1/8 and k = 4 (a power of 2) per segment: μ is a multiple of 1/32, so every
    # sum and difference below is exactly representable in float64
    update = torch.randint(-64, 64, (3, 32), generator=gen).to(F64) / 8
    residual = torch.randint(-64, 64, (3, 32), generator=gen).to(F64) / 8
    sent, new_residual = compress_with_residual(update, residual, [16, 16], 0.25)
    assert torch.equal(new_residual + sent, residual + update)
    assert ((sent != 0).sum(dim=1) <= 8).all()
    # arbitrary float64 values: equal up to one rounding
    update = torch.randn(3, 32, generator=gen, dtype=F64)
    residual = torch.randn(3, 32, generator=gen, dtype=F64)
    sent, new_residual = compress_with_residual(update, residual, [20, 12], 0.3)
    torch.testing.assert_close(new_residual + sent, residual + update, rtol=0, atol=1e-15)


def test_inactive_rows_send_nothing_and_keep_residual():
    update = t([[3.0, -1.0, 2.0, -4.0], [0.0, 0.0, 0.0, 0.0]])
    residual = t([[0.0, 0.0, 0.0, 0.0], [1.0, -2.0, 0.0, 0.5]])
    sent, new_residual = compress_with_residual(update, residual, [4], 0.5, active=torch.tensor([True, False]))
    assert sent.tolist() == [[3.5, 0.0, 0.0, -3.5], [0.0, 0.0, 0.0, 0.0]]
    assert new_residual.tolist() == [[-0.5, -1.0, 2.0, -0.5], [1.0, -2.0, 0.0, 0.5]]
    # without the mask the second row would have sent ST([1, -2, 0, 0.5]) = [1.5, -1.5, 0, 0]
    sent_all, _ = compress_with_residual(update, residual, [4], 0.5)
    assert sent_all[1].tolist() == [1.5, -1.5, 0.0, 0.0]


def test_bits_formulas():
    # dense: 32 bits per entry
    assert dense_bits([100, 10]) == 32 * 110
    # ternary, per tensor 32 + k * (1 + ceil(log2 n)):
    #   n = 100: k = 29, ceil(log2 100) = 7 -> 32 + 29 * 8 = 264
    #   n = 10:  k = floor(2.9) = 2, ceil(log2 10) = 4 -> 32 + 2 * 5 = 42
    assert ternary_bits([100, 10], 0.29) == 264 + 42
    #   n = 1: k = 1, ceil(log2 1) = 0 -> 33;  n = 4, q = 0.5: k = 2, log2 4 = 2 -> 32 + 2 * 3 = 38
    assert ternary_bits([1], 0.5) == 33
    assert ternary_bits([4], 0.5) == 38
    #   n = 5, q = 1: k = 5, ceil(log2 5) = 3 -> 32 + 5 * 4 = 52
    assert ternary_bits([5], 1.0) == 52


@pytest.mark.parametrize("q", [0.0, -0.1, 1.5, float("nan"), True, "half", None])
def test_bad_sparsity_raises(q):
    with pytest.raises(ValueError, match="q"):
        validate_sparsity(q)
    with pytest.raises(ValueError, match="q"):
        ternary(t([1.0, 2.0]), q)


def test_validate_sparsity_returns_float():
    assert validate_sparsity(1) == 1.0 and isinstance(validate_sparsity(1), float)
    assert validate_sparsity(0.29) == 0.29


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: ternary(torch.tensor([1, 2]), 0.5), "x must be a floating"),
        (lambda: ternary(torch.tensor(1.0), 0.5), "x must be a floating"),
        (lambda: ternary(torch.zeros(3, 0), 0.5), "at least one entry"),
        (lambda: ternary_per_tensor(torch.zeros(2, 5), [2, 2], 0.5), "sizes must sum"),
        (lambda: ternary_per_tensor(torch.zeros(2, 5), [5, 0], 0.5), "sizes"),
        (lambda: ternary_per_tensor(torch.zeros(2, 2, 5), [5], 0.5), "flat"),
        (lambda: compress_with_residual(torch.zeros(2, 4), torch.zeros(4), [4], 0.5), "residual"),
        (lambda: compress_with_residual(torch.zeros(2, 4), torch.zeros(2, 4), [4], 0.5,
                                        active=torch.tensor([1, 0])), "active"),
        (lambda: kept_count(0, 0.5), "n"),
        (lambda: dense_bits([]), "sizes"),
        (lambda: ternary_bits([3, -1], 0.5), "sizes"),
    ],
)
def test_input_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
