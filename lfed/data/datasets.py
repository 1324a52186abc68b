"""Benchmark datasets as in-memory tensors (docs/algorithms.md §8).

Every loader returns a :class:`~lfed.data.tensors.DatasetTensors`: the whole train and test split
as tensors, ready to be moved to the device once (docs/architecture.md:
the cohort trains at once, on the device). Pixel values are ``float32`` scaled to ``[0, 1]``
(``x / 255``; ``x / 16`` for the 8x8 digits) with no mean/std standardisation,
so the same tensors serve every model; a model that wants standardised inputs
does it itself. Images are ``[n, C, H, W]``.

Datasets (:data:`DATASETS`):

- ``digits``: scikit-learn's embedded 8x8 digits (1,797 images, 10 classes),
  split 80/20 per class with a fixed seed, so every run sees the same split.
- ``mnist``, ``fashion_mnist``: the four standard IDX ``.gz`` files, read by
  ``torchvision.datasets.MNIST`` / ``FashionMNIST``. Accepted layouts under the
  data directory: torchvision's ``MNIST/raw/`` (``FashionMNIST/raw/``), with
  the decompressed files or only the ``.gz`` files, or lfed's shared layout
  ``mnist/*.gz`` (``fashion_mnist/*.gz``). torchvision reads only decompressed
  files, so ``.gz`` files are decompressed once (with torchvision's own
  ``extract_archive``) into a torchvision root in the cache directory
  (:func:`lfed.data.tensors.resolve_cache_dir`), keyed by the source files' path, size and
  modification time, and written atomically.
- ``cifar10``, ``cifar100``: ``torchvision.datasets.CIFAR10`` / ``CIFAR100``
  with root = the data directory (``cifar-10-batches-py/`` etc.).
- ``emnist``: ``torchvision.datasets.EMNIST``, split ``"byclass"`` by default
  (62 classes: digits, upper case, lower case, the EMNIST-62 of Reddi et al.
  and the same label order as LEAF FEMNIST). Images are transposed to upright
  orientation (the raw EMNIST files store them transposed).
- ``femnist``, ``shakespeare``: LEAF JSON files, see :mod:`lfed.data.leaf`.
- ``cifar_synthetic``: CIFAR-shaped (``3 x 32 x 32``, 10 classes) images generated from a fixed seed,
  nothing to fetch (:func:`_synthetic_cifar`): for tests, the suite and trying a vision setting
  offline. Each class is a smooth random colour pattern, and every image is its class's pattern at
  a random shift of up to 4 pixels, mirrored with probability 1/2, plus noise: crops and flips are
  the invariances that help, as on CIFAR. It is not a benchmark.
- ``synthetic``: FedProx's Synthetic(α, β) (Li et al. 2020, §5.1): ``num_clients`` devices, each generated from
  ``(seed, k)`` alone, 60 features, 10 classes, power-law sizes; the test set is every device's test share
  (:mod:`lfed.data.synthetic`, docs/algorithms.md §8.1). Generated, nothing to fetch.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import torch

from lfed.data import leaf
from lfed.data.synthetic import Synthetic, population
from lfed.data.tensors import DatasetTensors, resolve_cache_dir, source_key

__all__ = [
    "DATASETS",
    "NUM_CLASSES",
    "load_dataset",
    "resolve_data_dir",
]

#: Names accepted by :func:`load_dataset`.
DATASETS: tuple[str, ...] = (
    "digits", "mnist", "fashion_mnist", "cifar10", "cifar100", "emnist", "femnist", "shakespeare", "cifar_synthetic",
    "synthetic",
)

#: Number of classes of each dataset (``emnist`` with its default split ``byclass``).
NUM_CLASSES: dict[str, int] = {
    "digits": 10, "mnist": 10, "fashion_mnist": 10, "cifar10": 10, "cifar100": 100,
    "emnist": 62, "femnist": 62, "shakespeare": 80, "cifar_synthetic": 10, "synthetic": 10,
}

_EMNIST_CLASSES = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 27, "digits": 10, "mnist": 10}
_IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
              "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# name -> (torchvision class name, lfed shared-layout folder)
_IDX_DATASETS = {"mnist": ("MNIST", "mnist"), "fashion_mnist": ("FashionMNIST", "fashion_mnist")}


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """Where datasets are read from: ``data_dir``, else ``$LFED_DATA_DIR``, else ``~/.cache/lfed``.

    Args:
        data_dir: Explicit directory, or ``None`` to use the environment / default.

    Returns:
        The directory as an expanded ``Path`` (it need not exist).
    """
    if data_dir is None or str(data_dir) == "":
        data_dir = os.environ.get("LFED_DATA_DIR") or "~/.cache/lfed"
    return Path(data_dir).expanduser()


def load_dataset(
    name: str, data_dir: str | os.PathLike | None = None, download: bool = False, *, emnist_split: str = "byclass",
    synthetic: Synthetic | None = None, num_clients: int | None = None,
) -> DatasetTensors:
    """Load a benchmark dataset as tensors.

    Args:
        name: One of :data:`DATASETS`.
        data_dir: Directory holding the data (see :func:`resolve_data_dir`).
        download: For torchvision datasets, download missing files (needs network).
            LEAF data and the embedded digits are never downloaded.
        emnist_split: torchvision EMNIST split for ``name="emnist"``: ``byclass``
            (default, 62 classes), ``bymerge``, ``balanced``, ``letters``, ``digits``, ``mnist``.
        synthetic: For ``name="synthetic"``: its α, β and seed (:class:`lfed.data.synthetic.Synthetic`; default
            Synthetic(1, 1), seed 0).
        num_clients: For ``name="synthetic"``: the number of devices (required).

    Returns:
        The train and test tensors (see :class:`DatasetTensors`).

    Raises:
        ValueError: Unknown ``name`` or ``emnist_split``; a corrupt file (named);
            labels outside ``[0, num_classes)``.
        FileNotFoundError: Data files are missing (the message names them, the
            directories searched, and how to get them).
    """
    if name not in DATASETS:
        raise ValueError(f"name must be one of {DATASETS}, got {name!r}")
    root = resolve_data_dir(data_dir)
    if name == "digits":
        return _load_digits()
    if name == "cifar_synthetic":
        return _synthetic_cifar()
    if name == "synthetic":
        if num_clients is None:
            raise ValueError("synthetic: num_clients (the number of devices to generate) is required")
        return population(Synthetic() if synthetic is None else synthetic, num_clients)
    if name in _IDX_DATASETS:
        return _load_idx_dataset(name, root, download)
    if name in ("cifar10", "cifar100"):
        return _load_cifar(name, root, download)
    if name == "emnist":
        return _load_emnist(root, download, emnist_split)
    return leaf.load_femnist(root) if name == "femnist" else leaf.load_shakespeare(root)


def _load_digits(test_fraction: float = 0.2, seed: int = 0) -> DatasetTensors:
    """scikit-learn digits, split per class: ``floor(0.2 * n_c + 0.5)`` test examples of class c."""
    from sklearn.datasets import load_digits

    data, target = load_digits(return_X_y=True)
    x = torch.as_tensor(data, dtype=torch.float32).div(16.0).reshape(-1, 1, 8, 8)
    y = torch.as_tensor(target, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(y.numel(), generator=g)
    order = order[torch.argsort(y[order], stable=True)]  # grouped by class, random within class
    counts = torch.bincount(y, minlength=10)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(y.numel()) - starts[y[order]]
    n_test = torch.floor(counts.double() * test_fraction + 0.5).long()
    is_test = torch.zeros(y.numel(), dtype=torch.bool)
    is_test[order[rank < n_test[y[order]]]] = True
    return DatasetTensors("digits", x[~is_test], y[~is_test], x[is_test], y[is_test], 10)


def _synthetic_cifar(train: int = 2500, test: int = 500, seed: int = 0) -> DatasetTensors:
    """``cifar_synthetic`` (module docstring): ``train`` + ``test`` images of 10 classes (balanced), from ``seed``.

    Class ``c``'s pattern is a ``3 x 4 x 4`` standard normal grid upsampled bilinearly to ``3 x 40 x 40``; an
    image of class ``c`` is the ``32 x 32`` window of it at a uniform offset in ``{0..8}²``, mirrored left-right with
    probability 1/2, plus ``N(0, 0.5²)`` noise, then squashed to ``[0, 1]`` by ``sigmoid``.
    """
    g = torch.Generator().manual_seed(seed)
    patterns = torch.nn.functional.interpolate(torch.randn(10, 3, 4, 4, generator=g), size=(40, 40), mode="bilinear",
                                               align_corners=False)
    n = train + test
    y = torch.arange(n) % 10
    y = y[torch.randperm(n, generator=g)]
    off = torch.randint(0, 9, (n, 2), generator=g)
    rows = off[:, 0, None] + torch.arange(32)  # [n, 32]
    cols = off[:, 1, None] + torch.arange(32)
    x = patterns[y[:, None, None], :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)  # [n, 3, 32, 32]
    flip = torch.rand(n, generator=g) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    x = torch.sigmoid(x + 0.5 * torch.randn(x.shape, generator=g)).float()
    return DatasetTensors("cifar_synthetic", x[:train], y[:train], x[train:], y[train:], 10)


def _check_idx_header(path: Path, images: bool, source: Path) -> int:
    """Validate an IDX file's magic and size before torchvision parses it; return its count."""
    magic_expected = 2051 if images else 2049
    header_len = 16 if images else 8
    with open(path, "rb") as fh:
        header = fh.read(header_len)
    what = "images" if images else "labels"
    if len(header) < header_len:
        raise ValueError(f"{source}: corrupt IDX {what} file, only {len(header)} bytes")
    magic = int.from_bytes(header[:4], "big")
    if magic != magic_expected:
        raise ValueError(f"{source}: not an IDX {what} file (magic {magic}, expected {magic_expected})")
    count = int.from_bytes(header[4:8], "big")
    per_item = int.from_bytes(header[8:12], "big") * int.from_bytes(header[12:16], "big") if images else 1
    if images and per_item != 28 * 28:
        raise ValueError(f"{source}: images are not 28x28")
    size, expected = path.stat().st_size, header_len + count * per_item
    if size != expected:
        raise ValueError(f"{source}: IDX {what} file has {size} bytes, expected {expected} for {count} items")
    return count


