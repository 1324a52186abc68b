"""lfed.data.augment: every local step's batch transformed on the device with per-example draws from the round's
seed; by hand, the same on both backends, in chunks and in a grid's merged engine call, and refused where it cannot
apply."""

import pytest
import torch
from test_trainer import _clients

from lfed.core.lockstep import merge_jobs
from lfed.data.augment import Compose, HorizontalFlip, RandomCrop, build_augmentation
from lfed.data.federated import FederatedDataset
from lfed.engine import CohortTrainer, StepRule
from lfed.engine.job import TrainJob
from lfed.models import ResNet20


def test_random_crop_by_hand():
    x = torch.arange(1.0, 10.0).view(1, 1, 3, 3)  # one 3x3 image: 1..9
    crop = RandomCrop(padding=1)
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1))
    for i in range(3):
        for j in range(3):
            got = crop.apply(x, {"crop": torch.tensor([[i, j]])})
            assert torch.equal(got, padded[..., i : i + 3, j : j + 3])
    assert torch.equal(crop.apply(x, {"crop": torch.tensor([[1, 1]])}), x)  # the centre: the image itself
    assert torch.equal(crop.apply(x, {"crop": torch.tensor([[0, 0]])})[0, 0, 0], torch.tensor([0.0, 0.0, 0.0]))
    # leading dimensions [K, B]: each example its own window
    xs = torch.randn(2, 3, 1, 4, 4)
    off = torch.randint(0, 3, (2, 3, 2))
    got = crop.apply(xs, {"crop": off})
    for k in range(2):
        for b in range(3):
            i, j = off[k, b].tolist()
            p = torch.nn.functional.pad(xs[k, b], (1, 1, 1, 1))
            assert torch.equal(got[k, b], p[:, i : i + 4, j : j + 4])


def test_flip_by_hand_and_draws_differ_per_client_step_and_example():
    x = torch.randn(2, 3, 2, 4, 4)
    flip = torch.tensor([[True, False, True], [False, False, True]])
    got = HorizontalFlip().apply(x, {"flip": flip})
    for k in range(2):
        for b in range(3):
            assert torch.equal(got[k, b], x[k, b].flip(-1) if flip[k, b] else x[k, b])
    aug = build_augmentation("crop_flip")
    a = aug.draw((4, 5, 8), (1, 8, 8), torch.Generator().manual_seed(0))
    b = aug.draw((4, 5, 8), (1, 8, 8), torch.Generator().manual_seed(0))
    assert all(torch.equal(a[k], b[k]) for k in a)  # seeded: the same draws again
    crops = a["0.crop"]
    assert crops.min() == 0 and crops.max() == 8  # offsets over {0..2p}
    assert not torch.equal(crops[0], crops[1]) and not torch.equal(crops[:, 0], crops[:, 1])  # clients, steps differ
    assert 0.3 < a["1.flip"].double().mean() < 0.7


def _cohort():
    torch.manual_seed(0)
    X, Y = torch.randn(40, 1, 8, 8, dtype=torch.float64), torch.randint(0, 10, (40,))
    idx, sizes = _clients([11, 6, 7, 5], 40)
    return X, Y, idx, sizes


def test_both_backends_and_any_chunking_see_the_same_draws(one_thread):  # chunks bit for bit: one thread (docs/reproducibility.md)
    X, Y, idx, sizes = _cohort()
    net = ResNet20(in_channels=1, width=4).double()
    aug = Compose([RandomCrop(2), HorizontalFlip()])
    steps = torch.tensor([3, 1, 2, 0])
    out = {}
    for backend, chunk in (("vmap", None), ("vmap", 1), ("loop", None)):
        tr = CohortTrainer(net, backend=backend, chunk_size=chunk)
        w0 = tr.layout.module_vector(net)
        out[backend, chunk] = tr.train(w0, X, Y, idx, sizes, steps, StepRule(), 0.1, 4, torch.Generator().manual_seed(7),
                                       augment=(aug, torch.Generator().manual_seed(3)))
    a = out["vmap", None]
    assert torch.equal(a.weights, out["vmap", 1].weights)
    assert (a.weights - out["loop", None].weights).abs().max() < 1e-12
    tr = CohortTrainer(net, backend="vmap")
    plain = tr.train(tr.layout.module_vector(net), X, Y, idx, sizes, steps, StepRule(), 0.1, 4, torch.Generator().manual_seed(7))
    assert (plain.weights - a.weights).abs().max() > 1e-3  # the augmentation changed what was trained on


