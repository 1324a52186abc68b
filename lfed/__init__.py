"""lfed: federated learning on PyTorch Lightning.

``FederatedModule`` runs one federated round per training step; ``FederatedDataModule``
splits a dataset over simulated clients; ``CohortTrainer`` trains a cohort at once.
"""

from lfed.data.datamodule import FederatedDataModule
from lfed.engine import CohortTrainer, StepRule
from lfed.module import FederatedModule

__all__ = ["CohortTrainer", "FederatedDataModule", "FederatedModule", "StepRule"]
__version__ = "0.1.0"
