"""What a DP run's checkpoint holds, each entry classified (docs/privacy.md "What a checkpoint holds").

A checkpoint must hold everything exact resume needs, and some of that is the clients' data read without noise:
the realised cohort sizes (what the fixed denominator exists to hide), the last cohort's ids, the clients' dataset
sizes, a hash of the training labels, accuracies on the clients' own splits, and every per-client state row (a
personal model, DP-SCAFFOLD's ``c_k``, from which ``c_k⁺ − c_k`` exposes a client's raw update). lfed keeps them
(resume stays exact) and marks the file instead: under DP the checkpoint's ``lfed.client_data`` lists every such
entry with what it is, and the run ends with one line naming the file.

:data:`CONTENTS` is the release table: a pattern over a checkpoint's flattened keys (``a.b.c``; list items by
index), its class, and what it is. :func:`classify` applies it; a key no row matches is ``unknown`` (a test lists
every key of a DP checkpoint and requires none, so a new entry cannot slip in unclassified).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["CLASSES", "CONTENTS", "classify", "client_data", "flatten"]

#: ``setting``: what the user configured (public); ``public``: counters and paths that depend on nothing private;
#: ``noised``: computed from noised releases only (post-processing); ``server``: computed on server-held data;
#: ``client``: read from the clients' data without noise (unaccounted); ``unknown``: no row matches.
CLASSES = ("setting", "public", "noised", "server", "client", "unknown")

_PER_CLIENT = "per-client state"  # matched by the run's declared per-client tensors, not by a pattern

#: ``(pattern, class, what)``; the first matching row wins.
CONTENTS: tuple[tuple[str, str, str], ...] = (
    ("lfed.client_data*", "public", "this list"),
    ("epoch", "public", "Lightning's epoch counter"),
    ("global_step", "public", "rounds done"),
    ("pytorch-lightning_version", "public", "Lightning's version"),
    ("loops.*", "public", "Lightning's loop counters (rounds done)"),
    ("callbacks.*", "public", "the callbacks' state: checkpoint paths, the end table's rows (test metrics as gated)"),
    ("lr_schedulers", "public", "none"),
    ("hparams_name", "setting", "the settings"), ("hyper_parameters*", "setting", "the settings"),
    ("datamodule_hparams_name", "setting", "the data settings"), ("datamodule_hyper_parameters*", "setting", "the data settings"),
    ("lfed_config*", "setting", "the configuration of the run"),
    ("FederatedDataModule.num_clients", "setting", "N"), ("FederatedDataModule.seed", "setting", "the partition seed"),
    ("FederatedDataModule.partition", "setting", "the partition scheme"),
    ("FederatedDataModule.client_sizes*", "client", "every client's number of training examples n_k (lfed <= 0.5), "
                                                    "their digest (client_sizes_digest)"),
    ("FederatedDataModule.fingerprint", "client", "a hash of the training labels and of each client's example indices"),
    ("state_dict.*_extra_state.ledger*", "client", "example-level DP-SGD's per-client ledger: each client's DP-SGD steps "
                                                  "and ε (who trained, and how often)"),
    ("state_dict.*_extra_state.accountant*", "noised", "the accountant's events (q, z, rounds): public settings"),
    ("state_dict.*_extra_state.*", "setting", "resolved settings (z, δ, σ_b)"),
    ("optimizer_states", "noised", "the server optimizer's state: built from the noised aggregates"),
    ("lfed.runs.*.comm.history", "client", "per-round upload counts and bits (the realised cohort sizes)"),
    ("lfed.runs.*.comm.rounds", "public", "rounds counted"),
    ("lfed.runs.*.comm.*", "client", "upload counts and bits: the realised cohort sizes, summed and of the last round"),
    ("lfed.runs.*.eval_history", "server", "test accuracy at each evaluation (client data where the test split is the "
                                           "clients', LEAF's: docs/privacy.md)"),
    ("lfed.runs.*.val_history", "server", "validation accuracy at each evaluation (the server's split)"),
    ("lfed.runs.*.bmta.best_global", "server", "the best mean test accuracy (docs/algorithms.md §9)"),
    ("lfed.runs.*.bmta.best_local", "client", "the best mean accuracy of a cohort on its clients' own splits"),
    ("lfed.runs.*.bmta.last_cohort", "client", "the last cohort's client ids (the Poisson cohort)"),
    ("lfed.runs.*.bmta*", "client", "BMTA's bookkeeping on the clients' splits"),
    ("lfed.runs.*.fingerprint", "client", "the run's fingerprint: settings and the data's hashes (labels, indices)"),
    ("lfed.runs.*.status", "public", "running / done / stopped"), ("lfed.runs.*.error", "public", "why it stopped"),
    ("lfed.runs.*.name", "setting", "the run's name"), ("lfed.runs.*.rounds_done", "public", "rounds done"),
    ("lfed.runs.*.draws", "setting", "how the run draws its cohorts (lfed.participation.sampling.DRAWS)"),
    ("lfed.environment*", "public", "what the run's bits depend on: lfed and torch versions, device, CPU, "
                                           "threads, deterministic setting, commit (docs/reproducibility.md)"),
    ("state_dict.*net.*", "noised", "the global model: the noised aggregates, post-processed"),
    ("state_dict.*", "noised", "server state of a component DP accepts (built from noised releases; a component with "
                               "un-noised releases is refused before round 0, lfed.privacy.releases)"),
)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.c": leaf}`` of nested dicts and of the list under ``lfed.runs`` (items by index); other lists are leaves."""
    out: dict[str, Any] = {}
    if isinstance(tree, Mapping) and tree and not (prefix.endswith("fingerprint") or prefix.endswith("_extra_state.accountant")):
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(tree, list) and prefix == "lfed.runs":
        for i, v in enumerate(tree):
            out.update(flatten(v, f"{prefix}.{i}"))
    else:
        out[prefix] = tree
    return out


def classify(key: str, per_client: Iterable[str] = ()) -> tuple[str, str]:
    """``(class, what)`` of a flattened checkpoint key. ``per_client``: the run's per-client state tensors as
    ``<role>.<name>`` (every row of them is a client's own, raw: client data)."""
    if key.startswith("state_dict.") and any(key.endswith(f".{n}") or f".{n}." in key  # dense, or sparse rows
                                             for name in per_client for n in (name, name + "_started")):
        return "client", _PER_CLIENT + " (a client's own raw rows: a personal model, c_k, h_k, Fisher reports, ...)"
    for pattern, cls, what in CONTENTS:
        if fnmatch.fnmatchcase(key, pattern):
            return cls, what
    return "unknown", "not in the release table"


def client_data(checkpoint: Mapping[str, Any], per_client: Iterable[str] = ()) -> dict[str, str]:
    """``{key: what}`` of every entry of ``checkpoint`` that is client data read without noise."""
    per_client = tuple(per_client)
    out = {}
    for key in flatten(checkpoint):
        cls, what = classify(key, per_client)
        if cls == "client":
            out[key] = what
    return out
