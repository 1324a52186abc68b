"""Run fingerprints: what a checkpoint was made for, and the check that refuses another run's.

A fingerprint is a flat dict: structural keys (``composition.*``, ``model.*``, ``data.*``: the
algorithm and its components, the model layout and every declared state tensor's shape, the
clients and their partition) identify the run; ``hparams.*`` keys are hyperparameters whose change
is allowed with a warning. :func:`verify_fingerprint` refuses to resume a checkpoint whose run
differs in any structural field, naming every difference with both values.
:mod:`lfed.lightning.checkpoint` writes them into checkpoints; :mod:`lfed.lightning.datamodule` checks its own
part (this module imports neither).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "STRUCTURAL_PREFIXES",
    "ResumeWarning",
    "current_class_paths",
    "data_digests",
    "data_fingerprint",
    "tensor_bytes",
    "run_fingerprint",
    "tensor_digest",
    "verify_fingerprint",
]


def rank_zero_warn(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn in the first process only (as Lightning's ``rank_zero_warn``, without importing Lightning)."""
    rank = next((os.environ[k] for k in ("RANK", "LOCAL_RANK", "SLURM_PROCID") if os.environ.get(k)), "0")
    if int(rank) == 0:
        warnings.warn(message, category, stacklevel=3)


def tensor_bytes(t: Tensor) -> bytes:
    """The bytes of ``t``'s entries (on the CPU, contiguous, in order): what every digest of lfed hashes."""
    t = t.detach().to("cpu").contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


class ResumeWarning(UserWarning):
    """A checkpoint resumed with changed hyperparameters: not an exact continuation."""


def tensor_digest(*tensors: Tensor) -> str:
    """SHA-256 (first 16 hex digits) of the dtypes, shapes and contents of ``tensors``."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        if flat.numel():  # the bytes of tensor_bytes, hashed in place (no copy of a 10^7-client index)
            h.update(memoryview(flat.view(torch.uint8).numpy()))
    return h.hexdigest()[:16]


def data_digests(data: Any) -> dict[str, str]:
    """The digests :func:`data_fingerprint` records of built data (a :class:`~lfed.data.federated.FederatedData`):
    ``train_labels`` (the training labels), ``client_indices`` (every client's sizes and positions, trained on and held
    out, flat: :attr:`~lfed.data.built.FederatedData.client_flat`), ``client_sizes`` (the sizes alone, what a checkpoint
    keeps of them) and, where the clients hold validation splits, ``client_val``. ``FederatedData.digests`` computes
    them once and keeps them. (lfed 0.5 hashed the padded ``[N, max]`` indices: :func:`padded_index_digest`.)"""
    out = {
        "train_labels": tensor_digest(data.train_y),
        "client_indices": tensor_digest(data.client_sizes, data.client_flat, data.holdout_sizes, data.holdout_flat),
        "client_sizes": tensor_digest(data.client_sizes),
    }
    if getattr(data, "client_val_sizes", None) is not None:
        out["client_val"] = tensor_digest(data.client_val_sizes, data.client_val_flat)
    return out


def padded_index_digest(data: Any, what: str = "client_indices") -> str:
    """The digest lfed 0.5 recorded of the clients' positions, over the padded ``[N, max]`` indices (built for it: ``N
    x`` the largest client): what a checkpoint of lfed 0.5 (or of 0.6 before its flat digests) is compared with."""
    if what == "client_val":
        return tensor_digest(data.client_val_sizes, data.client_val_index)
    return tensor_digest(data.client_sizes, data.client_index, data.holdout_sizes, data.holdout_index)


#: The fingerprint's keys whose digests lfed <= 0.5 took over the padded ``[N, max]`` indices (0.6: over the flat
#: positions), and the digest of :func:`data_digests` each is.
LEGACY_INDEX_KEYS = {"data.client_indices_hash": "client_indices", "data.client_val_hash": "client_val"}


def data_fingerprint(datamodule: Any, saved: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a :class:`~lfed.lightning.datamodule.FederatedDataModule` split its data into.

    ``data.*`` keys: dataset, number of clients, partition and its seed and parameter, held-out
    share, and hashes of the training labels and of each client's example indices (so the same
    config on other files, or another partitioner version, is caught too). The hashes are the data's own, made once
    (``FederatedData.digests``): saving and resuming a checkpoint hash nothing again. ``saved``: the checkpoint's
    fingerprint this one is compared with; where its index digests differ from these, they are lfed 0.5's, over the
    padded indices (:func:`padded_index_digest`), and those are computed for the comparison (so a 0.5 checkpoint of
    the same split resumes, and one of another split is still refused).
    """
    d = datamodule.build()
    digests = d.digests() if hasattr(d, "digests") else data_digests(d)
    out: dict[str, Any] = {
        "data.dataset": datamodule.dataset,
        "data.num_clients": d.num_clients,
        "data.partition": datamodule.partition,
        "data.seed": datamodule.seed,
        "data.holdout_fraction": datamodule.holdout_fraction,
        "data.validation_fraction": getattr(datamodule, "validation_fraction", 0.0),
        "data.train_examples": int(d.train_examples if getattr(d, "lazy", False) else d.train_y.numel()),
        "data.train_labels_hash": digests["train_labels"],
        "data.client_indices_hash": digests["client_indices"],
    }
    if getattr(datamodule, "client_validation_fraction", 0.0) > 0:  # absent otherwise: older fingerprints still match
        out["data.client_validation_fraction"] = datamodule.client_validation_fraction
        out["data.client_val_hash"] = digests["client_val"]
    for key, what in LEGACY_INDEX_KEYS.items():  # a checkpoint of lfed <= 0.5 hashed the padded indices
        if saved is not None and key in out and saved.get(key) != out[key] and not getattr(d, "lazy", False):
            out[key] = padded_index_digest(d, what)  # built for the comparison only (N x the largest client)
    out["data.invert_pixels"] = bool(getattr(datamodule, "invert_pixels", False))  # a checkpoint without it: not compared
    param = {"dirichlet": "rho", "shards": "shards_per_client", "classes": "classes_per_client"}.get(datamodule.partition)
    if param is not None:
        out[f"data.{param}"] = getattr(datamodule, param)
    return out