def test_a_grids_merged_call_gives_each_run_its_own_draws():
    X, Y, idx, sizes = _cohort()
    net = ResNet20(in_channels=1, width=4, norm="group").double()
    aug = build_augmentation("crop_flip")
    engine = CohortTrainer(net, backend="vmap")
    w0 = engine.layout.module_vector(net)

    def job(rows, steps, seed):
        return TrainJob(w0, X, Y, idx[rows], sizes[rows], torch.tensor(steps), StepRule(), 0.1, 4,
                        torch.Generator().manual_seed(seed), augment=(aug, torch.Generator().manual_seed(100 + seed)))

    alone = [job([0, 1], [3, 2], 1).train(engine), job([2, 3], [1, 2], 2).train(engine)]
    merged = merge_jobs([job([0, 1], [3, 2], 1), job([2, 3], [1, 2], 2)]).train(engine)
    torch.testing.assert_close(merged.weights, torch.cat([r.weights for r in alone]), atol=1e-12, rtol=0)


def test_the_setting_is_checked_before_round_0():
    with pytest.raises(ValueError, match=r"augment: 'crops' is not one of none, crop_flip, flip, crop .*did you mean 'crop'"):
        FederatedDataset(dataset="digits", augment="crops")
    x, y = torch.randn(50, 6), torch.randint(0, 2, (50,))
    data = FederatedDataset.from_tensors(x, y, x, y, num_clients=5, augment="flip")
    with pytest.raises(ValueError, match=r"data.augment: HorizontalFlip transforms images \[C, H, W\]; the inputs are \[6\]"):
        data.build()
    with pytest.raises(ValueError, match="padding: an integer >= 0"):
        RandomCrop(-1)
    assert FederatedDataset(dataset="digits", augment="none").augment is None
    # a class by its dotted path, built with its defaults (--data.augment lfed.data.augment.HorizontalFlip)
    assert isinstance(build_augmentation("lfed.data.augment.HorizontalFlip"), HorizontalFlip)
    with pytest.raises(ValueError, match="augment: 'lfed.data.augment.Sideways' does not import"):
        build_augmentation("lfed.data.augment.Sideways")
    with pytest.raises(ValueError, match="augment: 'torch.nn.Linear' is not an lfed.data.augment.Augmentation subclass"):
        build_augmentation("torch.nn.Linear")


class _Recorded(Compose):
    """crop_flip that keeps every draw it makes (in ``log``)."""

    def __init__(self, log):
        super().__init__([RandomCrop(2), HorizontalFlip()])
        self.__dict__["_log"] = log

    def draw(self, lead, image, generator):
        out = super().draw(lead, image, generator)
        self._log.append({k: v.clone() for k, v in out.items()})
        return out


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_each_round_draws_its_own_augmentations_and_a_seed_draws_them_again(backend):
    """The draws come from (seed, round, "augment"): two rounds of one run draw differently (the same cohort and
    schedule shape, so a draw that ignored the round would repeat itself), and a second run of the same seed draws the
    same ones round for round; another seed draws others."""
    from lfed.core.algorithm import LocalTraining
    from lfed.core.fit import fit_run
    from lfed.core.settings import Engine, build_run
    from lfed.lightning.datamodule import FederatedDataModule

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 1, 6, 6, generator=g), torch.arange(24) % 3

    def draws(seed):
        log = []
        data = FederatedDataModule.from_tensors(x, y, x, y, num_clients=3, partition="iid", holdout_fraction=0.0,
                                                augment=_Recorded(log))
        torch.manual_seed(0)
        run = build_run(net=torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(36, 3)), fraction=1.0,
                        training=LocalTraining(client_lr=0.05, batch_size=4, local_steps=2), seed=seed,
                        engine=Engine(backend=backend))
        fit_run(run, data, 3)
        return log

    first, again, other = draws(1), draws(1), draws(2)
    assert len(first) == 3 and all(d["0.crop"].shape == (3, 2, 4, 2) for d in first)  # [K, T, B] every round
    for a, b in ((first[0], first[1]), (first[1], first[2]), (first[0], first[2])):
        assert not torch.equal(a["0.crop"], b["0.crop"]) and not torch.equal(a["1.flip"], b["1.flip"])
    for a, b in zip(first, again):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(first[0]["0.crop"], other[0]["0.crop"])
