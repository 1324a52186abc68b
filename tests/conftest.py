"""Shared helpers: a quiet Trainer that runs a few federated rounds."""

import os
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer

os.environ.setdefault("WANDB_MODE", "disabled")
# no benchmark helper a test runs waits for a quiet machine (benchmarks/harness.py): a test's timings are not figures,
# and under the suite's own two workers the load never falls below 1.0 (the quick GPU suite waited ~10 s for it)
os.environ.setdefault("QUIET_WAIT", "0")

REPO = Path(__file__).resolve().parents[1]
# tests/<subpackage>/test_<module>.py mirror the package; a test file may import another's helpers by its (unique) name
for _folder in sorted(p for p in Path(__file__).resolve().parent.iterdir() if p.is_dir() and any(p.glob("test_*.py"))):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
DATA_DIR = Path(os.environ.get("LFED_DATA_DIR", REPO.parent / "shared" / "data"))


def run_rounds(module, datamodule, rounds, *, evaluate_every=None, precision="64-true", **kwargs):
    """Fit ``module`` for ``rounds`` rounds on the CPU with no logger, checkpoint or progress bar."""
    trainer = Trainer(
        max_steps=rounds,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        precision=precision,
        check_val_every_n_epoch=None,
        val_check_interval=evaluate_every or rounds,
        limit_val_batches=None if evaluate_every else 0,
        **kwargs,
    )
    trainer.fit(module, datamodule=datamodule)
    return trainer


@pytest.fixture
def one_thread():
    """One intra-op thread for the test: runs trained together equal runs trained alone bit for bit
    only when no batched product is split differently across threads (lfed.lightning.group's docstring)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


#: docs/reproducibility.md, "Equal to a tolerance": two computations of the same maths from the same state that the
#: contract does not promise equal in bits (vmap and loop, chunk sizes, DDP's shares, other threads, other CPU kernels,
#: another machine), as max|a - b| <= CROSS_MACHINE[dtype] * max|b| per tensor, after a few (<= 6) rounds. The largest
#: spread scripts/measure_spread.py measured (docs/reproducibility.md has the table) times 20 or more, rounded up to a
#: power of ten: float64 5.6e-16 -> 1e-13, float32 4.3e-7 -> 1e-5.
CROSS_MACHINE = {torch.float64: 1e-13, torch.float32: 1e-5}


def assert_within(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype | None = None, what: str = "") -> float:
    """``max|got - want| <= CROSS_MACHINE[dtype] * max|want|`` (``dtype``: the computation's, default ``want``'s);
    returns the relative difference seen."""
    dtype = dtype or want.dtype
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if not want.numel():
        return 0.0
    diff = float((got.double() - want.double()).abs().max())
    scale = float(want.double().abs().max())
    assert diff <= CROSS_MACHINE[dtype] * max(scale, 1e-30), f"{what}: max|difference| {diff:g} at scale {scale:g}"
    return diff / scale if scale else diff


def flat_weights(module):
    return module.layout.module_vector(module.net)


#: Set (to 1) where the real datasets must be there (CI, .ci/run): a missing data directory fails.
REQUIRE_DATA = os.environ.get("LFED_REQUIRE_DATA", "") not in ("", "0")


def missing_data_outcome(data_dir: Path, require: bool) -> tuple[str, str] | None:
    """What a test needing the real datasets does: None (run), or ``("skip" | "fail", reason)``."""
    if (data_dir / "mnist").exists():
        return None
    reason = (f"needs the real datasets (MNIST, FEMNIST, ...) under {data_dir}, which is missing: "
              "set LFED_DATA_DIR to a folder holding them")
    return ("fail", reason + " (LFED_REQUIRE_DATA is set)") if require else ("skip", reason)


@pytest.fixture
def data_dir():
    """The real datasets' folder; the test is skipped (or fails under LFED_REQUIRE_DATA=1) without it."""
    outcome = missing_data_outcome(DATA_DIR, REQUIRE_DATA)
    if outcome is not None:
        kind, reason = outcome
        (pytest.fail if kind == "fail" else pytest.skip)(reason)
    return DATA_DIR


@pytest.fixture(autouse=True)
def _no_wandb_run_outlives_its_test():
    """A W&B run a test leaves open is finished after it: otherwise a later test's ``wandb.init`` in the same worker
    returns that run (reinit 'default') and its ``finish`` prints the earlier run's history into the later test's
    output (seen in CI: a grid test's "no W&B history" check failed on another test's run). wandb is not imported here."""
    yield
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.run.finish()

