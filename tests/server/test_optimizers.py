"""Tests for lfed.server.optimizers (SPEC §4.1), each step worked by hand.

Convention under test: the server sets ``p.grad = -Δ`` and calls ``step()``.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from lfed.server.optimizers import FedAdagrad, FedAdam, FedYogi, apply_pseudo_gradient

F64 = torch.float64


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def server_step(opt: torch.optim.Optimizer, w: torch.Tensor, delta: torch.Tensor) -> None:
    w.grad = -delta
    opt.step()


# ---------------------------------------------------------------- FedAvg / FedAvgM via SGD


def test_sgd_lr1_is_fedavg() -> None:
    w = t(1.0, -2.0).requires_grad_()
    opt = torch.optim.SGD([w], lr=1.0)
    server_step(opt, w, t(0.25, 0.5))
    # w + Δ = [1.25, -1.5]
    torch.testing.assert_close(w.detach(), t(1.25, -1.5), rtol=0, atol=0)


def test_sgd_momentum_is_fedavgm_two_steps() -> None:
    # SPEC: v ← βv + Δ; w ← w + eta_s v, with β = 0.9, eta_s = 0.5, v_0 = 0.
    w = t(0.0, 1.0).requires_grad_()
    opt = torch.optim.SGD([w], lr=0.5, momentum=0.9)
    # step 1: Δ1 = [1, -2]; v1 = 0.9*0 + Δ1 = [1, -2]; w1 = [0, 1] + 0.5*[1, -2] = [0.5, 0]
    server_step(opt, w, t(1.0, -2.0))
    torch.testing.assert_close(w.detach(), t(0.5, 0.0), rtol=0, atol=1e-15)
    # torch's momentum buffer holds -v
    torch.testing.assert_close(opt.state[w]["momentum_buffer"], t(-1.0, 2.0), rtol=0, atol=0)
    # step 2: Δ2 = [2, 1]; v2 = 0.9*[1, -2] + [2, 1] = [2.9, -0.8];
    #         w2 = [0.5, 0] + 0.5*[2.9, -0.8] = [1.95, -0.4]
    server_step(opt, w, t(2.0, 1.0))
    torch.testing.assert_close(w.detach(), t(1.95, -0.4), rtol=0, atol=1e-15)
    torch.testing.assert_close(opt.state[w]["momentum_buffer"], t(-2.9, 0.8), rtol=0, atol=1e-15)


# ---------------------------------------------------------------- FedAdam


def test_fedadam_two_steps_by_hand() -> None:
    # lr = 0.1, β1 = β2 = 0.5, τ = 1 so v_0 = τ² = 1; m_0 = 0. w_0 = [1, 2, 3].
    w = t(1.0, 2.0, 3.0).requires_grad_()
    opt = FedAdam([w], lr=0.1, betas=(0.5, 0.5), tau=1.0)
    # step 1: Δ1 = [1, -1, 0]
    #   m1 = 0.5*0 + 0.5*Δ1 = [0.5, -0.5, 0]
    #   v1 = 0.5*1 + 0.5*Δ1² = [1, 1, 0.5]
    #   w1 = w0 + 0.1*m1/(sqrt(v1) + 1) = [1 + 0.05/2, 2 - 0.05/2, 3] = [1.025, 1.975, 3]
    server_step(opt, w, t(1.0, -1.0, 0.0))
    torch.testing.assert_close(opt.state[w]["m"], t(0.5, -0.5, 0.0), rtol=0, atol=0)
    torch.testing.assert_close(opt.state[w]["v"], t(1.0, 1.0, 0.5), rtol=0, atol=0)
    torch.testing.assert_close(w.detach(), t(1.025, 1.975, 3.0), rtol=0, atol=1e-15)
    # step 2: Δ2 = [3, 1, 0]
    #   m2 = 0.5*[0.5, -0.5, 0] + 0.5*[3, 1, 0] = [1.75, 0.25, 0]
    #   v2 = 0.5*[1, 1, 0.5] + 0.5*[9, 1, 0] = [5, 1, 0.25]
    #   w2 = w1 + 0.1*[1.75/(sqrt5 + 1), 0.25/2, 0] = [1.025 + 0.175/(sqrt5+1), 1.9875, 3]
    server_step(opt, w, t(3.0, 1.0, 0.0))
    torch.testing.assert_close(opt.state[w]["m"], t(1.75, 0.25, 0.0), rtol=0, atol=0)
    torch.testing.assert_close(opt.state[w]["v"], t(5.0, 1.0, 0.25), rtol=0, atol=0)
    expected = t(1.025 + 0.175 / (math.sqrt(5.0) + 1.0), 1.9875, 3.0)
    torch.testing.assert_close(w.detach(), expected, rtol=0, atol=1e-15)
    assert opt.state[w]["step"] == 2


def test_fedadam_default_v0_is_tau_squared_and_no_bias_correction() -> None:
    # Defaults lr = 0.01, β = (0.9, 0.99), τ = 1e-3. One step with Δ = [0.1]:
    #   m = 0.1*0.1 = 0.01; v = 0.99*1e-6 + 0.01*0.01 = 1.0099e-4
    #   w = 0.01*0.01/(sqrt(1.0099e-4) + 1e-3)
    # ≈ 0.009050. torch.optim.Adam (bias-corrected, v0 = 0, eps = τ) moves by
    #   0.01 * (0.01/0.1) / (sqrt(1e-4/0.01) + 1e-3) = 0.01 * 0.1/0.101 ≈ 0.009901.
    w = t(0.0).requires_grad_()
    opt = FedAdam([w])
    server_step(opt, w, t(0.1))
    v = 0.99 * 1e-6 + 0.01 * 0.01
    torch.testing.assert_close(opt.state[w]["v"], t(v), rtol=1e-15, atol=0)
    torch.testing.assert_close(w.detach(), t(0.01 * 0.01 / (math.sqrt(v) + 1e-3)), rtol=1e-14, atol=0)
    w_adam = t(0.0).requires_grad_()
    adam = torch.optim.Adam([w_adam], lr=0.01, betas=(0.9, 0.99), eps=1e-3)
    server_step(adam, w_adam, t(0.1))
    torch.testing.assert_close(w_adam.detach(), t(0.01 * 0.1 / 0.101), rtol=1e-12, atol=0)
    assert abs(w.item() - w_adam.item()) > 5e-4


def test_initial_accumulator_value_zero() -> None:
    # v_0 = 0, lr = 1, β = (0.5, 0.75), τ = 0.5, Δ = [2]:
    #   m = 0.5*2 = 1; v = 0.25*4 = 1; w = 1*1/(1 + 0.5) = 2/3
    w = t(0.0).requires_grad_()
    opt = FedAdam([w], lr=1.0, betas=(0.5, 0.75), tau=0.5, initial_accumulator_value=0.0)
    server_step(opt, w, t(2.0))
    torch.testing.assert_close(w.detach(), t(2.0 / 3.0), rtol=1e-15, atol=0)


# ---------------------------------------------------------------- FedYogi


def test_fedyogi_two_steps_by_hand() -> None:
    # lr = 0.1, β1 = β2 = 0.5, τ = 1 (v_0 = 1), w_0 = [0, 0, 0].
    w = t(0.0, 0.0, 0.0).requires_grad_()
    opt = FedYogi([w], lr=0.1, betas=(0.5, 0.5), tau=1.0)
    # step 1: Δ1 = [2, 1, 0.5], Δ1² = [4, 1, 0.25]
    #   sign(v0 - Δ1²) = sign([-3, 0, 0.75]) = [-1, 0, 1]
    #   v1 = v0 - 0.5*Δ1²*sign = [1 + 2, 1 - 0, 1 - 0.125] = [3, 1, 0.875]
    #   m1 = 0.5*Δ1 = [1, 0.5, 0.25]
    #   w1 = 0.1*m1/(sqrt(v1) + 1) = [0.1/(sqrt3 + 1), 0.05/2, 0.025/(sqrt0.875 + 1)]
    server_step(opt, w, t(2.0, 1.0, 0.5))
    torch.testing.assert_close(opt.state[w]["v"], t(3.0, 1.0, 0.875), rtol=0, atol=0)
    w1 = t(0.1 / (math.sqrt(3.0) + 1.0), 0.025, 0.025 / (math.sqrt(0.875) + 1.0))
    torch.testing.assert_close(w.detach(), w1, rtol=0, atol=1e-15)
    # step 2: Δ2 = [-1, 2, 0], Δ2² = [1, 4, 0]
    #   sign(v1 - Δ2²) = sign([2, -3, 0.875]) = [1, -1, 1]
    #   v2 = [3 - 0.5, 1 + 2, 0.875 - 0] = [2.5, 3, 0.875]
    #   m2 = 0.5*[1, 0.5, 0.25] + 0.5*[-1, 2, 0] = [0, 1.25, 0.125]
    #   w2 = w1 + 0.1*[0, 1.25/(sqrt3 + 1), 0.125/(sqrt0.875 + 1)]
    server_step(opt, w, t(-1.0, 2.0, 0.0))
    torch.testing.assert_close(opt.state[w]["v"], t(2.5, 3.0, 0.875), rtol=0, atol=0)
    torch.testing.assert_close(opt.state[w]["m"], t(0.0, 1.25, 0.125), rtol=0, atol=0)
    w2 = w1 + t(0.0, 0.125 / (math.sqrt(3.0) + 1.0), 0.0125 / (math.sqrt(0.875) + 1.0))
    torch.testing.assert_close(w.detach(), w2, rtol=0, atol=1e-15)


# ---------------------------------------------------------------- FedAdagrad


def test_fedadagrad_two_steps_by_hand() -> None:
    # lr = 0.1, β1 = 0 (default: m = Δ), τ = 1 (v_0 = 1), w_0 = [1, 1].
    w = t(1.0, 1.0).requires_grad_()
    opt = FedAdagrad([w], lr=0.1, tau=1.0)
    # step 1: Δ1 = [1, -2]; v1 = 1 + Δ1² = [2, 5]
    #   w1 = [1 + 0.1/(sqrt2 + 1), 1 - 0.2/(sqrt5 + 1)]
    server_step(opt, w, t(1.0, -2.0))
    torch.testing.assert_close(opt.state[w]["v"], t(2.0, 5.0), rtol=0, atol=0)
    w1 = t(1.0 + 0.1 / (math.sqrt(2.0) + 1.0), 1.0 - 0.2 / (math.sqrt(5.0) + 1.0))
    torch.testing.assert_close(w.detach(), w1, rtol=0, atol=1e-15)
    # step 2: Δ2 = [-1, 2]; v2 = [2 + 1, 5 + 4] = [3, 9]
    #   w2 = w1 + [-0.1/(sqrt3 + 1), 0.2/(3 + 1)] = w1 + [-0.1/(sqrt3 + 1), 0.05]
    server_step(opt, w, t(-1.0, 2.0))
    torch.testing.assert_close(opt.state[w]["v"], t(3.0, 9.0), rtol=0, atol=0)
    w2 = w1 + t(-0.1 / (math.sqrt(3.0) + 1.0), 0.05)
    torch.testing.assert_close(w.detach(), w2, rtol=0, atol=1e-15)


def test_fedadagrad_momentum() -> None:
    # β1 = 0.5, lr = 1, τ = 1: Δ1 = [2] -> m1 = 1, v1 = 1 + 4 = 5, w1 = 1/(sqrt5 + 1).
    # Δ2 = [-2] -> m2 = 0.5*1 + 0.5*(-2) = -0.5, v2 = 9, w2 = w1 - 0.5/(3 + 1) = w1 - 0.125.
    w = t(0.0).requires_grad_()
    opt = FedAdagrad([w], lr=1.0, beta1=0.5, tau=1.0)
    server_step(opt, w, t(2.0))
    w1 = 1.0 / (math.sqrt(5.0) + 1.0)
    torch.testing.assert_close(w.detach(), t(w1), rtol=0, atol=1e-15)
    server_step(opt, w, t(-2.0))
    torch.testing.assert_close(w.detach(), t(w1 - 0.125), rtol=0, atol=1e-15)


# ---------------------------------------------------------------- shared behaviour

FACTORIES = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=1.0),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9),
    "fedadam": lambda ps: FedAdam(ps, lr=0.1, betas=(0.9, 0.99), tau=0.01),
    "fedyogi": lambda ps: FedYogi(ps, lr=0.1, betas=(0.9, 0.99), tau=0.01),
    "fedadagrad": lambda ps: FedAdagrad(ps, lr=0.1, beta1=0.9, tau=0.01),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_positive_delta_moves_w_up(name: str) -> None:
    w = t(0.0, 0.0).requires_grad_()
    opt = FACTORIES[name]([w])
    server_step(opt, w, t(0.3, -0.3))
    assert w[0].item() > 0.0
    assert w[1].item() < 0.0


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad", "sgd_momentum"])
def test_state_dict_round_trip(name: str) -> None:
    gen = torch.Generator().manual_seed(0)
    deltas = [torch.randn(3, generator=gen, dtype=F64) for _ in range(3)]
    w0 = torch.randn(3, generator=gen, dtype=F64)

    # uninterrupted
    w = w0.clone().requires_grad_()
    opt = FACTORIES[name]([w])
    for d in deltas:
        server_step(opt, w, d)

    # interrupted after one step: save, rebuild, load, continue
    w_a = w0.clone().requires_grad_()
    opt_a = FACTORIES[name]([w_a])
    server_step(opt_a, w_a, deltas[0])
    saved = copy.deepcopy(opt_a.state_dict())
    w_b = w_a.detach().clone().requires_grad_()
    opt_b = FACTORIES[name]([w_b])
    opt_b.load_state_dict(saved)
    for d in deltas[1:]:
        server_step(opt_b, w_b, d)

    torch.testing.assert_close(w_b.detach(), w.detach(), rtol=0, atol=0)
    # A fresh optimizer without the state would not match (the test can fail).
    w_c = w_a.detach().clone().requires_grad_()
    opt_c = FACTORIES[name]([w_c])
    for d in deltas[1:]:
        server_step(opt_c, w_c, d)
    assert not torch.equal(w_c.detach(), w.detach())


@pytest.mark.parametrize("cls", [FedAdam, FedYogi, FedAdagrad])
def test_dtype_and_grad_none(cls: type) -> None:
    a = torch.zeros(2, dtype=torch.float32, requires_grad=True)
    b = torch.ones(2, dtype=F64, requires_grad=True)
    opt = cls([a, b], lr=0.1)
    a.grad = -torch.ones(2, dtype=torch.float32)  # b has no grad: left untouched
    opt.step()
    assert opt.state[a]["v"].dtype == torch.float32
    assert a.dtype == torch.float32 and (a > 0).all()
    torch.testing.assert_close(b.detach(), torch.ones(2, dtype=F64), rtol=0, atol=0)
    assert b not in opt.state


def test_param_groups_own_lr() -> None:
    # Adagrad β1 = 0, τ = 1, Δ = 1: v = 1 + 1 = 2, step = lr/(sqrt2 + 1).
    a = t(0.0).requires_grad_()
    b = t(0.0).requires_grad_()
    opt = FedAdagrad([{"params": [a]}, {"params": [b], "lr": 1.0}], lr=0.1, tau=1.0)
    a.grad = t(-1.0)
    b.grad = t(-1.0)
    opt.step()
    torch.testing.assert_close(a.detach(), t(0.1 / (math.sqrt(2.0) + 1.0)), rtol=0, atol=1e-15)
    torch.testing.assert_close(b.detach(), t(1.0 / (math.sqrt(2.0) + 1.0)), rtol=0, atol=1e-15)


def test_closure_value_is_returned() -> None:
    w = t(0.0).requires_grad_()
    opt = FedAdam([w])
    w.grad = t(0.0)
    assert opt.step(lambda: torch.tensor(7.0)).item() == 7.0


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [
        ({"lr": 0.0}, "lr"),
        ({"lr": -1.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"betas": (1.0, 0.9)}, "beta1"),
        ({"betas": (0.9, -0.1)}, "beta2"),
        ({"betas": (0.9,)}, "betas"),
        ({"tau": 0.0}, "tau"),
        ({"tau": float("inf")}, "tau"),
        ({"initial_accumulator_value": -1.0}, "initial_accumulator_value"),
    ],
)
@pytest.mark.parametrize("cls", [FedAdam, FedYogi])
def test_invalid_args(cls: type, kwargs: dict, arg: str) -> None:
    with pytest.raises(ValueError, match=arg):
        cls([t(0.0).requires_grad_()], **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [({"lr": 0}, "lr"), ({"beta1": 1.0}, "beta1"), ({"tau": -1e-3}, "tau"), ({"beta1": -0.5}, "beta1")],
)
def test_invalid_args_adagrad(kwargs: dict, arg: str) -> None:
    with pytest.raises(ValueError, match=arg):
        FedAdagrad([t(0.0).requires_grad_()], **kwargs)


def test_sparse_grad_rejected() -> None:
    w = t(0.0, 0.0).requires_grad_()
    opt = FedAdam([w])
    w.grad = torch.sparse_coo_tensor([[0]], t(1.0), (2,), check_invariants=True)
    with pytest.raises(ValueError, match="sparse"):
        opt.step()


# ---------------------------------------------------------------- apply_pseudo_gradient


def test_apply_pseudo_gradient_flat() -> None:
    # Two parameters [2x1] and [1]; flat Δ = [1, 2, 3]. SGD(lr=1): w ← w + Δ per tensor.
    a = torch.zeros(2, 1, dtype=F64, requires_grad=True)
    b = torch.ones(1, dtype=F64, requires_grad=True)
    opt = torch.optim.SGD([a, b], lr=1.0)
    apply_pseudo_gradient(opt, [a, b], t(1.0, 2.0, 3.0))
    torch.testing.assert_close(a.grad, -t(1.0, 2.0).reshape(2, 1), rtol=0, atol=0)
    torch.testing.assert_close(a.detach(), t(1.0, 2.0).reshape(2, 1), rtol=0, atol=0)
    torch.testing.assert_close(b.detach(), t(4.0), rtol=0, atol=0)
    # per-tensor form
    apply_pseudo_gradient(opt, [a, b], [t(1.0, 1.0).reshape(2, 1), t(-4.0)])
    torch.testing.assert_close(a.detach(), t(2.0, 3.0).reshape(2, 1), rtol=0, atol=0)
    torch.testing.assert_close(b.detach(), t(0.0), rtol=0, atol=0)


def test_apply_pseudo_gradient_errors() -> None:
    a = torch.zeros(2, dtype=F64, requires_grad=True)
    opt = torch.optim.SGD([a], lr=1.0)
    with pytest.raises(ValueError, match="P=2"):
        apply_pseudo_gradient(opt, [a], t(1.0, 2.0, 3.0))
    with pytest.raises(ValueError, match="1 tensors"):
        apply_pseudo_gradient(opt, [a], [t(1.0), t(2.0)])
    with pytest.raises(ValueError, match="does not match"):
        apply_pseudo_gradient(opt, [a], [t(1.0, 2.0, 3.0)])