def _decompress_to_cache(name: str, tv_name: str, gz_files: list[Path]) -> Path:
    """Decompress the four ``.gz`` files into a torchvision root in the cache; return the root."""
    from torchvision.datasets.utils import extract_archive

    root = resolve_cache_dir() / "torchvision" / f"{name}-{source_key(name, gz_files)}"
    raw = root / tv_name / "raw"
    if all((raw / f.name[:-3]).is_file() for f in gz_files):
        return root
    raw.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=raw, prefix=".extract-") as tmp:
        for gz in gz_files:
            try:
                out = Path(extract_archive(str(gz), tmp))
            except Exception as err:  # noqa: BLE001 - BadGzipFile (OSError), EOFError, zlib.error
                raise ValueError(f"{gz}: corrupt gzip file ({type(err).__name__}: {err})") from err
            _check_idx_header(out, "images" in gz.name, gz)
            os.replace(out, raw / out.name)
    return root


def _idx_missing_error(name: str, searched: list[Path], missing: list[str]) -> FileNotFoundError:
    return FileNotFoundError(
        f"{name}: missing file(s) {', '.join(missing)}; searched {', '.join(str(d) for d in searched)} "
        f"(as the four {name} IDX .gz files, or decompressed in torchvision's layout). "
        f"Put the files in one of these directories, point data_dir or $LFED_DATA_DIR at a directory "
        f"holding them, or pass download=True (--data.download true) when online."
    )


