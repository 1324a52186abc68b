"""lfed: federated learning on PyTorch Lightning.

``FederatedModule`` runs one federated round per training step; ``FederatedDataModule``
splits a dataset over simulated clients; ``CohortTrainer`` trains a cohort at once.
"""

import os as _os

# Idle OpenMP threads sleep rather than spin (unless you set OMP_WAIT_POLICY yourself). A local
# step is many small operations; with spinning threads, one busy process beside lfed on the same
# cores stalls every parallel region until the other thread is scheduled again: job 2 of
# BENCHMARKS.md ran 0.67 s/round with torch's 2 threads spinning and 0.21-0.28 s/round with them
# sleeping. Takes effect when lfed is imported before torch (``lfed fit`` always is); results are
# unchanged (it decides only what a waiting thread does).
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from lfed.data.datamodule import FederatedDataModule  # noqa: E402
from lfed.engine import CohortTrainer, StepRule  # noqa: E402
from lfed.module import FederatedModule  # noqa: E402
from lfed.reporting import silence_library_noise as _silence_library_noise  # noqa: E402

_silence_library_noise()  # narrow filters for Lightning-internal messages (lfed.reporting)

__all__ = ["CohortTrainer", "FederatedDataModule", "FederatedModule", "StepRule"]
__version__ = "0.1.0"
