"""lfed.models.resnet: exact parameter counts, both norms, and the vmap backend equal to the loop backend in float64
(BatchNorm's running statistics each client's own row; tests/engine/test_norm.py checks the mechanism by hand)."""

import pytest
import torch
from test_trainer import _clients

from lfed.engine import CohortTrainer, StepRule
from lfed.models import ResNet18, ResNet20
from lfed.models.zoo import count_parameters


@pytest.mark.parametrize(("model", "expected"), [
    # stem 3*16*9 + 2*16; stage 1: 3 blocks of 2 * (16*16*9 + 2*16) = 3 * 4,672; stage 2: first block 16*32*9 + 32*32*9
    # + 4*32 + shortcut 16*32 + 2*32 = 14,528, then 2 * 2 * (32*32*9 + 64) = 37,120; stage 3: 57,728 + 2 * 147,712;
    # fc 64*10 + 10  (He et al. 2016, §4.2: 0.27M)
    (lambda: ResNet20(), 272_474),
    (lambda: ResNet20(in_channels=1), 272_474 - 2 * 16 * 9),
    (lambda: ResNet20(norm="group"), 272_474),  # GroupNorm: the same affine parameters
    # option A (He et al.'s CIFAR network): no projection, 16*32 + 2*32 + 32*64 + 2*64 = 2,752 fewer
    (lambda: ResNet20(shortcut="identity"), 269_722),
    (lambda: ResNet20(in_channels=1, shortcut="identity"), 269_722 - 2 * 16 * 9),
    (lambda: ResNet20(norm="group", shortcut="identity"), 269_722),
    (lambda: ResNet18(num_classes=1000, stem="imagenet"), 11_689_512),  # torchvision's count
    (lambda: ResNet18(), 11_173_962),  # 3x3 stem (3*64*9 instead of 3*64*49), 10 classes
    (lambda: ResNet18(norm="group"), 11_173_962),
])
def test_parameter_counts(model, expected):
    assert count_parameters(model()) == expected


def test_bad_settings_name_the_argument():
    with pytest.raises(ValueError, match="depth: 6n"):
        ResNet20(depth=21)
    with pytest.raises(ValueError, match="norm: 'layer' is not one of"):
        ResNet20(norm="layer")
    with pytest.raises(ValueError, match="groups: 3 groups must divide"):
        ResNet20(norm="group", groups=3)
    with pytest.raises(ValueError, match="stem:"):
        ResNet18(stem="tiny")
    with pytest.raises(ValueError, match=r"shortcut: 'zero' is not one of \('projection', 'identity'\)"):
        ResNet20(shortcut="zero")


def test_option_a_shortcut_by_hand():
    """He et al. 2016's option A where a stage halves the map and doubles the channels: the input's every second
    pixel, then zero channels; identity shortcuts elsewhere; no shortcut parameters."""
    from lfed.models.resnet import PadShortcut

    net = ResNet20(in_channels=1, depth=8, width=2, shortcut="identity")
    kinds = [type(b.shortcut).__name__ for b in net.blocks]
    assert kinds == ["Identity", "PadShortcut", "PadShortcut"]  # one block per stage at depth 8
    assert not any("shortcut" in n for n, _ in net.named_parameters())
    x = torch.arange(2 * 2 * 5 * 5, dtype=torch.float64).view(2, 2, 5, 5)
    got = PadShortcut(2, 4, 2)(x)
    assert got.shape == (2, 4, 3, 3)  # ceil(5 / 2): the stride-2 convolution's map
    for b in range(2):
        for c in range(2):
            for i in range(3):
                for j in range(3):
                    assert got[b, c, i, j] == x[b, c, 2 * i, 2 * j]
    assert torch.equal(got[:, 2:], torch.zeros(2, 2, 3, 3, dtype=torch.float64))
    block = net.blocks[1]  # the block's output: relu(bn2(conv2(relu(bn1(conv1 x)))) + shortcut x)
    h = torch.randn(3, 2, 6, 6)
    with torch.no_grad():
        main = block.bn2(block.conv2(block.bn1(block.conv1(h)).relu()))
        torch.testing.assert_close(block(h), (main + torch.cat([h[..., ::2, ::2], torch.zeros(3, 2, 3, 3)], 1)).relu(),
                                   rtol=0, atol=0)


@pytest.mark.parametrize("make", [lambda: ResNet20(in_channels=1, width=4), lambda: ResNet20(in_channels=1, width=4, norm="group"),
                                  lambda: ResNet20(in_channels=1, width=4, shortcut="identity"),
                                  lambda: ResNet18(in_channels=1)], ids=["resnet20-bn", "resnet20-gn", "resnet20-a-bn", "resnet18-bn"])
def test_vmap_equals_loop_in_float64(make):
    torch.manual_seed(0)
    net = make().double()
    # 16x16: ResNet-18's last stage is 2x2, so a partial batch of 2 still normalises over 8 numbers (over 2, BatchNorm's
    # 1/√σ² amplifies round-off to 1e-7 on both backends alike: a conditioning, not a difference of the maths)
    X, Y = torch.randn(20, 1, 16, 16, dtype=torch.float64), torch.randint(0, 10, (20,))
    idx, sizes = _clients([7, 5, 6], 20)  # partial batches of B = 4
    steps = torch.tensor([2, 1, 2])
    out = {}
    for backend in ("vmap", "loop"):
        tr = CohortTrainer(net, backend=backend)
        w0 = tr.layout.module_vector(net)
        out[backend] = tr.train(w0, X, Y, idx, sizes, steps, StepRule(), 0.05, 4, torch.Generator().manual_seed(1))
    a, b = out["vmap"], out["loop"]
    assert (a.weights - b.weights).abs().max() < 1e-11 and (a.loss - b.loss).abs().max() < 1e-11
    assert (a.buffers is None) == (b.buffers is None) == (not any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules()))
    for name, value in (b.buffers or {}).items():
        assert (a.buffers[name] - value).abs().max() < 1e-11, name


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_resnet18_trains_through_lfed_fit_on_the_vmap_backend(norm, tmp_path):
    from conftest import REPO

    from lfed.lightning.cli import run_cli

    cli = run_cli(["fit", "--config", str(REPO / "configs" / "resnet_synthetic.yaml"), "--model.net.class_path=lfed.models.ResNet18",
                   f"--model.net.init_args.norm={norm}", "--trainer.max_steps=1", "--model.fraction=0.2",
                   "--model.training.local_steps=1", "--model.training.batch_size=8", "--trainer.logger=false",
                   "--trainer.enable_progress_bar=false", "--data.holdout_fraction=0",
                   f"--trainer.default_root_dir={tmp_path}"])
    assert cli.trainer.global_step == 1 and cli.model.engine.backend == "vmap"
    assert isinstance(cli.model.net, ResNet18)
    assert any(isinstance(m, torch.nn.BatchNorm2d if norm == "batch" else torch.nn.GroupNorm) for m in cli.model.net.modules())
    assert cli.model.data.augment is not None  # the config's crop and flip, redrawn every step
