"""Tests for lfed.data.datasets and lfed.data.leaf on the real shared data (SOURCES.md)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
from pathlib import Path

import pytest
import torch
from conftest import DATA_DIR, REQUIRE_DATA, missing_data_outcome

from lfed.data.datasets import DATASETS, load_dataset, resolve_data_dir
from lfed.data.leaf import ALL_LETTERS
from lfed.data.tensors import DatasetTensors, resolve_cache_dir, validate_labels

DATA = Path(os.environ["LFED_TEST_DATA"]) if "LFED_TEST_DATA" in os.environ else DATA_DIR  # LFED_DATA_DIR's default
# skipped without the real datasets, except under LFED_REQUIRE_DATA=1 (CI), where they run and fail
needs_data = pytest.mark.skipif(missing_data_outcome(DATA, REQUIRE_DATA) is not None and not REQUIRE_DATA,
                                reason=(missing_data_outcome(DATA, False) or ("", ""))[1])
IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# SOURCES.md: MNIST class counts
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LFED_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def mnist() -> DatasetTensors:
    with pytest.MonkeyPatch.context() as mp:
        cache = Path(os.environ.get("TMPDIR", "/tmp")) / f"lfed-test-cache-{os.getpid()}"
        mp.setenv("LFED_CACHE_DIR", str(cache))
        try:
            yield load_dataset("mnist", DATA)
        finally:
            shutil.rmtree(cache, ignore_errors=True)


# --------------------------------------------------------------------------- basics
def test_validate_labels() -> None:
    validate_labels(torch.tensor([0, 9, 3]), 10, "ok")
    with pytest.raises(ValueError, match=r"mnist train: label 10 is outside \[0, 10\)"):
        validate_labels(torch.tensor([0, 10, 3]), 10, "mnist train")
    with pytest.raises(ValueError, match="custom: label -1"):
        validate_labels(torch.tensor([-1, 2]), 10, "custom")
    with pytest.raises(ValueError, match="integer"):
        validate_labels(torch.tensor([0.0, 1.0]), 10, "floats")
    with pytest.raises(ValueError, match="num_classes"):
        validate_labels(torch.tensor([0]), 0, "zero classes")


def test_dataset_tensors_checks_shapes_and_labels() -> None:
    x = torch.zeros(3, 1, 2, 2)
    with pytest.raises(ValueError, match="3 examples but train_y has 2"):
        DatasetTensors("toy", x, torch.zeros(2, dtype=torch.long), x, torch.zeros(3, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="toy test: label 5"):
        DatasetTensors("toy", x, torch.zeros(3, dtype=torch.long), x, torch.tensor([0, 5, 1]), 2)


def test_unknown_name_lists_datasets() -> None:
    with pytest.raises(ValueError, match="digits.*mnist.*fashion_mnist.*cifar10.*femnist.*shakespeare"):
        load_dataset("imagenet")
    assert DATASETS == ("digits", "mnist", "fashion_mnist", "cifar10", "cifar100", "emnist", "femnist",
                        "shakespeare", "cifar_synthetic", "synthetic")


def test_cifar_synthetic_is_cifar_shaped_and_the_same_every_time() -> None:
    a, b = load_dataset("cifar_synthetic"), load_dataset("cifar_synthetic")
    assert a.train_x.shape == (2500, 3, 32, 32) and a.test_x.shape == (500, 3, 32, 32) and a.num_classes == 10
    assert a.train_x.dtype == torch.float32 and 0 < float(a.train_x.min()) and float(a.train_x.max()) < 1
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    counts = torch.bincount(torch.cat([a.train_y, a.test_y]), minlength=10)
    assert counts.tolist() == [300] * 10  # balanced over both splits
    # an image is its class's pattern plus noise: the class means differ far more than the noise of a mean allows
    means = torch.stack([a.train_x[a.train_y == c].mean(0) for c in range(10)])
    assert float((means[0] - means[1]).abs().mean()) > 0.02


def test_resolve_dirs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert resolve_data_dir(str(tmp_path)) == tmp_path
    monkeypatch.setenv("LFED_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir(None) == tmp_path / "env"
    monkeypatch.delenv("LFED_DATA_DIR")
    assert resolve_data_dir(None) == Path("~/.cache/lfed").expanduser()
    assert resolve_cache_dir() == tmp_path / "cache"  # the autouse fixture's LFED_CACHE_DIR


def test_digits_stratified_fixed_split() -> None:
    d = load_dataset("digits")
    assert d.train_x.shape[1:] == (1, 8, 8) and d.train_x.dtype == torch.float32
    assert float(d.train_x.min()) == 0.0 and float(d.train_x.max()) == 1.0  # pixels 0..16 divided by 16
    # class sizes of sklearn digits; test share floor(0.2 n_c + 0.5):
    # 178->36 182->36 177->35 183->37 181->36 182->36 181->36 179->36 174->35 180->36 (total 359)
    sizes = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert torch.bincount(d.test_y, minlength=10).tolist() == [36, 36, 35, 37, 36, 36, 36, 36, 35, 36]
    assert (torch.bincount(d.train_y, minlength=10) + torch.bincount(d.test_y, minlength=10)).tolist() == sizes
    again = load_dataset("digits")
    assert torch.equal(again.test_x, d.test_x) and torch.equal(again.train_y, d.train_y)


# --------------------------------------------------------------------------- MNIST family
@needs_data
def test_mnist_shared_layout(mnist: DatasetTensors) -> None:
    assert mnist.train_x.shape == (60000, 1, 28, 28) and mnist.test_x.shape == (10000, 1, 28, 28)
    assert mnist.train_x.dtype == torch.float32 and mnist.train_y.dtype == torch.long
    assert mnist.train_y[:8].tolist() == [5, 0, 4, 1, 9, 2, 1, 3]  # the well-known start (SOURCES.md)
    assert torch.bincount(mnist.train_y).tolist() == MNIST_TRAIN_COUNTS
    assert torch.bincount(mnist.test_y).tolist() == MNIST_TEST_COUNTS
    # By hand: the first training image is bytes 16 .. 16 + 784 of the decompressed IDX file, / 255.
    with gzip.open(DATA / "mnist" / "train-images-idx3-ubyte.gz", "rb") as fh:
        raw = fh.read(16 + 784)[16:]
    expected = torch.tensor(list(raw), dtype=torch.float32).div(255).reshape(1, 28, 28)
    assert torch.equal(mnist.train_x[0], expected)
    assert mnist.num_classes == 10 and mnist.train_groups is None


@needs_data
def test_fashion_mnist_from_torchvision_gz_layout(tmp_path: Path, _cache: Path) -> None:
    raw = tmp_path / "data" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for f in IDX:
        (raw / f"{f}.gz").symlink_to(DATA / "fashion_mnist" / f"{f}.gz")
    d = load_dataset("fashion_mnist", tmp_path / "data")
    assert d.train_x.shape == (60000, 1, 28, 28)
    assert torch.bincount(d.train_y).tolist() == [6000] * 10  # SOURCES.md: 6000 per class
    assert torch.bincount(d.test_y).tolist() == [1000] * 10
    assert d.train_y[0] == 9  # an ankle boot first
    # decompressed once into a torchvision root in the cache, nothing written beside the data
    assert len(list(_cache.glob("torchvision/fashion_mnist-*/FashionMNIST/raw/train-images-idx3-ubyte"))) == 1
    assert sorted(p.name for p in raw.iterdir()) == sorted(f"{f}.gz" for f in IDX)


@needs_data
def test_mnist_from_decompressed_torchvision_layout(tmp_path: Path, _cache: Path, mnist: DatasetTensors) -> None:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for f in IDX:
        with gzip.open(DATA / "mnist" / f"{f}.gz", "rb") as src, open(raw / f, "wb") as dst:
            shutil.copyfileobj(src, dst)
    d = load_dataset("mnist", tmp_path)
    assert torch.equal(d.train_y, mnist.train_y) and torch.equal(d.test_x, mnist.test_x)
    assert not _cache.exists()  # read in place, no cache needed


def test_mnist_missing_files_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("mnist", tmp_path)
    msg = str(err.value)
    for needle in ("train-images-idx3-ubyte.gz", str(tmp_path / "mnist"), str(tmp_path / "MNIST" / "raw"),
                   "download=True", "LFED_DATA_DIR"):
        assert needle in msg


@needs_data
def test_mnist_partial_files_error_names_the_missing_one(tmp_path: Path) -> None:
    (tmp_path / "mnist").mkdir()
    for f in IDX[:3]:
        (tmp_path / "mnist" / f"{f}.gz").symlink_to(DATA / "mnist" / f"{f}.gz")
    with pytest.raises(FileNotFoundError, match="missing file\\(s\\) t10k-labels-idx1-ubyte.gz;"):
        load_dataset("mnist", tmp_path)


def _mnist_with_bad_test_labels(tmp_path: Path, payload: bytes, compress: bool = True) -> Path:
    """An mnist/ folder with the real train files and the real test images plus a replaced test-labels file."""
    folder = tmp_path / "mnist"
    folder.mkdir()
    for f in IDX[:3]:
        (folder / f"{f}.gz").symlink_to(DATA / "mnist" / f"{f}.gz")
    bad = folder / "t10k-labels-idx1-ubyte.gz"
    bad.write_bytes(gzip.compress(payload) if compress else payload)
    return bad


def _real_test_labels() -> bytes:
    with gzip.open(DATA / "mnist" / "t10k-labels-idx1-ubyte.gz", "rb") as fh:
        return fh.read()


@needs_data
def test_mnist_truncated_gzip_is_a_value_error(tmp_path: Path) -> None:
    good = (DATA / "mnist" / "t10k-labels-idx1-ubyte.gz").read_bytes()
    bad = _mnist_with_bad_test_labels(tmp_path, good[: len(good) // 2], compress=False)
    with pytest.raises(ValueError, match=f"{bad}: corrupt gzip"):
        load_dataset("mnist", tmp_path)


@needs_data
def test_mnist_wrong_magic_is_a_value_error(tmp_path: Path) -> None:
    labels = bytearray(_real_test_labels())
    labels[2:4] = (2051).to_bytes(2, "big")  # the images magic in a labels file
    bad = _mnist_with_bad_test_labels(tmp_path, bytes(labels))
    with pytest.raises(ValueError, match=f"{bad}: not an IDX labels file \\(magic 2051, expected 2049\\)"):
        load_dataset("mnist", tmp_path)


@needs_data
def test_mnist_wrong_size_is_a_value_error(tmp_path: Path) -> None:
    labels = _real_test_labels()[:-5]  # header says 10000 labels, file has 9995
    bad = _mnist_with_bad_test_labels(tmp_path, labels)
    with pytest.raises(ValueError, match=f"{bad}: IDX labels file has 10003 bytes, expected 10008"):
        load_dataset("mnist", tmp_path)


# --------------------------------------------------------------------------- torchvision downloads (offline)
@pytest.mark.parametrize("name,expected", [("cifar10", "cifar-10-batches-py"), ("cifar100", "cifar-100-python"),
                                           ("emnist", "EMNIST/raw")])
def test_missing_torchvision_data_without_download(tmp_path: Path, name: str, expected: str) -> None:
    with pytest.raises(FileNotFoundError, match=f"{expected} under.*download=True.*network"):
        load_dataset(name, tmp_path)


def test_cifar_missing_file_and_corrupt_files(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
    for name in names[1:]:
        (folder / name).write_bytes(b"junk")
    with pytest.raises(FileNotFoundError, match=f"missing {folder / 'data_batch_1'} under"):
        load_dataset("cifar10", tmp_path)
    (folder / "data_batch_1").write_bytes(b"junk")  # all present, none with torchvision's MD5
    with pytest.raises(ValueError, match="cifar10: files under .* are corrupt"):
        load_dataset("cifar10", tmp_path)


@pytest.fixture()
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.mark.parametrize("name", ["cifar10", "emnist", "mnist"])
def test_download_offline_is_a_file_not_found_error(tmp_path: Path, no_network: None, name: str) -> None:
    (tmp_path / "mine").mkdir()  # a folder that was there before stays
    with pytest.raises(FileNotFoundError, match="(?s)download.*failed.*download=True needs network"):
        load_dataset(name, tmp_path, download=True)
    # issue 66: the failed download leaves no empty (or half-filled) data folder behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_bad_emnist_split(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="emnist_split.*byclass"):
        load_dataset("emnist", tmp_path, emnist_split="kanji")


# --------------------------------------------------------------------------- LEAF
@needs_data
def test_femnist_counts_and_writer_groups(_cache: Path) -> None:
    d = load_dataset("femnist", DATA)
    # SOURCES.md: 105 writers, 14,708 train / 1,685 test samples, 62 classes
    assert d.train_x.shape == (14708, 1, 28, 28) and d.test_x.shape == (1685, 1, 28, 28)
    assert d.num_classes == 62 and int(d.train_y.max()) <= 61 and int(d.train_y.min()) >= 0
    assert torch.unique(d.train_groups).tolist() == list(range(105))
    assert torch.unique(d.test_groups).tolist() == list(range(105))  # same writers, same order
    # first file in natural order is shard 0: 5 writers, 779 train / 89 test samples
    assert int((d.train_groups < 5).sum()) == 779 and int((d.test_groups < 5).sum()) == 89
    # by hand: the first training example is the first x of the first user of shard 0
    with gzip.open(DATA / "leaf_femnist" / "all_data_0_niid_05_keep_0_train_9.json.gz", "rt") as fh:
        raw = json.load(fh)
    first = raw["user_data"][raw["users"][0]]
    assert torch.equal(d.train_x[0].flatten(), torch.tensor(first["x"][0], dtype=torch.float32))
    assert d.train_y[0] == first["y"][0]
    assert len(list(_cache.glob("femnist-*.pt"))) == 1
    cached = load_dataset("femnist", DATA)
    assert torch.equal(cached.train_x, d.train_x) and torch.equal(cached.test_groups, d.test_groups)


@needs_data
def test_shakespeare_counts_and_vocabulary() -> None:
    d = load_dataset("shakespeare", DATA)
    # SOURCES.md: 10 roles, 41,990 train / 3,881 test samples (test counted by len(x), not num_samples)
    assert d.train_x.shape == (41990, 80) and d.test_x.shape == (3881, 80)
    assert d.train_x.dtype == torch.long and d.num_classes == 80 == len(ALL_LETTERS)
    assert torch.unique(d.train_groups).tolist() == list(range(10))
    assert torch.unique(d.test_groups).tolist() == list(range(10))
    with gzip.open(DATA / "leaf_shakespeare" / "all_data_niid_023_keep_64_train_9.json.gz", "rt") as fh:
        raw = json.load(fh)
    first = raw["user_data"][raw["users"][0]]
    assert "".join(ALL_LETTERS[i] for i in d.train_x[0].tolist()) == first["x"][0]
    assert ALL_LETTERS[int(d.train_y[0])] == first["y"][0]
    # a role's next window starts one character later: x[1][:79] == x[0][1:] and y[0] == x[1][79]
    assert torch.equal(d.train_x[1, :79], d.train_x[0, 1:]) and d.train_y[0] == d.train_x[1, 79]


def _write_leaf(path: Path, users: dict[str, tuple[list, list]]) -> None:
    data = {"users": list(users), "num_samples": [len(y) for _, y in users.values()],
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}
    with gzip.open(path, "wt") as fh:
        json.dump(data, fh)


def test_leaf_small_files_by_hand(tmp_path: Path) -> None:
    folder = tmp_path / "leaf_shakespeare"
    folder.mkdir()
    a, b = "a" * 80, "B!" * 40
    # natural order: shard 2 before shard 10, so role "r2" is group 0 and "r10" group 1
    _write_leaf(folder / "s_10_train.json.gz", {"r10": ([b], ["\n"])})
    _write_leaf(folder / "s_2_train.json.gz", {"r2": ([a, a], ["a", "}"])})
    _write_leaf(folder / "s_2_test.json.gz", {"r10": ([a], [" "]), "r2": ([b], ["b"])})
    d = load_dataset("shakespeare", tmp_path)
    # ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?A..Z[]a..z}": "\n" -> 0, " " -> 1, "!" -> 2,
    # "A" -> 25 so "B" -> 26, "[]" -> 51, 52, "a" -> 53, "b" -> 54, "}" -> 79 (the last of 80)
    assert d.train_y.tolist() == [53, 79, 0] and d.train_groups.tolist() == [0, 0, 1]
    assert d.train_x[2, :2].tolist() == [26, 2] and d.train_x[0].tolist() == [53] * 80
    assert d.test_y.tolist() == [1, 54] and d.test_groups.tolist() == [1, 0]


def test_leaf_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'leaf_femnist'}"):
        load_dataset("femnist", tmp_path)
    folder = tmp_path / "leaf_shakespeare"
    folder.mkdir()
    _write_leaf(folder / "x_train.json.gz", {"r": (["é" * 80], ["a"])})
    with pytest.raises(FileNotFoundError, match="test"):
        load_dataset("shakespeare", tmp_path)
    _write_leaf(folder / "x_test.json.gz", {"r": (["a" * 80], ["a"])})
    with pytest.raises(ValueError, match="x_train.json.gz.*character 'é'"):
        load_dataset("shakespeare", tmp_path)
    (folder / "x_train.json.gz").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(ValueError, match="x_train.json.gz: not a readable LEAF JSON"):
        load_dataset("shakespeare", tmp_path)
    femnist = tmp_path / "leaf_femnist"
    femnist.mkdir()
    _write_leaf(femnist / "f_train.json.gz", {"w": ([[0.5] * 784], [62])})
    _write_leaf(femnist / "f_test.json.gz", {"w": ([[0.5] * 784], [0])})
    with pytest.raises(ValueError, match="label 62 outside"):
        load_dataset("femnist", tmp_path)


def test_a_misspelt_dataset_gets_the_closest_name():
    from lfed.data.federated import FederatedDataset

    with pytest.raises(ValueError, match=r"dataset: 'mnsit' is not one of .* \(did you mean 'mnist'\?\)"):
        FederatedDataset(dataset="mnsit")
