"""data.invert_pixels (issue 39): the clients train and are evaluated on 1 - x, checked by hand on tiny tensors on
both backends, refused where 1 - x is no image, and on LEAF FEMNIST (white background 1.0) gives ink = 1."""

from __future__ import annotations

import pytest
import torch
from conftest import DATA_DIR, REQUIRE_DATA, missing_data_outcome, run_rounds
from torch import nn
from torch.func import functional_call

from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule

BACKENDS = ["vmap", "loop"]
needs_data = pytest.mark.skipif(missing_data_outcome(DATA_DIR, REQUIRE_DATA) is not None and not REQUIRE_DATA,
                                reason=(missing_data_outcome(DATA_DIR, False) or ("", ""))[1])


def pixels(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 2, 2, generator=g, dtype=torch.float64) * 0.3 + 0.7  # mostly "white", as LEAF's
    y = torch.randint(0, 3, (n,), generator=g)
    return x, y


def data(x, y, invert):
    return FederatedDataModule.from_tensors(x[:32], y[:32], x[32:], y[32:], num_clients=4, partition="iid",
                                            holdout_fraction=0.25, seed=0, invert_pixels=invert)


def module(backend):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3)).double()
    return FederatedModule(net, algorithm="fedavg", fraction=1.0, training=dict(client_lr=0.5, batch_size=None, local_steps=1),
                           engine=dict(backend=backend), seed=1, evaluation=dict(round_local_accuracy=False))


@pytest.mark.parametrize("backend", BACKENDS)
def test_invert_pixels_trains_on_one_minus_x_by_hand(backend):
    x, y = pixels()
    dm = data(x, y, True)
    d = dm.build()
    assert torch.equal(d.train_x, 1 - x[:32]) and torch.equal(d.test_x, 1 - x[32:])
    assert torch.equal(d.client_index, data(x, y, False).build().client_index)  # the same partition and splits
    m = module(backend)
    w0 = {n: p.detach().clone() for n, p in m.net.named_parameters()}
    run_rounds(m, dm, rounds=1)
    # by hand: one full-batch step from w0 on each client's 1 - x, averaged with weights n_k / n
    expected = {n: torch.zeros_like(p) for n, p in w0.items()}
    sizes = d.client_sizes.double()
    for k in range(4):
        idx = d.client_index[k, : int(d.client_sizes[k])]
        w = {n: p.clone().requires_grad_(True) for n, p in w0.items()}
        loss = nn.functional.cross_entropy(functional_call(m.net, w, (1 - x[idx],)), y[idx])
        grads = torch.autograd.grad(loss, list(w.values()))
        for (n, p), g in zip(w0.items(), grads):
            expected[n] += sizes[k] / sizes.sum() * (p - 0.5 * g)
    got = dict(m.net.named_parameters())
    for n in w0:
        torch.testing.assert_close(got[n].detach(), expected[n], atol=1e-13, rtol=0)
    raw = module(backend)
    run_rounds(raw, data(x, y, False), rounds=1)
    assert not torch.allclose(dict(raw.net.named_parameters())["1.weight"], got["1.weight"])  # the raw pixels differ


def test_invert_pixels_is_part_of_the_dataset_key_and_a_shared_load_is_shared_by_key():
    from lfed.lightning.datamodule import share_datasets

    a, a2, b = (FederatedDataModule(dataset="digits", invert_pixels=True),
                FederatedDataModule(dataset="digits", invert_pixels=True), FederatedDataModule(dataset="digits"))
    assert a.dataset_key() == a2.dataset_key() != b.dataset_key()  # runs of one group (one pooled dataset) cannot mix them
    share_datasets([a, a2, b])
    assert a._load() is a2._load() and b._load() is not a._load()
    assert torch.equal(a._load().train_x, 1 - b._load().train_x) and float(b._load().train_x.min()) >= 0


@pytest.mark.parametrize("x, match", [(torch.zeros(8, 3, dtype=torch.long), "not pixels"),
                                      (torch.full((8, 3), 2.0), "not \\[0, 1\\]"),
                                      (torch.full((8, 3), -0.5), "not \\[0, 1\\]")])
def test_invert_pixels_refuses_inputs_that_are_no_image_in_0_1(x, match):
    dm = FederatedDataModule.from_tensors(x, torch.arange(8) % 2, x, torch.arange(8) % 2, num_clients=2,
                                          partition="iid", invert_pixels=True)
    with pytest.raises(ValueError, match=f"invert_pixels.*{match}"):
        dm.build()


def test_invert_pixels_is_in_the_data_fingerprint_so_a_resume_across_it_is_refused():
    from lfed.state.fingerprint import data_fingerprint

    x, y = pixels()
    from lfed.state.fingerprint import verify_fingerprint

    inv, raw = data_fingerprint(data(x, y, True)), data_fingerprint(data(x, y, False))
    assert inv["data.invert_pixels"] is True and raw["data.invert_pixels"] is False
    assert {k: v for k, v in inv.items() if k != "data.invert_pixels"} == {k: v for k, v in raw.items() if k != "data.invert_pixels"}
    with pytest.raises(ValueError, match="data.invert_pixels: checkpoint True, this run False"):
        verify_fingerprint(inv, raw)


def test_invert_pixels_must_be_a_bool():
    with pytest.raises(ValueError, match="invert_pixels"):
        FederatedDataModule(dataset="digits", invert_pixels="yes")


@needs_data
def test_femnist_inverted_has_ink_one_as_emnist():
    raw = FederatedDataModule(dataset="femnist", data_dir=str(DATA_DIR), num_clients=105, partition="natural").build()
    inv = FederatedDataModule(dataset="femnist", data_dir=str(DATA_DIR), num_clients=105, partition="natural",
                              invert_pixels=True).build()
    assert float(raw.train_x.mean()) > 0.9  # LEAF: 1.0 = white background
    assert float(inv.train_x.mean()) < 0.1  # ink = 1 on a background of 0, as lfed's mnist / emnist
    assert torch.equal(inv.train_x, 1 - raw.train_x) and torch.equal(inv.test_x, 1 - raw.test_x)
    assert torch.equal(inv.client_index, raw.client_index) and torch.equal(inv.holdout_index, raw.holdout_index)


def test_a_datamodule_state_of_the_raw_pixels_is_refused_by_an_inverting_one():
    a = FederatedDataModule("digits", num_clients=10, partition="iid", seed=0)
    b = FederatedDataModule("digits", num_clients=10, partition="iid", seed=0, invert_pixels=True)
    b.load_state_dict(b.state_dict())  # the same data loads
    with pytest.raises(ValueError, match="data.invert_pixels: checkpoint False, this run True"):
        b.load_state_dict(a.state_dict())
