"""lfed: federated learning on PyTorch Lightning."""
