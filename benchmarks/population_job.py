"""Issue 65's job, shared by ``population_round.py`` and ``population_table.py``: ``N`` clients of 5 examples (16
features, 10 classes, IID), an MLP 16-32-10, K = 100 clients a round, one local step of batch 5, the Lightning-free API.
Written against the API lfed 0.5 and 0.6 share, so either checkout can be first on ``PYTHONPATH``."""

from __future__ import annotations

import torch


def examples(N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``N * 5`` training examples and 100 test examples (the first 100), from seed 0."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(N * 5 + 100, 16, generator=g), torch.randint(0, 10, (N * 5 + 100,), generator=g)


def data_module(x: torch.Tensor, y: torch.Tensor, N: int, holdout: float = 0.0):
    """The data module over :func:`examples` (not built)."""
    from lfed.lightning.datamodule import FederatedDataModule

    return FederatedDataModule.from_tensors(x[100:], y[100:], x[:100], y[:100], num_clients=N, partition="iid",
                                            holdout_fraction=holdout, num_classes=10)


def issue65_run(N: int):
    """The run (FedAvg, K = 100 of ``N``)."""
    from lfed.core.settings import build_run
    from lfed.models import MLP

    try:
        from lfed.core.algorithm import LocalTraining
    except ImportError:  # lfed 0.5
        from lfed.core.round import LocalTraining
    return build_run(net=MLP(16, [32], 10), fraction=min(1.0, 100 / N),
                     training=LocalTraining(client_lr=0.1, batch_size=5, local_steps=1))
