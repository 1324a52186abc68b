"""Exact, crash-safe resume of a federated run.

Three pieces:

* :class:`AtomicCheckpointIO`: Lightning's ``CheckpointIO`` that writes a checkpoint to a
  temporary file in the target's directory, flushes it to disk (``fsync``), and moves it over
  the target with ``os.replace`` (then syncs the directory). A process killed at any moment
  leaves either the previous complete file or the new complete file, never a truncated one.
  ``lfed fit`` installs it by default. (Lightning's own ``TorchCheckpointIO`` serialises to
  memory and commits through an ``fsspec`` transaction whose temporary file lives in the system
  temp directory; when that is another file system the commit is a copy, and nothing is synced.)
* :class:`RoundCheckpoint`: a ``ModelCheckpoint`` with federated defaults, a ``last.ckpt``
  every ``every_n_train_steps`` rounds (one round is one training step), written after the
  round's evaluation when one follows. ``last.ckpt`` is written through the strategy's
  ``CheckpointIO`` like any other checkpoint (``save_last=True``), so it is atomic too; the
  ``save_last="link"`` mode (remove the old file, then symlink) is refused because a kill
  between the two leaves no ``last.ckpt``. It never saves on an exception: an exception can
  stop a round half way (per-client state updated, global model not yet), and a run stopped by
  the divergence guard must not overwrite the last good checkpoint.
* Run fingerprints: what a checkpoint was made for (algorithm and its composition, model
  layout, clients and their partition). :func:`verify_fingerprint` refuses to resume a
  checkpoint whose run differs in any structural field, naming every difference with both
  values, and warns about changed hyperparameters (the run then resumes, but is no longer an
  exact continuation).

What a checkpoint holds (docs/state.md; docs/reproducibility.md): the global model and every
per-client tensor are in the state dict of :class:`~lfed.lightning.module.FederatedModule`, its objective and
its sampler (SCAFFOLD ``c``/``c_k``, IGFL previous updates and last global change, EFL Fisher reports
and their sums, compression residuals, AdaFL scores; per-client rows of ``P`` numbers as sparse
``<name>.clients/.rows/.shape`` entries, the same whatever ``client_state`` placement kept them,
:mod:`lfed.state.stores`); the server optimizer state is Lightning's
``optimizer_states``; the round counter is ``global_step``; the communication meter and the
evaluation history go through ``on_save_checkpoint``. There is no random-generator state to carry:
every random draw of round ``r`` comes from a generator seeded by ``(seed, r, stream)``
(:mod:`lfed.rng`), including dropout during local training (:func:`lfed.rng.seeded_global_rng`).
The partition is rebuilt from its seed and verified against the fingerprint's hash of the
clients' example indices.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

from lfed.state.atomic import remove_stale_temps, write_atomically
from lfed.state.fingerprint import (  # re-exported: the checkpoint's fingerprint
    ResumeWarning,
    current_class_paths,
    data_fingerprint,
    run_fingerprint,
    tensor_digest,
    verify_fingerprint,
)

__all__ = [
    "AtomicCheckpointIO",
    "RoundCheckpoint",
    "ResumeWarning",
    "tensor_digest",
    "data_fingerprint",
    "run_fingerprint",
    "verify_fingerprint",
    "install_atomic_io",
    "read_checkpoint",
    "NotACheckpointError",
]


#: A checkpoint path: a local path or a URL (``s3://...``).
_PATH = str | os.PathLike


def _is_local(path: _PATH) -> bool:
    """Whether ``path`` is on the local file system (no ``scheme://`` other than ``file://``)."""
    text = str(path)
    return "://" not in text or text.startswith("file://")


class NotACheckpointError(ValueError):
    """A ``ckpt_path`` that is not a checkpoint lfed can read."""


def read_checkpoint(path: _PATH) -> dict[str, Any]:
    """Read a Lightning checkpoint safely (``weights_only=True``), or say clearly that it is not one.

    Never suggests an unsafe load: a file that is not a checkpoint (garbage, a truncated write,
    a pickle with arbitrary objects) raises :class:`NotACheckpointError` naming the file, without
    torch's advice to load it with ``weights_only=False``.

    Raises:
        NotACheckpointError: When the file is missing, unreadable, or not a Lightning checkpoint.
    """
    shown = str(path)
    if _is_local(path) and not Path(str(path).removeprefix("file://")).expanduser().is_file():
        raise NotACheckpointError(f"ckpt_path: {shown} does not exist (give an lfed checkpoint file, or 'last')")
    try:
        ckpt = torch.load(str(path).removeprefix("file://"), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - every failure means the same to the user
        reason = "" if "weights_only" in str(e) or "Weights only" in str(e) else f": {str(e).splitlines()[0][:200]}" if str(e) else ""
        raise NotACheckpointError(
            f"ckpt_path: {shown} is not an lfed checkpoint (it cannot be read as one; {type(e).__name__}{reason})"
        ) from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "global_step" not in ckpt:
        raise NotACheckpointError(f"ckpt_path: {shown} is not an lfed checkpoint (no Lightning checkpoint fields in it)")
    if isinstance(ckpt.get("lfed_config"), dict):  # an older lfed's settings: its class paths as this lfed spells them
        ckpt["lfed_config"] = current_class_paths(ckpt["lfed_config"])
    return ckpt


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose saves are atomic and durable on a local file system.

    ``save_checkpoint(ckpt, "d/last.ckpt")`` streams ``torch.save`` into ``d/.last.ckpt.tmp-<pid>``,
    flushes and syncs it (``os.fsync``), renames it over ``d/last.ckpt`` with ``os.replace``
    (atomic on POSIX and Windows within one file system, which the same directory guarantees)
    and syncs ``d`` so the rename itself survives a power loss. On an error the temporary
    file is removed; a temporary file left by a killed process is removed by the next
    successful save of the same path. Remote paths (``s3://`` ...) fall back to Lightning's
    ``fsspec`` transaction.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path`` atomically (see the class docstring)."""
        if storage_options is not None:
            raise TypeError(f"storage_options: {type(self).__name__} takes none, got {storage_options!r}")
        if not _is_local(path):
            return super().save_checkpoint(checkpoint, path)
        target = Path(path).expanduser()
        write_atomically(target, lambda f: self._write(checkpoint, f))
        remove_stale_temps(target)

    def load_checkpoint(self, path: _PATH, map_location: Any | None = None, weights_only: bool | None = None) -> dict[str, Any]:
        """Lightning's load, but a file that is not a checkpoint raises :class:`NotACheckpointError`.

        torch's own error for such a file advises loading it with ``weights_only=False``, which
        would run arbitrary code from an untrusted file: lfed never passes that advice on.
        """
        try:
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except (FileNotFoundError, NotACheckpointError):
            raise
        except Exception as e:  # noqa: BLE001
            unpickling = "pickle" in type(e).__module__.lower() or "Unpickl" in type(e).__name__
            if isinstance(e, (RuntimeError, EOFError, OSError, ValueError)) or unpickling:
                raise NotACheckpointError(f"ckpt_path: {path} is not an lfed checkpoint (it cannot be read as one; {type(e).__name__})") from None
            raise

    def _write(self, checkpoint: dict[str, Any], f: Any) -> None:
        """Serialise ``checkpoint`` into the open binary file ``f`` (a hook for tests)."""
        torch.save(checkpoint, f)


def _validation_follows(trainer: Any) -> bool:
    """Whether the fit loop evaluates right after the current training step (Lightning's own test).

    Private Lightning API (``fit_loop.epoch_loop._should_check_val_fx`` and
    ``fit_loop._data_fetcher``): re-deriving the decision (val_check_interval, the last batch,
    limit_val_batches, max_steps ...) would drift from what the loop really does, and a wrong
    answer either drops a checkpoint or writes it before the round's evaluation.
    tests/lightning/test_first_hour_cli.py::test_private_lightning_apis_lfed_relies_on_still_exist fails
    if they change; the fallback below saves at once, as ``ModelCheckpoint`` does.
    """
    try:
        loop = trainer.fit_loop.epoch_loop
        return bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher))
    except AttributeError:  # another Lightning version: save at once, as ModelCheckpoint does
        return False


def install_atomic_io(strategy: Any) -> bool:
    """Give ``strategy`` an :class:`AtomicCheckpointIO` if it uses Lightning's default one.

    A ``CheckpointIO`` the user configured (``trainer.plugins``), or one a strategy brings
    (FSDP, DeepSpeed, async wrappers), is left alone.

    Returns:
        Whether the strategy's checkpoint IO was replaced.
    """
    io = getattr(strategy, "checkpoint_io", None)
    if type(io) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()
        return True
    return False


class RoundCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` with federated defaults: ``last.ckpt`` every 10 rounds.

    Lightning's arguments, with these defaults changed: ``every_n_train_steps=10`` (a training
    step is a round), ``save_last=True`` (``last.ckpt`` is written through the checkpoint IO, so
    atomically with :class:`AtomicCheckpointIO`), ``save_top_k=0`` (only ``last.ckpt``; set
    ``save_top_k=-1`` to keep one file per checkpointed round). Resume with
    ``lfed fit ... --ckpt_path last`` (or the file's path).

    Raises:
        ValueError: On ``save_last="link"`` (not atomic) or ``save_on_exception=True`` (a round
            interrupted half way has inconsistent state; see the module docstring).
    """

    def __init__(
        self,
        dirpath: _PATH | None = None,
        filename: str | None = None,
        every_n_train_steps: int | None = 10,
        save_last: bool | None = True,
        save_top_k: int = 0,
        **kwargs: Any,
    ) -> None:
        if save_last == "link":
            raise ValueError(
                "save_last: 'link' removes last.ckpt and then creates a symlink, so a kill in between leaves "
                "no last.ckpt; use save_last=True (an atomic write through the checkpoint IO)"
            )
        if kwargs.get("save_on_exception"):
            raise ValueError(
                "save_on_exception: True would checkpoint a round stopped half way (or diverged); "
                "lfed checkpoints only at round boundaries"
            )
        if every_n_train_steps is not None and every_n_train_steps < 0:
            raise ValueError(f"every_n_train_steps: must be >= 0 rounds (0 or None: no periodic save), got {every_n_train_steps}")
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            every_n_train_steps=every_n_train_steps,
            save_last=save_last,
            save_top_k=save_top_k,
            **kwargs,
        )
        self.every_n_rounds = every_n_train_steps or 0
        self._after_validation = False

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Save after round ``r`` (``global_step % every_n_train_steps == 0``), or after its evaluation.

        When an evaluation follows this round, the save waits for it (``on_validation_end``):
        a checkpoint written before the evaluation would resume past it (Lightning does not
        rerun it), and the evaluation history and accuracy-to-target counts would miss it.
        """
        every = self.every_n_rounds
        if every >= 1 and trainer.global_step % every == 0 and _validation_follows(trainer):
            self._after_validation = True
            return
        # Lightning warns on every manual-optimisation save that the checkpoint holds the state
        # after the optimizer step: for lfed that is the point (the state after round r).
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """Write the save deferred from ``on_train_batch_end``, now with the round's evaluation."""
        if not self._after_validation:
            return super().on_validation_end(trainer, pl_module)
        self._after_validation = False
        # Private ModelCheckpoint methods (no public "save now" that keeps its bookkeeping of
        # last_model_path, top-k and the version counter): the same calls Lightning's own
        # deferred save makes in ModelCheckpoint.on_validation_end. tests/lightning/test_first_hour_cli.py
        # fails loudly if they are renamed; tests/lightning/test_checkpoint.py checks the saves they make.
        if self._should_skip_saving_checkpoint(trainer):
            return
        candidates = self._monitor_candidates(trainer)
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

    def save_now(self, trainer: Any) -> None:
        """Write ``last.ckpt`` now (a run that stops before ``max_steps``: DP's privacy budget)."""
        if trainer.global_step == self._last_global_step_saved:
            return
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Never save on an exception (the last good checkpoint stays as it is)."""