def _load_idx_dataset(name: str, data_dir: Path, download: bool) -> DatasetTensors:
    """MNIST / FashionMNIST through torchvision from either layout (see module docstring)."""
    import torchvision.datasets as tvd

    tv_name, short = _IDX_DATASETS[name]
    tv_raw, shared = data_dir / tv_name / "raw", data_dir / short
    sources: dict[str, Path] = {}
    if all((tv_raw / f).is_file() for f in _IDX_NAMES):
        root = data_dir
        sources = {f: tv_raw / f for f in _IDX_NAMES}
    else:
        missing = [f + ".gz" for f in _IDX_NAMES]
        for d in (tv_raw, shared):
            gz = [d / (f + ".gz") for f in _IDX_NAMES]
            if all(p.is_file() for p in gz):
                root = _decompress_to_cache(name, tv_name, gz)
                sources = dict(zip(_IDX_NAMES, gz))
                missing = []
                break
            if any(p.is_file() for p in gz):
                missing = [p.name for p in gz if not p.is_file()]
        if missing and download:
            root = data_dir
            try:
                with _no_trace_of_a_failed_download(tv_raw):
                    getattr(tvd, tv_name)(str(root), train=True, download=True)
                    getattr(tvd, tv_name)(str(root), train=False, download=True)
            except Exception as err:  # noqa: BLE001 - offline: URLError, RuntimeError, OSError
                raise FileNotFoundError(
                    f"{name}: download into {tv_raw} failed ({type(err).__name__}: {err}); "
                    f"download=True needs network access. Otherwise copy the files there."
                ) from err
            sources = {f: tv_raw / f for f in _IDX_NAMES}
        elif missing:
            raise _idx_missing_error(name, [tv_raw, shared], missing)
    raw = root / tv_name / "raw"
    counts = {f: _check_idx_header(raw / f, "images" in f, sources[f]) for f in _IDX_NAMES}
    for split in ("train", "t10k"):
        if counts[f"{split}-images-idx3-ubyte"] != counts[f"{split}-labels-idx1-ubyte"]:
            raise ValueError(f"{name}: {sources[f'{split}-images-idx3-ubyte']} holds "
                             f"{counts[f'{split}-images-idx3-ubyte']} images but "
                             f"{sources[f'{split}-labels-idx1-ubyte']} {counts[f'{split}-labels-idx1-ubyte']} labels")
    splits = []
    for train in (True, False):
        try:
            ds = getattr(tvd, tv_name)(str(root), train=train, download=False)
        except Exception as err:  # noqa: BLE001 - torchvision asserts on malformed files
            raise ValueError(f"{name}: torchvision could not read {raw} ({type(err).__name__}: {err})") from err
        splits += [ds.data.unsqueeze(1).to(torch.float32).div_(255.0), ds.targets.long()]
    return DatasetTensors(name, *splits, num_classes=10)


