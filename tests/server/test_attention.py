"""Hand-checked tests for lfed.server.attention (SPEC §4; IGFL 000 Algorithm 3)."""

from __future__ import annotations

import math

import pytest
import torch

from lfed.server.attention import QUERIES, AttentionResult, attention_combine

F64 = torch.float64
E = math.e


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


def close(actual, expected, atol=1e-12):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=0, atol=atol)


def h(*probs):  # entropy in nats
    return -sum(p * math.log(p) for p in probs if p > 0)


def test_query_names():
    assert QUERIES == ("self", "global", "time")


def test_self_attention_by_hand():
    # Δ_1 = [1, 0], Δ_2 = [1, 1]
    # dot products: <Δ1,Δ1> = 1, <Δ1,Δ2> = 1, <Δ2,Δ2> = 2
    # row 1: softmax([1, 1]) = [1/2, 1/2]
    # row 2: softmax([1, 2]) = [1/(1+e), e/(1+e)]
    # weights_j = mean over rows: w_1 = (1/2 + 1/(1+e)) / 2, w_2 = (1/2 + e/(1+e)) / 2
    # Δ = w_1 Δ_1 + w_2 Δ_2 = [w_1 + w_2, w_2] = [1, w_2]
    r = attention_combine(t([[1.0, 0.0], [1.0, 1.0]]), "self")
    assert isinstance(r, AttentionResult)
    p = E / (1 + E)
    close(r.matrix, [[0.5, 0.5], [1 - p, p]])
    w2 = (0.5 + p) / 2
    close(r.weights, [1 - w2, w2])
    close(r.update, [1.0, w2])  # w_2 = 0.6155...
    assert abs(w2 - 0.6155) < 1e-4
    close(r.entropy, (math.log(2) + h(p, 1 - p)) / 2)
    close(r.weight_sum, 1.0)


