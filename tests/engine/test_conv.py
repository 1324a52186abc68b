"""Convolutions as unfold + matmul (lfed.engine.conv) and the vmap backend's choice of form.

The matmul form must be F.conv2d / F.conv1d, forward and backward, in float64 to round-off,
alone and under vmap over a cohort's stacked weights; the engine must train the same with
either form as the loop backend does, and leave the user's net as it was.
"""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad, vmap

from lfed.engine import CohortTrainer, StepRule
from lfed.engine.conv import choose_form, conv1d_matmul, conv2d_matmul, conv_forms
from lfed.models.zoo import McMahanCIFARCNN, McMahanMNISTCNN, ReddiEMNISTCNN, SmallCNN

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gpu_suite import PflCNN  # noqa: E402

D = torch.float64


def _rel(a, b):
    """Largest error relative to the reference's largest magnitude."""
    return float((a - b).detach().abs().max() / b.detach().abs().max().clamp_min(1e-300))


# (in channels, out channels, kernel, stride, padding, dilation, groups, input height, width)
CASES = {
    "SmallCNN.conv1": (1, 16, 3, 1, 1, 1, 1, 8, 8),
    "SmallCNN.conv2": (16, 32, 3, 1, 1, 1, 1, 4, 4),
    "McMahanMNISTCNN.conv1": (1, 32, 5, 1, 2, 1, 1, 28, 28),
    "McMahanCIFARCNN.conv2": (64, 64, 5, 1, 2, 1, 1, 6, 6),
    "ReddiEMNISTCNN.conv2": (32, 64, 3, 1, 0, 1, 1, 9, 9),
    "PflCNN.conv1": (3, 32, 3, 1, 0, 1, 1, 10, 10),
    "stride2": (4, 6, 3, 2, 1, 1, 1, 9, 8),
    "dilation2": (3, 5, 3, 1, 2, 2, 1, 9, 9),
    "groups2": (4, 6, 3, 1, 1, 1, 2, 7, 7),
    "depthwise": (4, 8, 3, 2, 0, 1, 4, 9, 7),
    "tuples": (2, 4, (3, 2), (2, 1), (1, 2), (2, 1), 2, 9, 8),
    "1x1": (5, 3, 1, 1, 0, 1, 1, 4, 4),
    "same-odd": (3, 4, 3, 1, "same", 2, 1, 7, 6),
    "same-even": (2, 4, (2, 4), 1, "same", 1, 2, 6, 7),  # torch pads the odd pixel after
    "valid": (2, 3, 3, 1, "valid", 1, 1, 6, 5),
}


