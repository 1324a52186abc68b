"""FederatedDataModule with a user's own data: each wrong input gets a clear message at build()
(before any round), each right one works (issue 14, item 6)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import run_rounds
from PIL import Image
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule


class _Items(Dataset):
    def __init__(self, make, n=20):
        self.make, self.n = make, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.make(i)


def _build(train, test=None):
    return FederatedDataModule(train=train, test=test if test is not None else train, num_clients=2, partition="iid").build()


def test_pil_image_dataset_is_refused_naming_to_tensor():
    ds = _Items(lambda i: (Image.fromarray(np.full((4, 4), i, dtype=np.uint8)), i % 2))
    with pytest.raises(ValueError, match=r"train: the Dataset's inputs are PIL images .*transforms.ToTensor\(\)"):
        _build(ds)


def test_dict_samples_are_refused_naming_the_keys():
    ds = _Items(lambda i: {"image": torch.zeros(3), "label": i % 2})
    with pytest.raises(ValueError, match=r"train: item 0 of the Dataset is a dict with keys \['image', 'label'\].*\(x, y\)"):
        _build(ds)


def test_uint8_features_are_refused_with_the_conversion_to_make():
    x = torch.randint(0, 255, (20, 4), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"train: inputs of dtype torch.uint8.*x.float\(\) / 255"):
        _build((x, torch.arange(20) % 2))


@pytest.mark.parametrize(
    "empty",
    [(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)), TensorDataset(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)),
     _Items(lambda i: (torch.zeros(3), 0), n=0)],
    ids=["tensors", "TensorDataset", "Dataset"],
)
def test_an_empty_dataset_is_refused(empty):
    ok = (torch.randn(10, 3), torch.arange(10) % 2)
    with pytest.raises(ValueError, match=r"train: the dataset is empty \(0 examples\)"):
        _build(empty, ok)
    with pytest.raises(ValueError, match=r"test: the dataset is empty \(0 examples\)"):
        _build(ok, empty)


def test_random_augmentation_is_said_to_be_frozen():
    g = torch.Generator().manual_seed(0)
    ds = _Items(lambda i: (torch.full((3,), float(i)) + torch.randn(3, generator=g), i % 2))
    with pytest.warns(UserWarning, match=r"train: the Dataset returns a different input each time.*augmentation is frozen"):
        d = _build(ds, _Items(lambda i: (torch.full((3,), float(i)), i % 2)))
    assert d.train_x.shape == (20, 3)


def test_a_deterministic_dataset_of_numbers_and_arrays_works_without_warning(recwarn):
    ds = _Items(lambda i: (np.full(3, i, dtype=np.float32), np.int64(i % 3)))
    d = _build(ds)
    assert d.train_x.dtype == torch.float32 and d.train_y.dtype == torch.long and d.num_classes == 3
    assert not [w for w in recwarn if "different input" in str(w.message)]


def test_float_class_labels_given_as_python_ints_stay_classification_and_floats_become_regression():
    cls = _build(_Items(lambda i: (torch.zeros(2) + i, i % 2)))
    assert cls.task == "classification" and cls.train_y.dtype == torch.long
    reg = _build(_Items(lambda i: (torch.zeros(2) + i, float(i) / 2)))
    assert reg.task == "regression" and reg.train_y.dtype == torch.float32 and reg.train_y[3, 0] == 1.5


def test_a_dataset_module_trains_end_to_end():
    ds = _Items(lambda i: (torch.tensor([float(i % 2), 1.0 - i % 2]), i % 2), n=40)
    torch.manual_seed(0)
    m = FederatedModule(nn.Linear(2, 2), training=dict(client_lr=0.5, local_steps=5), fraction=1.0)
    trainer = run_rounds(m, FederatedDataModule(train=ds, test=ds, num_clients=2, partition="iid", holdout_fraction=0.0),
                         5, evaluate_every=5)
    assert float(trainer.callback_metrics["test/acc"]) == 1.0