def test_self_attention_three_clients_by_hand():
    # Δ = [[1, 0], [0, 1], [1, 1]]; Gram = [[1, 0, 1], [0, 1, 1], [1, 1, 2]]
    # row 1: exps [e, 1, e] / (2e + 1); row 2: [1, e, e] / (2e + 1); row 3: [e, e, e²] / (2e + e²)
    upd = t([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    r = attention_combine(upd, "self")
    s1 = 2 * E + 1
    s3 = 2 * E + E * E
    a = [[E / s1, 1 / s1, E / s1], [1 / s1, E / s1, E / s1], [E / s3, E / s3, E * E / s3]]
    close(r.matrix, a)
    w = [sum(a[i][j] for i in range(3)) / 3 for j in range(3)]
    close(r.weights, w)
    close(r.update, [w[0] + w[2], w[1] + w[2]])


def test_global_attention_by_hand():
    # q = mean(Δ) = ([1, 0] + [1, 1]) / 2 = [1, 0.5]; ψ = [<q,Δ1>, <q,Δ2>] = [1, 1.5]
    # α = [e^1, e^1.5] / (e^1 + e^1.5);  Δ = α_1 [1, 0] + α_2 [1, 1] = [1, α_2]
    r = attention_combine(t([[1.0, 0.0], [1.0, 1.0]]), "global")
    a2 = math.exp(1.5) / (math.exp(1) + math.exp(1.5))
    assert r.matrix.shape == (1, 2)
    close(r.matrix, [[1 - a2, a2]])
    close(r.weights, [1 - a2, a2])
    close(r.update, [1.0, a2])
    close(r.entropy, h(a2, 1 - a2))


def test_time_attention_by_hand_weights_do_not_sum_to_one():
    # previous: client 1 had [1, 0], client 2 none (zeros); current Δ_1 = [2, 0], Δ_2 = [0, 1]
    # row 1 (query [1,0]): ψ = [2, 0] -> α_11 = e²/(e² + 1)
    # row 2 (query 0):     ψ = [0, 0] -> α_22 = 1/2
    # weights = [e²/(e²+1), 1/2], sum = 1.3808 != 1 (not renormalised)
    # Δ = α_11 [2, 0] + α_22 [0, 1] = [2 e²/(e²+1), 1/2]
    prev = t([[1.0, 0.0], [0.0, 0.0]])
    r = attention_combine(t([[2.0, 0.0], [0.0, 1.0]]), "time", previous_updates=prev, time_weights="diagonal")
    a11 = E**2 / (E**2 + 1)
    close(r.matrix, [[a11, 1 - a11], [0.5, 0.5]])
    close(r.weights, [a11, 0.5])
    close(r.weight_sum, a11 + 0.5)
    assert abs(r.weight_sum.item() - 1.3808) < 1e-4
    close(r.update, [2 * a11, 0.5])
    close(r.entropy, (h(a11, 1 - a11) + math.log(2)) / 2)


@pytest.mark.parametrize("time_weights", ["softmax", "diagonal"])
def test_time_attention_with_zero_previous_is_plain_mean(time_weights):
    upd = t([[1.0, 2.0], [3.0, -4.0], [0.5, 0.0]])
    r = attention_combine(upd, "time", previous_updates=torch.zeros_like(upd), time_weights=time_weights)
    # every ψ = 0 -> α_j = 1/3 (both readings); Δ = mean = [(1 + 3 + 0.5)/3, (2 - 4 + 0)/3]
    close(r.weights, [1 / 3] * 3)
    close(r.weight_sum, 1.0)
    close(r.update, [4.5 / 3, -2 / 3])
    close(r.entropy, math.log(3))


def test_time_attention_softmax_weights_by_hand():
    # SPEC §4 time_weights=softmax (the default): α_j = exp ψ(q_j, Δ_j) / Σ_τ exp ψ(q_τ, Δ_τ).
    # q_1 = [1, 0], q_2 = 0, q_3 = [0, 1]; Δ_1 = [2, 0], Δ_2 = [0, 1], Δ_3 = [1, 3]
    # own similarities ψ = [2, 0, 3] -> α = [e², 1, e³] / (e² + 1 + e³), summing to 1
    prev = t([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    upd = t([[2.0, 0.0], [0.0, 1.0], [1.0, 3.0]])
    r = attention_combine(upd, "time", previous_updates=prev)
    z = E**2 + 1 + E**3
    a = [E**2 / z, 1 / z, E**3 / z]
    close(r.weights, a)
    close(r.weight_sum, 1.0)
    close(r.matrix, [a])
    close(r.update, [2 * a[0] + a[2], a[1] + 3 * a[2]])
    close(r.entropy, -sum(x * math.log(x) for x in a))
    close(r.logit_spread, 3.0)  # max - min of the logits [2, 0, 3]
    close(r.mean_sq_norm, (4 + 1 + 10) / 3)
    # the diagonal reading differs on the same input: row j's softmax over ψ(q_j, Δ_τ)
    d = attention_combine(upd, "time", previous_updates=prev, time_weights="diagonal")
    rows = [[2.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 3.0]]  # ψ(q_j, Δ_τ)
    diag = [math.exp(rows[j][j]) / sum(math.exp(v) for v in rows[j]) for j in range(3)]
    close(d.weights, diag)
    close(d.logit_spread, (2.0 + 0.0 + 3.0) / 3)  # mean over rows of max - min
    assert abs(sum(diag) - 1) > 0.1


def test_logit_spread_and_norms_of_self_and_global_by_hand():
    upd = t([[1.0, 0.0], [1.0, 1.0]])
    r = attention_combine(upd, "self")  # ψ = [[1, 1], [1, 2]]: spreads 0 and 1
    close(r.logit_spread, 0.5)
    close(r.mean_sq_norm, 1.5)
    g = attention_combine(upd, "global")  # q = [1, 0.5]: ψ = [1, 1.5]
    close(g.logit_spread, 0.5)
    masked = attention_combine(t([[1.0, 0.0], [1.0, 1.0], [9.0, 9.0]]), "global", mask=torch.tensor([True, True, False]))
    close(masked.logit_spread, 0.5)  # the masked client is no key
    close(masked.mean_sq_norm, 1.5)


def test_unknown_time_weights_is_refused():
    with pytest.raises(ValueError, match="time_weights must be one of"):
        attention_combine(t([[1.0, 0.0]]), "time", previous_updates=t([[0.0, 0.0]]), time_weights="renormalised")


@pytest.mark.parametrize("query", ["self", "global"])
def test_identical_updates_give_plain_mean(query):
    upd = t([[0.3, -1.2, 2.0]] * 4)
    r = attention_combine(upd, query)
    close(r.weights, [0.25] * 4)  # uniform weights, not only the same vector
    close(r.matrix, torch.full_like(r.matrix, 0.25))
    close(r.update, [0.3, -1.2, 2.0])
    close(r.entropy, math.log(4))


@pytest.mark.parametrize("query", QUERIES)
def test_large_dot_products_stay_finite(query):
    # Gram entries 1e4 (and 1e8): exp(1e4) overflows; the max-subtracted softmax saturates instead
    for scale in (100.0, 1e4):
        upd = t([[scale, 0.0], [0.0, scale]])
        prev = t([[scale, 0.0], [0.0, 0.0]])
        r = attention_combine(upd, query, previous_updates=prev)
        for x in (r.update, r.weights, r.matrix, r.entropy):
            assert torch.isfinite(x).all()
    r = attention_combine(t([[100.0, 0.0], [0.0, 100.0]]), "self")
    # row i attends only to itself: α = I, weights = [1/2, 1/2], entropy 0
    close(r.matrix, [[1.0, 0.0], [0.0, 1.0]])
    close(r.update, [50.0, 50.0])
    close(r.entropy, 0.0)


def test_float32_updates_dot_products_in_float64():
    # float32 input: update keeps dtype float32; attention computed in float64
    upd = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float32)
    r = attention_combine(upd, "global")
    assert r.update.dtype == torch.float32
    assert r.weights.dtype == F64 and r.matrix.dtype == F64
    a2 = math.exp(1.5) / (math.exp(1) + math.exp(1.5))
    close(r.weights, [1 - a2, a2])
    torch.testing.assert_close(r.update, torch.tensor([1.0, a2]))


def test_temperature_scaling():
    upd = t([[1.0, 0.0], [1.0, 1.0]])
    # τ = 2: ψ/τ = [0.5, 0.75] -> α_2 = e^0.75 / (e^0.5 + e^0.75)
    r = attention_combine(upd, "global", temperature=2.0)
    a2 = math.exp(0.75) / (math.exp(0.5) + math.exp(0.75))
    close(r.weights, [1 - a2, a2])
    # ψ(x/√τ, y/√τ) = ψ(x, y)/τ: same attention as scaling the updates down by √τ
    for query in ("self", "global"):
        r1 = attention_combine(upd, query, temperature=4.0)
        r2 = attention_combine(upd / 2.0, query)
        close(r1.matrix, r2.matrix)
    # a huge temperature makes attention uniform
    close(attention_combine(upd, "self", temperature=1e12).weights, [0.5, 0.5])


def test_mask_excludes_clients_from_keys_and_queries():
    base = t([[1.0, 0.0], [1.0, 1.0]])
    upd = torch.cat([base, t([[50.0, -70.0]])])
    mask = torch.tensor([True, True, False])
    for query, time_weights in [*((q, "diagonal") for q in QUERIES), ("time", "softmax")]:
        prev = t([[1.0, 0.0], [0.0, 0.0], [9.0, 9.0]])
        r_masked = attention_combine(upd, query, previous_updates=prev, mask=mask, time_weights=time_weights)
        r_two = attention_combine(base, query, previous_updates=prev[:2], time_weights=time_weights)
        close(r_masked.update, r_two.update)
        close(r_masked.weights[:2], r_two.weights)
        assert r_masked.weights[2].item() == 0.0
        assert (r_masked.matrix[:, 2] == 0).all()
        if r_masked.matrix.shape[0] == 3:  # a row per query (self, time diagonal)
            assert (r_masked.matrix[2] == 0).all()
        close(r_masked.entropy, r_two.entropy)
        close(r_masked.logit_spread, r_two.logit_spread)


def test_all_masked_gives_zeros():
    r = attention_combine(t([[1.0, 2.0], [3.0, 4.0]]), "self", mask=torch.tensor([False, False]))
    assert r.update.tolist() == [0.0, 0.0]
    assert r.weights.tolist() == [0.0, 0.0]
    assert r.entropy.item() == 0.0


def test_chunked_float64_dot_products(monkeypatch):
    import lfed.server.attention as att

    gen = torch.Generator().manual_seed(0)
    upd = torch.randn(3, 50, generator=gen)
    prev = torch.randn(3, 50, generator=gen)
    full = {q: attention_combine(upd, q, previous_updates=prev) for q in QUERIES}
    monkeypatch.setattr(att, "_CHUNK_ELEMS", 7)  # forces many column chunks
    for q in QUERIES:
        chunked = attention_combine(upd, q, previous_updates=prev)
        torch.testing.assert_close(chunked.matrix, full[q].matrix, rtol=0, atol=1e-12)
        torch.testing.assert_close(chunked.update, full[q].update)
    # float64 reference: α from float64 dot products of the same values
    ref = attention_combine(upd.double(), "self")
    torch.testing.assert_close(full["self"].matrix, ref.matrix, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(query="cross"), "query"),
        (dict(query="time"), "previous_updates"),
        (dict(query="time", previous_updates=torch.zeros(3, 2)), "previous_updates"),
        (dict(updates=torch.zeros(4)), "updates"),
        (dict(updates=torch.zeros(2, 2, dtype=torch.int64)), "updates"),
        (dict(mask=torch.tensor([1, 1])), "mask"),
        (dict(mask=torch.tensor([True])), "mask"),
        (dict(updates=t([[float("nan"), 0.0], [1.0, 1.0]])), "finite"),
    ],
)
def test_errors(kwargs, match):
    args = dict(updates=t([[1.0, 0.0], [1.0, 1.0]]), query="self")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        attention_combine(**args)
