"""Tests for lfed.models.zoo (and the families it names: convnets, language): exact parameter counts, shapes, float64, torch.func/vmap."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap

from lfed.models.convnets import _tf_same_max_pool_3x3_s2
from lfed.models.zoo import (
    MLP,
    MODELS,
    CharLSTM,
    CharTransformer,
    LogisticRegression,
    McMahanCIFARCNN,
    McMahanMNISTCNN,
    ReddiEMNISTCNN,
    SmallCNN,
    build_model,
    count_parameters,
)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- parameter counts


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        # 784*10 + 10
        (LogisticRegression(), 7_850),
        # 784*200+200 + 200*200+200 + 200*10+10 = 157,000 + 40,200 + 2,010 (McMahan 2017 2NN)
        (MLP(), 199_210),
        # 4*3+3 + 3*2+2 = 15 + 8
        (MLP(in_features=4, hidden=(3,), num_classes=2), 23),
        # no hidden layer = logistic regression: 4*2 + 2
        (MLP(in_features=4, hidden=(), num_classes=2), 10),
        # 832 + 51,264 + 7*7*64*512+512 (1,606,144) + 5,130 (McMahan 2017: 1,663,370)
        (McMahanMNISTCNN(), 1_663_370),
        # 62 classes: 832 + 51,264 + 1,606,144 + 512*62+62 (31,806)
        (McMahanMNISTCNN(num_classes=62), 1_690_046),
        # 4,864 + 102,464 + 8*8*64*384+384 (1,573,248) + 73,920 + 1,930
        (McMahanCIFARCNN(), 1_756_426),
        # 24x24 crops as in the paper: local3 = 6*6*64*384+384 = 885,120
        (McMahanCIFARCNN(image_size=24), 1_068_298),
        # LRN has no parameters
        (McMahanCIFARCNN(lrn=False), 1_756_426),
        # 320 + 18,496 + 12*12*64*128+128 (1,179,776) + 128*62+62 (7,998)
        (ReddiEMNISTCNN(), 1_206_590),
        (ReddiEMNISTCNN(dropout=False), 1_206_590),
        # 10 classes: 320 + 18,496 + 1,179,776 + 1,290
        (ReddiEMNISTCNN(num_classes=10), 1_199_882),
        # 640 + (4*256*264 + 2*1024) + (4*256*512 + 2*1024) + 256*80+80
        (CharLSTM(), 819_920),
        (CharLSTM(unrolled=True), 819_920),
        # 160 + 4,640 + 1,290
        (SmallCNN(), 6_090),
        # 2*80*128 + 4*(512 + 49,536 + 16,512 + 66,048 + 65,664) + 256 + 10,320
        (CharTransformer(), 824_144),
        # vocab 7, seq_len 6, width 8, 2 blocks, d_ff 16: embeddings 7*8 + 6*8, per block LayerNorms 32,
        # qkv 8*24+24, proj 8*8+8, fc1 8*16+16, fc2 16*8+8; final LayerNorm 16, head 8*7+7
        # = 56 + 48 + 2*(32 + 216 + 72 + 144 + 136) + 16 + 63 = 1,383
        (CharTransformer(vocab_size=7, seq_len=6, d_model=8, num_layers=2, num_heads=2, d_ff=16), 1_383),
    ],
)
def test_parameter_counts(model: nn.Module, expected: int) -> None:
    assert n_params(model) == expected
    assert count_parameters(model) == expected


def test_count_parameters_skips_frozen() -> None:
    model = LogisticRegression(4, 2)  # weight 8, bias 2
    model.linear.bias.requires_grad_(False)
    assert count_parameters(model) == 8


# ---------------------------------------------------------------- shapes and dtype

# name -> (kwargs, one sample's shape, input kind)
SPECS: dict[str, tuple[dict, tuple[int, ...], str]] = {
    "logistic": ({"in_features": 12, "num_classes": 3}, (3, 4), "float"),
    "mlp": ({"in_features": 12, "hidden": (5, 4), "num_classes": 3}, (12,), "float"),
    "mcmahan_mnist_cnn": ({}, (1, 28, 28), "float"),
    "mcmahan_cifar_cnn": ({"image_size": 8}, (3, 8, 8), "float"),
    "reddi_emnist_cnn": ({"dropout": False}, (1, 28, 28), "float"),
    "char_lstm": ({"vocab_size": 7, "embed_dim": 3, "hidden": 5, "unrolled": True}, (6,), "long"),
    "small_cnn": ({}, (1, 8, 8), "float"),
    "char_transformer": ({"vocab_size": 7, "seq_len": 6, "d_model": 8, "num_layers": 2, "num_heads": 2, "d_ff": 16}, (6,), "long"),
}

OUT = {
    "logistic": 3,
    "mlp": 3,
    "mcmahan_mnist_cnn": 10,
    "mcmahan_cifar_cnn": 10,
    "reddi_emnist_cnn": 62,
    "char_lstm": 7,
    "small_cnn": 10,
    "char_transformer": 7,
}


def make_input(kind: str, shape: tuple[int, ...], gen: torch.Generator, vocab: int = 7) -> torch.Tensor:
    if kind == "long":
        return torch.randint(0, vocab, shape, generator=gen)
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def test_models_dict_covers_specs() -> None:
    assert set(SPECS) == set(MODELS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_forward_shape_and_float64(name: str) -> None:
    kwargs, sample, kind = SPECS[name]
    torch.manual_seed(0)
    model = build_model(name, **kwargs).double()
    gen = torch.Generator().manual_seed(1)
    x = make_input(kind, (3, *sample), gen)
    out = model(x)
    assert out.shape == (3, OUT[name])
    assert out.dtype == torch.float64
    assert torch.isfinite(out).all()
    # Batch of one gives the same row (no cross-sample mixing).
    torch.testing.assert_close(model(x[1:2]), out[1:2], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("model", "shapes"),
    [
        (McMahanMNISTCNN(), [(2, 784), (2, 28, 28), (2, 1, 28, 28)]),
        (ReddiEMNISTCNN(dropout=False), [(2, 784), (2, 28, 28), (2, 1, 28, 28)]),
        (SmallCNN(), [(2, 64), (2, 8, 8), (2, 1, 8, 8)]),
        (McMahanCIFARCNN(image_size=8), [(2, 192), (2, 3, 8, 8)]),
        (MLP(in_features=12, hidden=(4,)), [(2, 12), (2, 3, 4), (2, 2, 2, 3)]),
        (LogisticRegression(12, 3), [(2, 12), (2, 4, 3)]),
    ],
)
def test_any_sample_shape(model: nn.Module, shapes: list[tuple[int, ...]]) -> None:
    model = model.double()
    flat = torch.randn(shapes[0], dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ref = model(flat)
    for shape in shapes[1:]:
        torch.testing.assert_close(model(flat.reshape(shape)), ref, rtol=0, atol=0)


def test_wrong_sample_size_raises() -> None:
    with pytest.raises(RuntimeError):
        McMahanMNISTCNN()(torch.randn(2, 100))


def test_logistic_regression_by_hand() -> None:
    model = LogisticRegression(in_features=2, num_classes=2).double()
    with torch.no_grad():
        model.linear.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, -1.0]]))
        model.linear.bias.copy_(torch.tensor([0.5, -0.5]))
    x = torch.tensor([[[1.0, 1.0]], [[2.0, 0.0]]], dtype=torch.float64)  # [B=2, 1, 2]
    # row 1: [1+2+0.5, 3-1-0.5] = [3.5, 1.5]; row 2: [2+0+0.5, 6-0-0.5] = [2.5, 5.5]
    expected = torch.tensor([[3.5, 1.5], [2.5, 5.5]], dtype=torch.float64)
    torch.testing.assert_close(model(x), expected)


def test_mlp_structure_is_2nn() -> None:
    linears = [m for m in MLP().modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(784, 200), (200, 200), (200, 10)]
    assert sum(isinstance(m, nn.ReLU) for m in MLP().modules()) == 2


def test_mlp_layer_norm_count_and_names() -> None:
    # 199,210 + a LayerNorm weight and bias per hidden layer: 2*200 + 2*200 = 800
    model = MLP(norm="layer")
    assert n_params(model) == 200_010 == count_parameters(model)
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert [tuple(m.normalized_shape) for m in norms] == [(200,), (200,)]
    kinds = [type(m).__name__ for m in model.net]
    assert kinds == ["Linear", "LayerNorm", "ReLU", "Linear", "LayerNorm", "ReLU", "Linear"]
    assert "net.6.weight" in dict(model.named_parameters())  # the head FedPer / FedRep keep local
    assert model(torch.randn(3, 784)).shape == (3, 10)


def test_mlp_without_norm_is_unchanged() -> None:
    # the same parameter names and shapes as before the norm option (old checkpoints load)
    names = {n: tuple(p.shape) for n, p in MLP(norm=None).named_parameters()}
    assert names == {"net.0.weight": (200, 784), "net.0.bias": (200,), "net.2.weight": (200, 200),
                     "net.2.bias": (200,), "net.4.weight": (10, 200), "net.4.bias": (10,)}
    assert list(MLP().state_dict()) == list(MLP(norm=None).state_dict())
    torch.manual_seed(0)
    state = MLP().state_dict()
    MLP(norm=None).load_state_dict(state)  # strict


def test_mlp_layer_norm_vmaps() -> None:
    model = MLP(in_features=6, hidden=(5, 4), num_classes=3, norm="layer")
    params, buffers = stack_module_state([model, MLP(in_features=6, hidden=(5, 4), num_classes=3, norm="layer")])
    x = torch.randn(2, 7, 6)
    out = vmap(lambda p, b, xb: functional_call(model, (p, b), (xb,)))(params, buffers, x)
    assert out.shape == (2, 7, 3)


@pytest.mark.parametrize("norm", ["batch", "Layer", True, ""])
def test_mlp_norm_invalid(norm) -> None:
    with pytest.raises(ValueError, match=r"norm: .* is not one of \(None, 'layer'\)"):
        MLP(norm=norm)


def test_tf_same_pooling_alignment_by_hand() -> None:
    # 1x1x4x4 input with values 0..15 (row-major). TF SAME 3x3/2 on n=4: out=ceil(4/2)=2,
    # pad total = (2-1)*2+3-4 = 1, all of it after. Windows: rows {0,1,2} and {2,3,pad},
    # same for columns. Maxima: [0..2]x[0..2] -> 10; rows 0-2, cols 2-3 -> 11;
    # rows 2-3, cols 0-2 -> 14; rows 2-3, cols 2-3 -> 15.
    x = torch.arange(16, dtype=torch.float64).reshape(1, 1, 4, 4)
    expected = torch.tensor([[[[10.0, 11.0], [14.0, 15.0]]]], dtype=torch.float64)
    torch.testing.assert_close(_tf_same_max_pool_3x3_s2(x), expected)
    # Odd n=5: out=3, pad total = 2*2+3-5 = 2, one before and one after.
    # Windows on one axis: {pad,0,1}, {1,2,3}, {3,4,pad}; on a 1x5 row 0..4 -> 1, 3, 4.
    row = torch.arange(5, dtype=torch.float64).reshape(1, 1, 1, 5).expand(1, 1, 5, 5)
    out = _tf_same_max_pool_3x3_s2(row.contiguous())
    torch.testing.assert_close(out[0, 0, 0], torch.tensor([1.0, 3.0, 4.0], dtype=torch.float64))


def test_cifar_lrn_is_tf_lrn() -> None:
    # TF: b = a / (1 + (0.001/9) * sum_{|d|<=4} a_{c+d}^2)^0.75. Check one channel by hand.
    model = McMahanCIFARCNN(image_size=4).double()
    a = torch.arange(1.0, 13.0, dtype=torch.float64).reshape(1, 12, 1, 1)
    out = model.norm(a)
    # channel index 5 (value 6): window channels 1..9 -> values 2..10, sum of squares 384
    expected = 6.0 / (1.0 + 0.001 / 9 * 384.0) ** 0.75
    torch.testing.assert_close(out[0, 5, 0, 0], torch.tensor(expected, dtype=torch.float64))
    # channel 0 (value 1): window channels 0..4 -> 1..5, sum of squares 55
    expected0 = 1.0 / (1.0 + 0.001 / 9 * 55.0) ** 0.75
    torch.testing.assert_close(out[0, 0, 0, 0], torch.tensor(expected0, dtype=torch.float64))


def test_cifar_lrn_flag_changes_output() -> None:
    torch.manual_seed(0)
    with_lrn = McMahanCIFARCNN(image_size=8).double()
    without = McMahanCIFARCNN(image_size=8, lrn=False).double()
    without.load_state_dict(with_lrn.state_dict())
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64) * 30
    assert not torch.allclose(with_lrn(x), without(x))


def test_reddi_dropout_flag() -> None:
    drops = [m for m in ReddiEMNISTCNN().modules() if isinstance(m, nn.Dropout)]
    assert [d.p for d in drops] == [0.25, 0.5]
    assert not any(isinstance(m, nn.Dropout) for m in ReddiEMNISTCNN(dropout=False).modules())
    # Same parameter names either way, so checkpoints interchange.
    names = [n for n, _ in ReddiEMNISTCNN().named_parameters()]
    assert names == [n for n, _ in ReddiEMNISTCNN(dropout=False).named_parameters()]


def test_char_lstm_unrolled_matches_nn_lstm() -> None:
    torch.manual_seed(0)
    fused = CharLSTM(vocab_size=11, embed_dim=4, hidden=6, num_layers=2).double()
    unrolled = CharLSTM(vocab_size=11, embed_dim=4, hidden=6, num_layers=2, unrolled=True).double()
    unrolled.load_state_dict(fused.state_dict())
    x = torch.randint(0, 11, (3, 9), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(unrolled(x), fused(x), rtol=1e-12, atol=1e-12)


def test_char_lstm_one_step_by_hand() -> None:
    # vocab 2, embed 1, hidden 1, one layer, one time step; all LSTM weights zero except
    # biases: gates (i, f, g, o) pre-activations = b_ih + b_hh = (0, 0, 1, 0) (h0 = c0 = 0).
    # c = sigmoid(0)*0 + sigmoid(0)*tanh(1) = 0.5*tanh(1); h = sigmoid(0)*tanh(c) = 0.5*tanh(0.5*tanh(1)).
    # fc weight 2, bias [0, 1] -> logits [2h, 2h + 1].
    for unrolled in (False, True):
        m = CharLSTM(vocab_size=2, embed_dim=1, hidden=1, num_layers=1, unrolled=unrolled).double()
        with torch.no_grad():
            for p in m.parameters():
                p.zero_()
            m.lstm.bias_ih_l0.copy_(torch.tensor([0.0, 0.0, 0.5, 0.0]))
            m.lstm.bias_hh_l0.copy_(torch.tensor([0.0, 0.0, 0.5, 0.0]))
            m.fc.weight.fill_(2.0)
            m.fc.bias.copy_(torch.tensor([0.0, 1.0]))
        h = 0.5 * math.tanh(0.5 * math.tanh(1.0))
        expected = torch.tensor([[2 * h, 2 * h + 1]], dtype=torch.float64)
        torch.testing.assert_close(m(torch.tensor([[1]])), expected)


# ---------------------------------------------------------------- torch.func / vmap


def _stacked(name: str, kwargs: dict) -> tuple[list[nn.Module], dict, dict]:
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(build_model(name, **kwargs).double())
    params, buffers = stack_module_state(models)
    return models, params, buffers


@pytest.mark.parametrize("name", sorted(SPECS))
def test_vmap_functional_call_matches_loop(name: str) -> None:
    kwargs, sample, kind = SPECS[name]
    models, params, buffers = _stacked(name, kwargs)
    base = models[0]
    gen = torch.Generator().manual_seed(5)
    x = make_input(kind, (2, 3, *sample), gen)  # [K=2 clients, B=3, *sample]
    y = torch.randint(0, OUT[name], (2, 3), generator=gen)

    def loss_fn(p: dict, b: dict, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(base, (p, b), (xb,)), yb)

    out = vmap(lambda p, b, xb: functional_call(base, (p, b), (xb,)))(params, buffers, x)
    grads = vmap(grad(loss_fn))(params, buffers, x, y)
    for k, model in enumerate(models):
        torch.testing.assert_close(out[k], model(x[k]), rtol=1e-10, atol=1e-12)
        model.zero_grad()
        F.cross_entropy(model(x[k]), y[k]).backward()
        for pname, p in model.named_parameters():
            torch.testing.assert_close(grads[pname][k], p.grad, rtol=1e-10, atol=1e-12)
    # The two parameter sets differ, so the check would catch mixing them up.
    assert not torch.allclose(out[0], out[1])


def test_fused_lstm_raises_under_vmap() -> None:
    models, params, buffers = _stacked("char_lstm", {"vocab_size": 7, "embed_dim": 3, "hidden": 5})
    x = torch.randint(0, 7, (2, 3, 6))
    with pytest.raises(RuntimeError, match="lstm"):
        vmap(lambda p, b, xb: functional_call(models[0], (p, b), (xb,)))(params, buffers, x)


def test_dropout_under_vmap() -> None:
    models, params, buffers = _stacked("reddi_emnist_cnn", {})
    base = models[0]
    x = torch.randn(2, 3, 1, 28, 28, dtype=torch.float64)

    def fwd(p: dict, b: dict, xb: torch.Tensor) -> torch.Tensor:
        return functional_call(base, (p, b), (xb,))

    base.train()
    with pytest.raises(RuntimeError, match="randomness"):
        vmap(fwd)(params, buffers, x)
    out = vmap(fwd, randomness="different")(params, buffers, x)
    assert out.shape == (2, 3, 62)
    # Eval mode: deterministic and equal to the per-model outputs.
    base.eval()
    out = vmap(fwd)(params, buffers, x)
    for k, model in enumerate(models):
        torch.testing.assert_close(out[k], model.eval()(x[k]), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- registry and validation


def test_build_model_unknown_name_lists_names() -> None:
    with pytest.raises(ValueError, match="mcmahan_mnist_cnn") as err:
        build_model("resnet")
    assert "resnet" in str(err.value)


def test_build_model_passes_kwargs() -> None:
    model = build_model("mlp", in_features=5, hidden=[3], num_classes=2)
    assert isinstance(model, MLP)
    assert n_params(model) == 5 * 3 + 3 + 3 * 2 + 2


@pytest.mark.parametrize(
    ("factory", "arg"),
    [
        (lambda: LogisticRegression(in_features=0), "in_features"),
        (lambda: MLP(hidden=(200, -1)), "hidden"),
        (lambda: MLP(num_classes=2.5), "num_classes"),
        (lambda: McMahanMNISTCNN(in_channels=0), "in_channels"),
        (lambda: McMahanCIFARCNN(image_size=0), "image_size"),
        (lambda: ReddiEMNISTCNN(num_classes=True), "num_classes"),
        (lambda: CharLSTM(hidden=0), "hidden"),
        (lambda: SmallCNN(num_classes=-3), "num_classes"),
        (lambda: CharTransformer(d_model=10, num_heads=4), "num_heads: must divide d_model"),
    ],
)
def test_invalid_args_raise(factory, arg: str) -> None:
    with pytest.raises(ValueError, match=arg):
        factory()


def test_char_transformer_is_causal_and_reads_the_last_position() -> None:
    torch.manual_seed(0)
    m = CharTransformer(vocab_size=7, seq_len=6, d_model=8, num_layers=2, num_heads=2, d_ff=16).double()
    x = torch.randint(0, 7, (3, 6))
    every = m.forward_all(x)
    assert every.shape == (3, 6, 7)
    torch.testing.assert_close(m(x), every[:, -1], rtol=0, atol=1e-14)
    changed = x.clone()
    changed[:, 4] = (changed[:, 4] + 1) % 7  # a later character changes nothing before it
    after = m.forward_all(changed)
    torch.testing.assert_close(after[:, :4], every[:, :4], rtol=0, atol=1e-14)
    assert not torch.allclose(after[:, 4], every[:, 4])
    torch.testing.assert_close(m(x[:, :4]), every[:, 3], rtol=0, atol=1e-14)  # shorter inputs: the first positions
    with pytest.raises(ValueError, match="longer than seq_len=6"):
        m(torch.zeros(1, 7, dtype=torch.long))
