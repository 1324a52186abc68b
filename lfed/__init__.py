"""lfed: federated learning on PyTorch Lightning.

``FederatedModule`` runs one federated round per training step; ``FederatedDataModule``
splits a dataset over simulated clients; ``CohortTrainer`` trains a cohort at once.
"""

from lfed.data.datamodule import FederatedDataModule
from lfed.engine import CohortTrainer, StepRule
from lfed.module import FederatedModule
from lfed.reporting import silence_library_noise as _silence_library_noise

_silence_library_noise()  # narrow filters for Lightning-internal messages (lfed.reporting)

__all__ = ["CohortTrainer", "FederatedDataModule", "FederatedModule", "StepRule"]
__version__ = "0.1.0"
