"""FederatedDataModule: :class:`lfed.data.federated.FederatedDataset` as a Lightning data module.

Lightning's ``train_dataloader`` yields one item per round (the round is the training step);
``val_dataloader`` and ``test_dataloader`` one item per evaluation (the module evaluates its runs'
data itself). Everything about the clients' data lives in :mod:`lfed.data.federated`, which imports
no Lightning (:func:`lfed.core.fit.fit_run` runs on it alone).
"""

from __future__ import annotations

import functools

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, TensorDataset

from lfed.data.federated import HOST_FIELDS, FederatedData, FederatedDataset, client_validation_seed, share_datasets

__all__ = ["FederatedData", "FederatedDataModule", "HOST_FIELDS", "RoundsLoader", "client_validation_seed",
           "evaluation_ticks", "share_datasets"]


def evaluation_ticks() -> DataLoader:
    """The evaluation loader: one item, so the validation (test) step runs once per evaluation and rank.

    The module evaluates the test set, the validation split and the clients' held-out splits from
    the tensors on the device, each rank its share (:func:`lfed.evaluation.scores.evaluate_split`).
    """
    return DataLoader(TensorDataset(torch.zeros(1)), batch_size=1)


class RoundsLoader:
    """The training loader: one item per round, the round's index (the training loop's batches are rounds).

    It is resumable (Lightning's ``state_dict`` / ``load_state_dict`` protocol): a checkpoint
    stores how many rounds were done, and after a resume the loader goes on from the next round,
    so an exact resume in the middle of the run is exact for Lightning too. Being no
    ``DataLoader``, Lightning adds no (distributed) sampler: every rank walks every round, as a
    round is a step of all ranks together (lfed.engine.ranks).

    Args:
        num_rounds: Rounds of the run (the loader's length).
        rounds_done: Callable giving the rounds done so far (the trainer's ``global_step``), read
            when a checkpoint is saved.
    """

    def __init__(self, num_rounds: int, rounds_done=lambda: 0) -> None:
        self.num_rounds = num_rounds
        self.rounds_done = rounds_done
        self.start = 0

    def __len__(self) -> int:
        return self.num_rounds

    def __iter__(self):
        start, self.start = self.start, 0  # a later epoch starts from round 0 of the loader again
        return iter(range(start, self.num_rounds))

    def state_dict(self) -> dict:
        return {"rounds_done": int(self.rounds_done())}

    def load_state_dict(self, state_dict: dict) -> None:
        self.start = min(int(state_dict["rounds_done"]), self.num_rounds)


class FederatedDataModule(FederatedDataset, LightningDataModule):
    __doc__ = FederatedDataset.__doc__.replace(", with no Lightning in it", ", as a Lightning data module")

    @functools.wraps(FederatedDataset.__init__)  # one signature (LightningCLI reads it through __wrapped__)
    def __init__(self, *args, **kwargs) -> None:
        LightningDataModule.__init__(self)
        FederatedDataset.__init__(self, *args, **kwargs)
        # Kept in checkpoints, not handed to the loggers: Lightning would merge them with the
        # module's hyperparameters and refuse the run when a key of both differs (``seed``: the
        # module's is the seed of sampling and batches, this one the partition's). ``lfed fit``
        # logs the run's settings under their own names (``model.seed``, ``data.seed``).
        self.save_hyperparameters(self.settings, logger=False)

    def setup(self, stage: str | None = None) -> None:
        self.build()

    # ------------------------------------------------------------------ loaders
    def train_dataloader(self) -> RoundsLoader:
        max_steps = getattr(self.trainer, "max_steps", -1) if self.trainer is not None else -1
        rounds = max_steps if max_steps and max_steps > 0 else 1000
        trainer = self.trainer
        return RoundsLoader(rounds, (lambda: trainer.global_step) if trainer is not None else (lambda: 0))

    def val_dataloader(self) -> DataLoader:
        """One item per evaluation: the module evaluates its runs' data itself (:meth:`lfed.core.run.FederatedRun.evaluate`)."""
        return evaluation_ticks()

    def test_dataloader(self) -> DataLoader:
        return evaluation_ticks()
