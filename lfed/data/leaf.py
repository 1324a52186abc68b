"""LEAF FEMNIST and Shakespeare from LEAF's JSON files (docs/algorithms.md §8, natural partition).

LEAF (Caldas et al. 2018) stores each split as JSON files
``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``,
often sharded into several files. Files are looked for in

- ``<data_dir>/leaf_<task>/``: names containing ``train`` / ``test``, ending in
  ``.json`` or ``.json.gz`` (lfed's own layout, e.g. ``<data_dir>/leaf_femnist/``);
- ``<data_dir>/<task>/data/train/`` and ``.../test/``: LEAF's own output layout.

Files are read in natural name order (``..._2_...`` before ``..._10_...``). The
natural client of an example is its user (FEMNIST writer, Shakespeare role):
``train_groups`` / ``test_groups`` hold the index of the user in order of first
appearance in the training files, the same index in both splits (a user found
only in the test files gets an index after all training users). Per-user
example counts are taken from ``len(x)``, not ``num_samples``: LEAF's
Shakespeare test files overstate ``num_samples`` by 79 (SOURCES.md).

FEMNIST: ``x`` is a 28x28 image flattened row-major with values in ``[0, 1]``
and 1.0 = white background (LEAF's convention, kept as is), giving
``float32 [n, 1, 28, 28]``; 62 classes (0-9 digits, 10-35 A-Z, 36-61 a-z).

Shakespeare (next-character prediction): ``x`` is an 80-character string and
``y`` the next character; both are mapped to indices in LEAF's 80-character
vocabulary :data:`ALL_LETTERS` (``x``: ``long [n, 80]``, ``y``: ``long [n]``,
80 classes). A character outside the vocabulary is a ``ValueError``.

Decoded FEMNIST tensors are cached (see :func:`lfed.data.tensors.cached_tensors`):
parsing its JSON takes about 3 s, loading the cache about 0.05 s. Shakespeare
parses in about 0.1 s and is not cached.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import torch

from lfed.data.tensors import DatasetTensors, cached_tensors

__all__ = ["ALL_LETTERS", "find_leaf_files", "load_femnist", "load_shakespeare", "read_leaf_json"]

#: LEAF's Shakespeare vocabulary (``leaf/models/utils/language_utils.py``); index = class.
ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"

_LOOKUP = np.full(256, -1, dtype=np.int64)
_LOOKUP[np.frombuffer(ALL_LETTERS.encode("ascii"), dtype=np.uint8)] = np.arange(len(ALL_LETTERS))


def _natural_key(path: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def _is_json(path: Path) -> bool:
    return path.is_file() and (path.name.endswith(".json") or path.name.endswith(".json.gz"))


def find_leaf_files(data_dir: Path, task: str) -> tuple[list[Path], list[Path]]:
    """Find a LEAF task's train and test JSON files.

    Args:
        data_dir: The data directory.
        task: ``"femnist"`` or ``"shakespeare"``.

    Returns:
        ``(train_files, test_files)``, each in natural name order.

    Raises:
        FileNotFoundError: If no train or no test file is found (names the directories searched).
    """
    flat = data_dir / f"leaf_{task}"
    native_train, native_test = data_dir / task / "data" / "train", data_dir / task / "data" / "test"
    train: list[Path] = []
    test: list[Path] = []
    if flat.is_dir():
        files = [p for p in flat.iterdir() if _is_json(p)]
        train = [p for p in files if "train" in p.name]
        test = [p for p in files if "test" in p.name and "train" not in p.name]
    if not train and not test and native_train.is_dir() and native_test.is_dir():
        train = [p for p in native_train.iterdir() if _is_json(p)]
        test = [p for p in native_test.iterdir() if _is_json(p)]
    if not train or not test:
        missing = " and ".join(s for s, f in (("train", train), ("test", test)) if not f)
        raise FileNotFoundError(
            f"{task}: no LEAF {missing} JSON files (*train*.json[.gz] / *test*.json[.gz]) found; searched "
            f"{flat} and {native_train.parent}/{{train,test}}. LEAF data is not downloaded by lfed: run LEAF's "
            f"preprocess.sh for {task}, copy its data/train and data/test JSON files (optionally gzipped) into "
            f"{flat}, or point data_dir / $LFED_DATA_DIR at a directory holding leaf_{task}/."
        )
    return sorted(train, key=_natural_key), sorted(test, key=_natural_key)


def read_leaf_json(path: Path) -> dict:
    """Read and check one LEAF JSON (or ``.json.gz``) file.

    Args:
        path: The file.

    Returns:
        The parsed dict with ``users`` and ``user_data``.

    Raises:
        ValueError: If the file is not valid (gzipped) JSON in LEAF's format (names the file).
    """
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable LEAF JSON file ({type(err).__name__}: {err})") from err
    if not isinstance(data, dict) or not isinstance(data.get("users"), list) \
            or not isinstance(data.get("user_data"), dict):
        raise ValueError(f"{path}: not a LEAF JSON file (expected keys 'users' and 'user_data')")
    for user in data["users"]:
        entry = data["user_data"].get(user)
        if not isinstance(entry, dict) or len(entry.get("x", ())) != len(entry.get("y", (None,))):
            raise ValueError(f"{path}: user {user!r} has no user_data or len(x) != len(y)")
    return data


def _read_split(files: list[Path], user_ids: dict[str, int], decode) -> tuple[list, list, list]:
    """Decode every user's examples of one split; extend ``user_ids`` with new users."""
    xs, ys, groups = [], [], []
    for path in files:
        data = read_leaf_json(path)
        for user in data["users"]:
            entry = data["user_data"][user]
            uid = user_ids.setdefault(user, len(user_ids))
            x, y = decode(entry["x"], entry["y"], path, user)
            xs.append(x)
            ys.append(y)
            groups.append(np.full(len(y), uid, dtype=np.int64))
    return xs, ys, groups