def _case(name, batch=2, seed=0):
    C, O, k, s, p, d, g, H, W = CASES[name]
    gen = torch.Generator().manual_seed(seed)
    k = (k, k) if isinstance(k, int) else k
    x = torch.randn(batch, C, H, W, generator=gen, dtype=D)
    w = torch.randn(O, C // g, *k, generator=gen, dtype=D)
    b = torch.randn(O, generator=gen, dtype=D)
    return x, w, b, dict(stride=s, padding=p, dilation=d, groups=g)


def test_a_hand_computed_convolution():
    # out[i, j] = x[i, j] - x[i + 1, j + 1] + 0.5 = -4 + 0.5 on a 3x3 ramp (cross-correlation, as F.conv2d)
    x = torch.arange(9, dtype=D).view(1, 1, 3, 3)
    w = torch.tensor([[1.0, 0.0], [0.0, -1.0]], dtype=D).view(1, 1, 2, 2)
    out = conv2d_matmul(x, w, torch.tensor([0.5], dtype=D))
    assert torch.equal(out, torch.full((1, 1, 2, 2), -3.5, dtype=D))
    # stride 2 and padding 1: windows at (-1, -1), (-1, 1), (1, -1), (1, 1): 0 - 0, 0 - 2, 0 - 6, 4 - 8
    out = conv2d_matmul(x, w, None, stride=2, padding=1)
    assert torch.equal(out, torch.tensor([[[[0.0, -2.0], [-6.0, -4.0]]]], dtype=D))


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")  # torch's own, of the reference
@pytest.mark.parametrize("name", list(CASES))
def test_matmul_form_is_conv2d_forward_and_backward(name):
    x, w, b, kw = _case(name)
    x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
    for bias in (b, None):
        ref = F.conv2d(x, w, bias, **kw)
        got = conv2d_matmul(x, w, bias, **kw)
        assert got.shape == ref.shape and _rel(got, ref) < 1e-12
        cot = torch.randn(ref.shape, generator=torch.Generator().manual_seed(5), dtype=D)
        inputs = (x, w) if bias is None else (x, w, bias)  # gradients of the input, the weight and the bias
        for a, r in zip(torch.autograd.grad(got, inputs, cot), torch.autograd.grad(ref, inputs, cot)):
            assert _rel(a, r) < 1e-12
    # an unbatched image [C, H, W], as nn.Conv2d accepts
    with torch.no_grad():
        assert _rel(conv2d_matmul(x[0], w, b, **kw), F.conv2d(x[0], w, b, **kw)) < 1e-12


@pytest.mark.parametrize("make_net", [SmallCNN, McMahanMNISTCNN, McMahanCIFARCNN, ReddiEMNISTCNN, PflCNN])
def test_every_convolution_of_the_nets_lfed_ships(make_net):
    torch.manual_seed(0)
    convs = [m for m in make_net().double().modules() if isinstance(m, nn.Conv2d)]
    assert convs
    for m in convs:
        x = torch.randn(2, m.in_channels, 9, 9, dtype=D, requires_grad=True)
        ref = m(x)  # the module as torch computes it
        with conv_forms(m, lambda *_: "matmul"):
            got = m(x)
        assert _rel(got, ref) < 1e-12
        cot = torch.randn_like(ref)
        inputs = (x, m.weight, m.bias)
        for a, r in zip(torch.autograd.grad(got, inputs, cot), torch.autograd.grad(ref, inputs, cot)):
            assert _rel(a, r) < 1e-12


@pytest.mark.parametrize("name", ["SmallCNN.conv2", "PflCNN.conv1", "stride2", "dilation2", "groups2", "depthwise",
                                  "tuples", "same-even"])
def test_matmul_form_under_vmap_is_a_loop_of_conv2d_per_client(name):
    K = 3
    x0, w0, b0, kw = _case(name)
    gen = torch.Generator().manual_seed(1)
    X = torch.randn(K, *x0.shape, generator=gen, dtype=D)
    W = torch.randn(K, *w0.shape, generator=gen, dtype=D)
    Bs = torch.randn(K, *b0.shape, generator=gen, dtype=D)
    cot = torch.randn(K, *F.conv2d(x0, w0, b0, **kw).shape, generator=gen, dtype=D)

    def loss(conv):
        return lambda x, w, b, c: (conv(x, w, b, **kw) * c).sum()

    out = vmap(lambda x, w, b: conv2d_matmul(x, w, b, **kw))(X, W, Bs)
    grads = vmap(grad(loss(conv2d_matmul), argnums=(0, 1, 2)))(X, W, Bs, cot)
    for k in range(K):  # the reference: client k alone, ordinary autograd
        xk, wk, bk = (t[k].clone().requires_grad_() for t in (X, W, Bs))
        ref = F.conv2d(xk, wk, bk, **kw)
        assert _rel(out[k], ref) < 1e-12
        for g, r in zip(grads, torch.autograd.grad(ref, (xk, wk, bk), cot[k])):
            assert _rel(g[k], r) < 1e-12
    # the weight alone batched (one input for all clients: a term running the net on shared data)
    shared = vmap(lambda w, b: conv2d_matmul(x0, w, b, **kw))(W, Bs)
    for k in range(K):
        assert _rel(shared[k], F.conv2d(x0, W[k], Bs[k], **kw)) < 1e-12
    # the input alone batched (a term running every client's data through one shared row: the global model)
    one = vmap(lambda x: conv2d_matmul(x, w0, b0, **kw))(X)
    for k in range(K):
        assert _rel(one[k], F.conv2d(X[k], w0, b0, **kw)) < 1e-12


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 1, 1, 1), (2, 0, 2, 2), (1, "same", 3, 1), (1, "valid", 1, 3)])
def test_conv1d_matmul_is_conv1d(stride, padding, dilation, groups):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 6, 13, generator=gen, dtype=D, requires_grad=True)
    w = torch.randn(3 * groups, 6 // groups, 3, generator=gen, dtype=D, requires_grad=True)
    b = torch.randn(3 * groups, generator=gen, dtype=D, requires_grad=True)
    ref = F.conv1d(x, w, b, stride, padding, dilation, groups)
    got = conv1d_matmul(x, w, b, stride, padding, dilation, groups)
    assert got.shape == ref.shape and _rel(got, ref) < 1e-12
    cot = torch.randn(ref.shape, generator=gen, dtype=D)
    for a, r in zip(torch.autograd.grad(got, (x, w, b), cot), torch.autograd.grad(ref, (x, w, b), cot)):
        assert _rel(a, r) < 1e-12


@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
def test_conv_forms_computes_modules_in_the_matmul_form_and_puts_them_back(mode):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 4, 3, padding=(1, 2), padding_mode=mode), nn.ReLU()).double()
    conv1 = nn.Conv1d(4, 3, 3, padding=1, padding_mode=mode).double()
    x, x1 = torch.randn(2, 2, 6, 5, dtype=D), torch.randn(2, 4, 9, dtype=D)
    ref, ref1 = net(x), conv1(x1)
    seen = []

    def form(module, inp, weight):
        seen.append(type(module).__name__)
        return "matmul"

    with conv_forms(net, form), conv_forms(conv1, form):
        got, got1 = net(x), conv1(x1)
        assert "_conv_forward" in net[0].__dict__
    assert seen == ["Conv2d", "Conv1d"]
    assert _rel(got, ref) < 1e-12 and _rel(got1, ref1) < 1e-12
    assert "_conv_forward" not in net[0].__dict__ and "_conv_forward" not in conv1.__dict__
    with pytest.raises(RuntimeError, match="inside"), conv_forms(net, form):  # put back after an error too
        raise RuntimeError("inside")
    assert "_conv_forward" not in net[0].__dict__
    seen.clear()
    net(x)
    assert seen == []


