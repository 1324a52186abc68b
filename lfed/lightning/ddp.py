"""The Lightning side of a distributed run: the DDP wrapper made inert, and a check that the ranks agree.

:mod:`lfed.engine.ranks` holds the collectives of a round and needs no Lightning; this module
holds what hooks into Lightning's strategies (docs/distributed.md).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lfed.engine.ranks import Ranks, check_digests, state_digest

__all__ = ["ReplicaCheck", "logged_as_reduced", "prepare_strategy"]

#: Lightning's advice for a metric logged once per evaluation without ``sync_dist`` under DDP, up to its name.
SYNC_ADVICE = "It is recommended to use `self.log({name!r}, ..., sync_dist=True)`"
_quieted: set[str] = set()


def logged_as_reduced(names: Iterable[str]) -> None:
    """Metrics that are the same number on every rank, logged without ``sync_dist``: Lightning's advice to sync them
    (one ``PossibleUserWarning`` per name under DDP, issue 66 item 9) is dropped for these names only.

    An evaluation's metrics are computed from sums already reduced over the ranks (loss, correct and count of each
    rank's share, each client's correct count: docs/distributed.md, "Evaluation"), so every rank logs the same value.
    ``sync_dist=True`` would average W copies of that value: a collective per metric per evaluation for nothing, and,
    where W is not a power of 2, a value that can differ from the one-process run's in its last bit.
    ``rank_zero_only=True`` is for a metric only rank 0 logs (callbacks cannot monitor it, Lightning documents); here
    every rank logs it and a ``ModelCheckpoint`` or ``EarlyStopping`` on every rank monitors it, and alone it does not
    silence the advice (only with ``sync_dist=True``, a combination whose skipped sync is Lightning's internal detail).
    A metric of a user's own module keeps the advice.
    """
    from lightning.fabric.utilities.warnings import PossibleUserWarning

    for name in names:
        if name not in _quieted:
            _quieted.add(name)
            warnings.filterwarnings("ignore", message=re.escape(SYNC_ADVICE.format(name=name)), category=PossibleUserWarning)


def prepare_strategy(trainer: Trainer) -> None:
    """Make Lightning's DDP wrapper do nothing per round (call on fit start).

    lfed never back-propagates through the wrapped module (client training is functional and the
    server sets ``p.grad`` itself), so DDP's gradient hooks never fire. Its per-forward buffer
    broadcast would, though: every training step would re-send every buffer from rank 0,
    including the per-client state (``N x P`` numbers per tensor). The ranks compute identical
    buffers, so the broadcast is switched off; the initial broadcast when DDP wraps the module
    still makes all ranks start from rank 0's model. :class:`ReplicaCheck` verifies that the ranks
    stay identical.
    """
    model = getattr(trainer.strategy, "model", None)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model.broadcast_buffers = False  # a property for forward_sync_buffers in newer torch


class ReplicaCheck(Callback):
    """Debug check that every rank holds bit-identical state after each round.

    Hashes the module's state dict (global model, per-client state) and the server optimizer's
    state on every rank, all-gathers the 8-byte digests and raises if any rank differs from rank 0.
    Costs one hash of the state per check: use it to verify a setup, not in long runs
    (``--trainer.callbacks+=lfed.engine.ranks.ReplicaCheck``).

    Args:
        every_n_rounds: Check after every this many rounds (>= 1).
    """

    def __init__(self, every_n_rounds: int = 1) -> None:
        if isinstance(every_n_rounds, bool) or not isinstance(every_n_rounds, int) or every_n_rounds < 1:
            raise ValueError(f"every_n_rounds: must be an int >= 1, got {every_n_rounds!r}")
        self.every_n_rounds = every_n_rounds
        self.checked = 0

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step % self.every_n_rounds:
            return
        ranks = Ranks.of(pl_module)
        optimizers = [getattr(o, "optimizer", o) for o in trainer.optimizers]
        optimizers = [inner for o in optimizers for inner in getattr(o, "optimizers", [o])]  # each run's (lfed.lightning.driver)
        digest = torch.tensor([state_digest(pl_module, optimizers)], dtype=torch.long, device=pl_module.device)
        check_digests(ranks.all_gather(digest).reshape(-1).tolist(), trainer.global_step)
        self.checked += 1

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        rank_zero_info(
            f"lfed: ReplicaCheck: the state of all {Ranks.of(pl_module).world_size} ranks was identical "
            f"at each of {self.checked} checks"
        )