#: Fingerprint keys whose change makes a checkpoint another run: resuming is refused.
STRUCTURAL_PREFIXES = ("composition.", "model.", "data.")


def _optimizer_summary(factory: Any) -> tuple[str, dict[str, Any]]:
    probe = torch.zeros(1, requires_grad=True)
    try:
        opt = factory([probe])
    except Exception:  # pragma: no cover - a factory that needs real params
        return getattr(factory, "__qualname__", repr(factory)), {}
    cls = type(opt)
    hp = {k: v for k, v in opt.defaults.items() if isinstance(v, (bool, int, float, str, tuple)) and k != "differentiable"}
    return f"{cls.__module__}.{cls.__qualname__}", hp


def run_fingerprint(module: Any, total_rounds: int | None = None, datamodule: Any = None,
                    saved: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The fingerprint of a run (:class:`~lfed.core.run.FederatedRun`).

    Structural keys (``composition.*``, ``model.*``, ``data.*``; see :data:`STRUCTURAL_PREFIXES`)
    identify the run; ``hparams.*`` keys are hyperparameters whose change is allowed with a
    warning. ``data.*`` keys are present when its ``FederatedDataModule`` is given (``saved``: the checkpoint's
    fingerprint it is compared with, for the digests of lfed 0.5 it may hold: :func:`data_fingerprint`), ``model.*``
    keys once it has a net, the rounds when a fraction schedule depends on them. A net with
    frozen parameters (a frozen base, :mod:`lfed.models.adapters`) adds their names and shapes
    (``model.frozen``) and a digest of their values (``model.frozen_digest``): a checkpoint made
    over another base (another ``base_checkpoint``, another seed) is refused.
    """
    opt_name, opt_hp = _optimizer_summary(module.server_optimizer)
    plan = module.training_plan
    fp: dict[str, Any] = {"composition.algorithm": module.algorithm}
    # every component by its role: its name and class (structural), its hyper-parameters (soft)
    for role, component in module.components.roles().items():
        if role in ("participation", "history"):
            continue
        cls = type(component)
        fp[f"composition.{role}"] = component.name
        if not cls.__module__.startswith("lfed."):
            fp[f"composition.{role}.class"] = f"{cls.__module__}.{cls.__qualname__}"
        for k, v in component.structure().items():
            fp[f"composition.{role}.{k}"] = v
        for k, v in component.hparams().items():
            fp[f"hparams.{role}.{k}"] = v
    fp["composition.server_optimizer"] = opt_name
    fp.update({
        "hparams.client_lr": plan.client_lr,
        "hparams.batch_size": plan.batch_size,
        "hparams.local_epochs": plan.local_epochs,
        "hparams.local_steps": plan.local_steps,
        "hparams.seed": module.seed,
        "hparams.loss": type(module.loss).__name__ if module.loss is not None else "CrossEntropyLoss",
    })
    for k, v in module.participation.hparams().items():
        fp[f"hparams.{k}"] = v
    for k, v in opt_hp.items():
        fp[f"hparams.server_optimizer.{k}"] = v
    for k, shape in module.store.describe().items():  # every declared tensor, by its owner's role
        fp[f"model.state.{k}"] = shape
    total = total_rounds
    if total is not None and module.participation.fraction.depends_on_total_rounds:
        fp["hparams.total_rounds (trainer.max_steps; the fraction schedule depends on it)"] = total
    depending = [role for role, c in module.components.roles().items() if getattr(c, "depends_on_total_rounds", False)]
    if total is not None and depending:  # DP's noise calibrated for the run's rounds
        fp[f"hparams.total_rounds (trainer.max_steps; {', '.join(depending)} depends on it)"] = total
    if module.net is not None:
        net = type(module.net)
        fp["model.class"] = f"{net.__module__}.{net.__qualname__}"
        fp["model.num_params"] = module.layout.num_params
        fp["model.parameters"] = [f"{n}{list(s)}" for n, s in zip(module.layout.names, module.layout.shapes)]
        frozen = [(n, p) for n, p in module.net.named_parameters() if not p.requires_grad]
        if frozen:  # a frozen base: never trained, so a resume must start from the very same tensors
            fp["model.frozen"] = [f"{n}{list(p.shape)}" for n, p in frozen]
            fp["model.frozen_digest"] = tensor_digest(*(p for _, p in frozen))
    dm = datamodule
    if dm is not None and hasattr(dm, "build"):
        fp.update(data_fingerprint(dm, saved))
    return fp


def _show(v: Any) -> str:
    if isinstance(v, list) and len(v) > 6:
        return f"[{', '.join(map(str, v[:3]))}, ... {len(v)} entries]"
    return repr(v)


def _differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(key, checkpoint's value, this run's value)`` as display strings, for keys in both that differ."""
    out = []
    for key in saved:
        if key not in current or saved[key] == current[key]:
            continue
        a, b = saved[key], current[key]
        if isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                out.append((key, f"{len(a)} entries {_show(a)}", f"{len(b)} entries {_show(b)}"))
            else:  # the first entry that differs
                i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
                out.append((key, f"{a[i]} (entry {i})", f"{b[i]} (entry {i})"))
        else:
            out.append((key, _show(a), _show(b)))
    return out


def class_path_now(path: Any) -> Any:
    """A class path written by an earlier lfed as this lfed writes it: a module that moved (:func:`lfed.current_path`:
    0.4's paths, removed in 0.6, are read here, never imported) or a class exported by its package (``lfed.models.MLP``)
    resolves to its class's module (``lfed.models.zoo.MLP``). Anything else, or a path that no longer imports, is
    returned as given (and compared as such)."""
    if not isinstance(path, str) or not path.startswith("lfed.") or "." not in path:
        return path
    import importlib

    from lfed import current_path

    module, _, name = current_path(path).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return path
    return f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else path


def current_class_paths(settings: Any) -> Any:
    """``settings`` (a run's config as a checkpoint recorded it) with every ``class_path`` of a module that moved as this
    lfed spells it (:func:`lfed.current_path`: ``lfed.asynchronous.FedBuff`` -> ``lfed.core.asynchronous.FedBuff``), so
    a checkpoint of lfed 0.4 is read by its settings; everything else as given."""
    from lfed import current_path

    if isinstance(settings, dict):
        return {k: current_path(v) if k == "class_path" and isinstance(v, str) else current_class_paths(v)
                for k, v in settings.items()}
    if isinstance(settings, list):
        return [current_class_paths(v) for v in settings]
    return settings


def moved_paths(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """``fingerprint`` with its class paths (``model.class``, ``composition.<role>.class``) as this lfed writes them."""
    return {k: class_path_now(v) if k.endswith(".class") else v for k, v in fingerprint.items()}


def verify_fingerprint(saved: Mapping[str, Any] | None, current: Mapping[str, Any], source: str = "the checkpoint") -> None:
    """Refuse to resume a checkpoint made for another run; warn about changed hyperparameters.

    Only keys present in both fingerprints are compared (a key this run cannot know yet, or a
    checkpoint from before a key existed, is skipped).

    Args:
        saved: The fingerprint stored in the checkpoint (None: an old checkpoint, nothing checked).
        current: This run's fingerprint.
        source: How to call the checkpoint in messages.

    Raises:
        ValueError: Listing every structural field that differs, with the checkpoint's value
            and this run's value.
    """
    if saved is None:
        rank_zero_warn(f"{source} has no lfed run fingerprint (saved by an older lfed?): resuming without checking it", category=ResumeWarning)
        return
    diffs = _differences(moved_paths(saved), current)
    hard = [(k, a, b) for k, a, b in diffs if k.startswith(STRUCTURAL_PREFIXES)]
    soft = [(k, a, b) for k, a, b in diffs if not k.startswith(STRUCTURAL_PREFIXES)]
    if hard:
        lines = "\n".join(f"  {k}: checkpoint {a}, this run {b}" for k, a, b in hard)
        raise ValueError(
            f"{source} was made by a different run and does not match this configuration:\n{lines}\n"
            "Use the config that made the checkpoint (lfed validate/test need none: they read it from the "
            "checkpoint), or start a new run without ckpt_path."
        )
    if soft:
        lines = "; ".join(f"{k.removeprefix('hparams.')}: {a} -> {b}" for k, a, b in soft)
        note = ""
        if any(k.startswith("hparams.server_optimizer.") for k, _, _ in soft):
            note = (
                " Note: Lightning restores the server optimizer's state with its param groups, so the "
                "checkpoint's server_optimizer settings stay in force."
            )
        rank_zero_warn(
            f"resuming {source} with changed hyperparameters ({lines}); the run continues but is not an exact "
            f"continuation of the one that saved it.{note}",
            category=ResumeWarning,
        )
