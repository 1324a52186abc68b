"""Test-only Lightning plugins for tests/lightning/test_checkpoint.py, importable by a ``lfed fit`` subprocess.

They make a SIGKILL land at a known point: the subprocess prints a marker line and blocks, the
test reads the marker from its output and kills it (a real ``SIGKILL`` from outside, as a
preempted job gets). Nothing here changes what a run computes.
"""

from __future__ import annotations

import io
import os
import threading
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from lfed.lightning.checkpoint import AtomicCheckpointIO

HOLD_MARK = "lfed-test: holding"


def _hold(what: str) -> None:
    print(f"{HOLD_MARK} {what} (pid {os.getpid()})", flush=True)
    threading.Event().wait()  # until the test kills this process


class HoldInRound(Callback):
    """Block in the middle of round ``round``: clients trained, server step not taken.

    Args:
        round: The 0-based round (``global_step`` when it starts).
    """

    def __init__(self, round: int) -> None:
        self.round = round

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if trainer.global_step == self.round:
            _hold(f"in round {self.round}")


class RaiseMidRound(Callback):
    """Stop the run with an error where :class:`HoldInRound` blocks (round ``round``: clients trained, server step not
    taken): the in-process stand-in of a SIGKILL there (the round's work is lost with the exception)."""

    def __init__(self, round: int) -> None:
        self.round = round

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if trainer.global_step == self.round:
            raise RuntimeError(f"stopped in round {self.round}")


class HoldInCheckpointWrite(AtomicCheckpointIO):
    """Atomic checkpoint IO that, for the checkpoint of ``global_step == step``, writes half of
    the serialised bytes to the temporary file, makes them durable, and blocks.

    Args:
        step: The ``global_step`` whose checkpoint write is interrupted.
    """

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def _write(self, checkpoint: dict[str, Any], f: Any) -> None:
        if checkpoint.get("global_step") != self.step:
            return super()._write(checkpoint, f)
        buffer = io.BytesIO()
        super()._write(checkpoint, buffer)
        data = buffer.getvalue()
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
        _hold(f"in the checkpoint write of step {self.step} ({len(data) // 2} of {len(data)} bytes written)")


class RoundLog(Callback):
    """Record the ``global_step`` at the start of every round this process runs."""

    def __init__(self) -> None:
        self.rounds: list[int] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.rounds.append(int(trainer.global_step))


class DropoutMLP(torch.nn.Module):
    """64-16-10 MLP with dropout 0.5 after the hidden layer: draws from torch's global generator."""

    def __init__(self, in_features: int = 64, hidden: int = 16, num_classes: int = 10) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(in_features, hidden), torch.nn.ReLU(),
            torch.nn.Dropout(0.5), torch.nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class RaiseInRound(Callback):
    """Stop the process's work in round ``round`` with an error (after the checkpoint before it), as a kill would."""

    def __init__(self, round: int) -> None:
        self.round = round

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.round:
            raise RuntimeError(f"killed in round {self.round}")