def _load(task: str, data_dir: Path, decode, num_classes: int, x_dtype: torch.dtype, cache: bool) -> DatasetTensors:
    train_files, test_files = find_leaf_files(Path(data_dir), task)

    def build() -> dict:
        user_ids: dict[str, int] = {}
        out = {}
        for split, files in (("train", train_files), ("test", test_files)):
            xs, ys, gs = _read_split(files, user_ids, decode)
            if not ys or sum(len(y) for y in ys) == 0:
                raise ValueError(f"{task}: the {split} files {[str(f) for f in files]} hold no examples")
            out[f"{split}_x"] = torch.from_numpy(np.concatenate(xs)).to(x_dtype)
            out[f"{split}_y"] = torch.from_numpy(np.concatenate(ys))
            out[f"{split}_groups"] = torch.from_numpy(np.concatenate(gs))
        out["users"] = list(user_ids)
        return out

    t = cached_tensors(task, train_files + test_files, build) if cache else build()
    return DatasetTensors(task, t["train_x"], t["train_y"], t["test_x"], t["test_y"], num_classes,
                          train_groups=t["train_groups"], test_groups=t["test_groups"])


def _decode_femnist(x: list, y: list, path: Path, user: str) -> tuple[np.ndarray, np.ndarray]:
    xa = np.asarray(x, dtype=np.float32).reshape(len(y), -1) if len(y) else np.zeros((0, 784), np.float32)
    if xa.shape[1] != 784:
        raise ValueError(f"{path}: user {user!r} has images of {xa.shape[1]} values, expected 784 (28x28)")
    ya = np.asarray(y, dtype=np.int64)
    bad = (ya < 0) | (ya >= 62)
    if bad.any():
        raise ValueError(f"femnist: {path}: user {user!r} has label {int(ya[bad][0])} outside [0, 62)")
    return xa.reshape(-1, 1, 28, 28), ya


def _encode_chars(strings: list[str], length: int, path: Path, user: str) -> np.ndarray:
    joined = "".join(strings)
    if len(joined) != length * len(strings):
        raise ValueError(f"{path}: user {user!r} has strings whose length is not {length}")
    try:
        codes = _LOOKUP[np.frombuffer(joined.encode("ascii"), dtype=np.uint8)]
    except UnicodeEncodeError:
        codes = np.array([-1])
    if (codes < 0).any():
        bad = next(c for c in joined if c not in ALL_LETTERS)
        raise ValueError(f"shakespeare: {path}: user {user!r} uses character {bad!r}, "
                         f"not in LEAF's 80-character vocabulary ALL_LETTERS")
    return codes.reshape(len(strings), length)


def _decode_shakespeare(x: list, y: list, path: Path, user: str) -> tuple[np.ndarray, np.ndarray]:
    return _encode_chars(list(x), 80, path, user), _encode_chars(list(y), 1, path, user).reshape(-1)


def load_femnist(data_dir: Path) -> DatasetTensors:
    """LEAF FEMNIST: ``float32 [n, 1, 28, 28]`` images, 62 classes, writer groups.

    Args:
        data_dir: The data directory (see :func:`find_leaf_files`).

    Returns:
        The dataset with ``train_groups`` / ``test_groups`` = writer index.

    Raises:
        FileNotFoundError: No LEAF FEMNIST files.
        ValueError: A malformed file or label (names the file).
    """
    return _load("femnist", data_dir, _decode_femnist, 62, torch.float32, cache=True)


def load_shakespeare(data_dir: Path) -> DatasetTensors:
    """LEAF Shakespeare next-character task: ``long [n, 80]`` inputs, 80 classes, role groups.

    Args:
        data_dir: The data directory (see :func:`find_leaf_files`).

    Returns:
        The dataset with ``train_groups`` / ``test_groups`` = role index.

    Raises:
        FileNotFoundError: No LEAF Shakespeare files.
        ValueError: A malformed file or a character outside :data:`ALL_LETTERS`.
    """
    return _load("shakespeare", data_dir, _decode_shakespeare, len(ALL_LETTERS), torch.long, cache=False)