def test_under_autocast_the_matmul_form_computes_in_autocasts_dtype_as_conv2d():
    x, w, b, kw = (t.float() if isinstance(t, torch.Tensor) else t for t in _case("groups2"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref, got = F.conv2d(x, w, b, **kw), conv2d_matmul(x, w, b, **kw)
    assert ref.dtype == got.dtype == torch.bfloat16
    # the same products of bfloat16 operands, summed in another order: round-off of bfloat16's 8 bits
    assert _rel(got.float(), ref.float()) < 2e-2
    exact = F.conv2d(x.bfloat16().double(), w.bfloat16().double(), b.bfloat16().double(), **kw)
    assert _rel(got.double(), exact) < 1e-2 and _rel(got.double(), F.conv2d(x.double(), w.double(), b.double(), **kw)) > 1e-4


def test_auto_form_is_a_rule_of_the_device():
    # native on both: the H100 run of 2026-11-26 timed the (F.unfold) matmul form 2.1x slower than native at K = 50
    assert choose_form(torch.device("cpu")) == "native"
    assert choose_form(torch.device("cuda", 0)) == "native"


@pytest.mark.parametrize("name", ["PflCNN.conv1", "stride2", "dilation2", "groups2"])
def test_matmul_form_under_vmap_and_grad_has_a_batching_rule_for_every_op(name):
    """No op of the matmul form (forward or backward) falls back to vmap's per-client loop: torch warns
    "There is a performance drop" when it does (a strided-view im2col did, through unfold_backward)."""
    import warnings

    x, w, b, kw = _case(name)
    ws, xs = torch.stack([w, w * 0.5]), torch.stack([x, x + 1])
    loss = lambda w, x: conv2d_matmul(x, w, b, **kw).pow(2).sum()  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.func.vmap(torch.func.grad(loss, argnums=(0, 1)))(ws, xs)


def _cohort(net, shape, K=3, n=7, classes=10, seed=0):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(K * n, *shape, generator=gen, dtype=D)
    Y = torch.randint(0, classes, (K * n,), generator=gen)
    idx = torch.randperm(K * n, generator=gen).view(K, n)
    return X, Y, idx


def _train(trainer, net, X, Y, idx, steps, rule=None):
    K, n = idx.shape
    w0 = trainer.layout.module_vector(net)
    return trainer.train(w0, X, Y, idx, torch.full((K,), n), steps, rule or StepRule(), 0.1, 3,
                         torch.Generator().manual_seed(4))


@pytest.mark.parametrize(
    "make_net,shape",
    [(SmallCNN, (1, 8, 8)), (lambda: PflCNN(image_size=8, dropout=False), (3, 8, 8)),
     (lambda: ReddiEMNISTCNN(num_classes=10), (1, 28, 28))],
    ids=["SmallCNN", "PflCNN", "ReddiEMNISTCNN"],
)
def test_both_forms_train_as_the_loop_backend(make_net, shape):
    torch.manual_seed(0)
    net = make_net().double().eval()  # eval: ReddiEMNISTCNN's dropout off, so the backends draw nothing
    X, Y, idx = _cohort(net, shape)
    steps = torch.tensor([3, 1, 2])  # stragglers: the last steps run on part of the cohort (eager)
    rule = StepRule(grad_scale=torch.tensor([1.0, 1.5, 0.5], dtype=D), decay=0.01)
    loop = _train(CohortTrainer(net, backend="loop"), net, X, Y, idx, steps, rule)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    for form in ("matmul", "native", "auto"):
        trainer = CohortTrainer(net, backend="vmap")
        trainer.conv_form = form
        got = _train(trainer, net, X, Y, idx, steps, rule)
        assert _rel(got.weights, loop.weights) < 1e-12 and _rel(got.loss, loop.loss) < 1e-12
        assert (got.weights[0] - trainer.layout.module_vector(net)).abs().max() > 1e-3  # it trained
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())
    assert not any("_conv_forward" in m.__dict__ for m in net.modules())


def test_the_recorded_step_runs_the_chosen_form_and_the_choice_is_kept():
    net = SmallCNN().double()
    X, Y, idx = _cohort(net, (1, 8, 8), K=4, n=6)
    steps = torch.full((4,), 4)
    results, graphs = {}, {}
    for form in ("matmul", "native"):
        for trace in (True, False):
            trainer = CohortTrainer(net, backend="vmap", trace=trace)
            trainer.conv_form = form
            results[form, trace] = _train(trainer, net, X, Y, idx, steps).weights
            if trace:
                (graphs[form],) = [g for g in trainer._traced.values() if g is not None]
        assert torch.equal(results[form, True], results[form, False])  # the replay is the eager step, bit for bit
    assert _rel(results["matmul", True], results["native", True]) < 1e-12

    def ops(graph):
        return [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]

    # the matmul form: no convolution at all; its products are batched over the cohort (4 clients)
    matmul_ops = ops(graphs["matmul"])  # each convolution's im2col is one gather of pixels (no im2col op)
    assert not any("convolution" in o for o in matmul_ops) and "aten.im2col.default" not in matmul_ops
    # (index_select under vmap is a gather: one more per convolution than the native graph's, the loss's)
    assert matmul_ops.count("aten.gather.default") - ops(graphs["native"]).count("aten.gather.default") == 2
    assert ops(graphs["native"]).count("aten.convolution.default") == 2
    bmm = [n for n in graphs["matmul"].graph.nodes if str(n.target) == "aten.bmm.default"]
    assert bmm and all(n.meta["val"].shape[0] == 4 for n in bmm)
    # "auto" takes the device's rule (on a CPU: native) for every convolution: the native graph, bit for bit
    trainer = CohortTrainer(net, backend="vmap")
    auto = _train(trainer, net, X, Y, idx, steps).weights
    (graph,) = [g for g in trainer._traced.values() if g is not None]
    assert torch.equal(auto, results["native", True])
    assert ops(graph).count("aten.convolution.default") == 2 and "aten.index_add.default" not in ops(graph)


def test_the_form_can_be_forced_by_the_environment(monkeypatch):
    net = SmallCNN().double()
    X, Y, idx = _cohort(net, (1, 8, 8), K=2, n=3)
    monkeypatch.setenv("LFED_CONV_FORM", "matmul")
    trainer = CohortTrainer(net, backend="vmap")
    _train(trainer, net, X, Y, idx, torch.full((2,), 1))
    (graph,) = trainer._traced.values()
    targets = [str(n.target) for n in graph.graph.nodes]
    assert "aten.convolution.default" not in targets and "aten.index_add.default" in targets  # the gather's backward
    monkeypatch.setenv("LFED_CONV_FORM", "fast")
    with pytest.raises(ValueError, match="LFED_CONV_FORM: 'fast'"):
        _train(CohortTrainer(net, backend="vmap"), net, X, Y, idx, torch.full((2,), 1))


def test_the_matmul_form_in_a_mixed_precision_round():
    from lfed.engine import round_precision

    torch.manual_seed(0)
    net = SmallCNN()
    X, Y, idx = (t.float() if t.is_floating_point() else t for t in _cohort(net, (1, 8, 8), K=3, n=6))
    steps = torch.full((3,), 4)
    got = {}
    with torch.autocast("cpu", dtype=torch.bfloat16), round_precision():
        for form, trace in (("matmul", True), ("matmul", False), ("native", True)):
            trainer = CohortTrainer(net, backend="vmap", trace=trace)
            trainer.conv_form = form
            got[form, trace] = _train(trainer, net, X, Y, idx, steps).weights
            if trace:
                assert [g is not None for g in trainer._traced.values()] == [True]
    full = _train(CohortTrainer(net, backend="vmap"), net, X, Y, idx, steps).weights
    assert got["matmul", True].dtype == torch.float32
    assert torch.equal(got["matmul", True], got["matmul", False])  # recorded under autocast, replayed bit for bit
    moved = (full - trainer.layout.module_vector(net)).abs().max()
    for w in (got["matmul", True], got["native", True]):  # both forms: bfloat16's round-off of the float32 step
        assert 0 < (w - full).abs().max() < 0.1 * moved


def test_the_activation_measurement_sees_the_form_the_step_runs():
    """The chunk's memory bound (CohortTrainer._saved_bytes) measures the form in use: the matmul form saves the
    unfolded input (kh * kw times the input of a 3x3 convolution) where the native form saves the input."""
    net = SmallCNN().double()
    X, Y, idx = _cohort(net, (1, 8, 8), K=2, n=6)
    positions = torch.arange(6).view(1, 1, 6).expand(2, 1, 6)
    saved = {}
    for form in ("native", "matmul"):
        trainer = CohortTrainer(net, backend="vmap")
        trainer.conv_form = form
        w0 = trainer.layout.module_vector(net)
        saved[form] = trainer._saved_bytes(w0, X, Y, idx, positions, torch.ones(2, 1, 6, dtype=torch.bool), 0)
    # in doubles: conv1 saves its columns [6, 9, 64] for the weight's gradient instead of its input [6, 1, 64],
    # conv2 its columns [6, 144, 16] instead of its input [6, 16, 16], and (its input needing a gradient) the
    # gather's pixel index, 9 * 16 int64 (conv1's input, the data, needs none: its gather saves nothing)
    assert saved["matmul"] - saved["native"] == 8 * (6 * 9 * 64 - 6 * 64) + 8 * (6 * 144 * 16 - 6 * 16 * 16) + 8 * 9 * 16