@contextlib.contextmanager
def _no_trace_of_a_failed_download(target: Path):
    """Run a download into ``target``; if it fails, remove the folders it created (the first of ``target``'s
    ancestors that did not exist, with any partial files in it), so a failed download leaves no empty or half-filled
    data folder behind (issue 66: ``--data.download true`` offline left an empty one). Folders that existed stay."""
    created = None
    for folder in (target, *target.parents):
        if folder.exists():
            break
        created = folder
    try:
        yield
    except BaseException:
        if created is not None and created.exists():
            shutil.rmtree(created, ignore_errors=True)
        raise


def _torchvision_error(name: str, root: Path, expected: list[Path], download: bool, err: Exception) -> Exception:
    """FileNotFoundError for missing files / failed downloads; ValueError for corrupt files."""
    missing = [p for p in expected if not p.exists()]
    if missing and not missing[0].parent.exists():
        missing = [missing[0].parent]  # the whole folder is absent: name it, not every file in it
    if missing or download:
        how = ("the download failed; download=True needs network access" if download else
               "pass download=True (needs network access) or point data_dir / $LFED_DATA_DIR at the data")
        return FileNotFoundError(
            f"{name}: missing {', '.join(str(p) for p in missing) or 'files'} under {root}; {how} "
            f"({type(err).__name__}: {err})"
        )
    return ValueError(f"{name}: files under {root} are corrupt ({type(err).__name__}: {err})")


def _load_cifar(name: str, data_dir: Path, download: bool) -> DatasetTensors:
    """CIFAR-10/100 through torchvision: uint8 HWC -> float32 [n, 3, 32, 32] / 255."""
    import torchvision.datasets as tvd

    cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
    folder = data_dir / cls.base_folder
    expected = [folder / f for f, _ in cls.train_list + cls.test_list] + [folder / cls.meta["filename"]]
    splits = []
    for train in (True, False):
        try:
            with _no_trace_of_a_failed_download(folder) if download else contextlib.nullcontext():
                ds = cls(str(data_dir), train=train, download=download)
        except Exception as err:  # noqa: BLE001 - RuntimeError (not found / corrupt), URLError offline
            raise _torchvision_error(name, data_dir, expected, download, err) from err
        x = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous().to(torch.float32).div_(255.0)
        splits += [x, torch.as_tensor(ds.targets, dtype=torch.long)]
    return DatasetTensors(name, *splits, num_classes=10 if name == "cifar10" else 100)


def _load_emnist(data_dir: Path, download: bool, split: str) -> DatasetTensors:
    """EMNIST through torchvision, transposed to upright images, float32 [n, 1, 28, 28] / 255."""
    import torchvision.datasets as tvd

    if split not in _EMNIST_CLASSES:
        raise ValueError(f"emnist_split must be one of {tuple(_EMNIST_CLASSES)}, got {split!r}")
    raw = data_dir / "EMNIST" / "raw"
    expected = [raw / f"emnist-{split}-{s}-{k}-idx{d}-ubyte"
                for s in ("train", "test") for k, d in (("images", 3), ("labels", 1))]
    splits = []
    for train in (True, False):
        try:
            with _no_trace_of_a_failed_download(raw) if download else contextlib.nullcontext():
                ds = tvd.EMNIST(str(data_dir), split=split, train=train, download=download)
        except Exception as err:  # noqa: BLE001
            raise _torchvision_error("emnist", data_dir, expected, download, err) from err
        x = ds.data.transpose(1, 2).unsqueeze(1).to(torch.float32).div_(255.0)
        splits += [x, ds.targets.long()]
    return DatasetTensors("emnist", *splits, num_classes=_EMNIST_CLASSES[split])
