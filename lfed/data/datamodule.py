"""FederatedDataModule: a dataset split over simulated clients, held as tensors.

The pooled training set lives in two tensors; a client is a list of positions in them
(packed into an ``[N, max_n]`` index with sizes), so the module can gather a whole cohort's
batch on the device in one indexing operation. Each client also has a held-out split for
client-side evaluation (SPEC §9). Lightning's ``train_dataloader`` yields one item per round
(the round is the training step); ``val_dataloader`` yields batches of the global test set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lfed.data.datasets import DatasetTensors, load_dataset, validate_labels
from lfed.data.partition import holdout_split, label_counts, pack_indices, partition


@dataclass
class FederatedData:
    """Everything about the clients' data that a federated round needs.

    Attributes:
        train_x, train_y: Pooled training examples of all clients.
        test_x, test_y: Global test set.
        client_index: ``[N, max_n]`` positions of each client's training examples.
        client_sizes: ``[N]`` number of training examples ``n_k``.
        holdout_index: ``[N, max_h]`` positions of each client's held-out examples.
        holdout_sizes: ``[N]`` (zeros when there is no held-out split).
        label_counts: ``[N, C]`` training label counts per client (DWFed, plots).
        num_classes: ``C``.
    """

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    client_index: Tensor
    client_sizes: Tensor
    holdout_index: Tensor
    holdout_sizes: Tensor
    label_counts: Tensor
    num_classes: int

    @property
    def num_clients(self) -> int:
        """``N``."""
        return int(self.client_sizes.numel())

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> FederatedData:
        """A copy on ``device``; floating inputs cast to ``dtype`` if given."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                v = v.to(device)
                if dtype is not None and f.name in ("train_x", "test_x") and v.is_floating_point():
                    v = v.to(dtype)
            out[f.name] = v
        return FederatedData(**out)


class _Rounds(Dataset):
    """One item per round: the training loop's batches are rounds."""

    def __init__(self, num_rounds: int) -> None:
        self.num_rounds = num_rounds

    def __len__(self) -> int:
        return self.num_rounds

    def __getitem__(self, i: int) -> int:
        return i


def _as_tensors(data: tuple[Tensor, Tensor] | Dataset, what: str) -> tuple[Tensor, Tensor]:
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, Tensor) for t in data):
        x, y = data
    elif isinstance(data, TensorDataset) and len(data.tensors) == 2:
        x, y = data.tensors
    elif isinstance(data, Dataset):
        items = [data[i] for i in range(len(data))]  # type: ignore[arg-type]
        if not items:
            raise ValueError(f"{what}: the dataset is empty")
        x = torch.stack([torch.as_tensor(it[0]) for it in items])
        y = torch.as_tensor([int(it[1]) for it in items])
    else:
        raise ValueError(f"{what}: expected (x, y) tensors or a torch Dataset of (x, y) pairs, got {type(data).__name__}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{what}: {x.shape[0]} inputs but {y.shape[0]} labels")
    return x, y.long()


class FederatedDataModule(LightningDataModule):
    """A dataset partitioned over ``num_clients`` simulated clients (SPEC §8).

    Args:
        dataset: A built-in dataset name (``digits``, ``mnist``, ``fashion_mnist``,
            ``cifar10``, ``cifar100``, ``emnist``, ``femnist``, ``shakespeare``).
        data_dir: Where dataset files live (default ``$LFED_DATA_DIR`` or ``~/.cache/lfed``).
        download: Let torchvision download missing files (needs network).
        num_clients: ``N``.
        partition: ``iid``, ``shards``, ``dirichlet``, ``classes`` or ``natural`` (LEAF writers).
        rho: Dirichlet concentration ρ (per-class ``ρ / C``).
        shards_per_client: Shards per client for ``shards``.
        classes_per_client: ``m`` for ``classes``.
        holdout_fraction: Share of each client's examples held out for client-side evaluation.
        seed: Seed of the partition.
        eval_batch_size: Batch size of the global test set.
        train: Your own training data instead of ``dataset``: ``(x, y)`` tensors or a torch
            ``Dataset`` of ``(x, y)`` pairs.
        test: Your own test data, same forms.
        num_classes: Number of classes of your own data (default ``max label + 1``).
    """

    def __init__(
        self,
        dataset: str = "digits",
        data_dir: str | None = None,
        download: bool = False,
        num_clients: int = 20,
        partition: str = "dirichlet",
        rho: float = 1.0,
        shards_per_client: int = 2,
        classes_per_client: int = 2,
        holdout_fraction: float = 0.2,
        seed: int = 0,
        eval_batch_size: int = 2048,
        train: tuple[Tensor, Tensor] | Dataset | None = None,
        test: tuple[Tensor, Tensor] | Dataset | None = None,
        num_classes: int | None = None,
    ) -> None:
        super().__init__()
        if num_clients < 1:
            raise ValueError(f"num_clients: must be >= 1, got {num_clients}")
        if not 0 <= holdout_fraction < 1:
            raise ValueError(f"holdout_fraction: must be in [0, 1), got {holdout_fraction}")
        if eval_batch_size < 1:
            raise ValueError(f"eval_batch_size: must be >= 1, got {eval_batch_size}")
        if (train is None) != (test is None):
            raise ValueError("train/test: give both your own train and test data, or neither (and a dataset name)")
        self.save_hyperparameters(ignore=["train", "test"])
        self.dataset = dataset
        self.data_dir = data_dir
        self.download = download
        self.num_clients = num_clients
        self.partition = partition
        self.rho = rho
        self.shards_per_client = shards_per_client
        self.classes_per_client = classes_per_client
        self.holdout_fraction = holdout_fraction
        self.seed = seed
        self.eval_batch_size = eval_batch_size
        self._user_train = train
        self._user_test = test
        self._user_num_classes = num_classes
        self.data: FederatedData | None = None
        if train is None:
            from lfed.data.datasets import DATASETS

            if dataset not in DATASETS:
                raise ValueError(f"dataset: {dataset!r} is not one of {DATASETS}")

    @classmethod
    def from_tensors(
        cls, train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, **kwargs
    ) -> FederatedDataModule:
        """A module over your own tensors (see the class arguments for ``kwargs``)."""
        return cls(dataset="custom", train=(train_x, train_y), test=(test_x, test_y), **kwargs)

    # ------------------------------------------------------------------ building
    def _load(self) -> DatasetTensors:
        if self._user_train is None:
            return load_dataset(self.dataset, self.data_dir, self.download)
        tx, ty = _as_tensors(self._user_train, "train")
        vx, vy = _as_tensors(self._user_test, "test")
        C = self._user_num_classes or int(max(ty.max(), vy.max())) + 1
        return DatasetTensors("custom", tx, ty, vx, vy, C)

    def build(self) -> FederatedData:
        """Load, validate and partition the data (idempotent)."""
        if self.data is not None:
            return self.data
        ds = self._load()
        validate_labels(ds.train_y, ds.num_classes, f"{ds.name} train labels")
        validate_labels(ds.test_y, ds.num_classes, f"{ds.name} test labels")
        clients = partition(
            ds.train_y,
            self.num_clients,
            self.partition,
            self.seed,
            rho=self.rho,
            shards_per_client=self.shards_per_client,
            classes_per_client=self.classes_per_client,
            num_classes=ds.num_classes,
            groups=ds.train_groups,
        )
        train_parts, holdout_parts = holdout_split(clients, self.holdout_fraction, self.seed)
        index, sizes = pack_indices(train_parts)
        if self.holdout_fraction > 0:
            h_index, h_sizes = pack_indices([h if h.numel() else torch.zeros(0, dtype=torch.long) for h in holdout_parts])
        else:
            h_index, h_sizes = torch.zeros(len(train_parts), 1, dtype=torch.long), torch.zeros(len(train_parts), dtype=torch.long)
        self.data = FederatedData(
            train_x=ds.train_x,
            train_y=ds.train_y,
            test_x=ds.test_x,
            test_y=ds.test_y,
            client_index=index,
            client_sizes=sizes,
            holdout_index=h_index,
            holdout_sizes=h_sizes,
            label_counts=label_counts(ds.train_y, train_parts, ds.num_classes),
            num_classes=ds.num_classes,
        )
        return self.data

    def setup(self, stage: str | None = None) -> None:
        self.build()

    @property
    def sample_shape(self) -> Sequence[int]:
        """Shape of one input example."""
        return tuple(self.build().train_x.shape[1:])

    # ------------------------------------------------------------------ loaders
    def train_dataloader(self) -> DataLoader:
        max_steps = getattr(self.trainer, "max_steps", -1) if self.trainer is not None else -1
        rounds = max_steps if max_steps and max_steps > 0 else 1000
        if self._world_size() > 1:
            # A round is a step of all ranks together (lfed.distributed), so every rank walks every
            # round: a sampler that already is a DistributedSampler keeps Lightning from splitting them.
            from torch.utils.data import DistributedSampler

            rounds_ds = _Rounds(rounds)
            return DataLoader(rounds_ds, batch_size=None, sampler=DistributedSampler(rounds_ds, num_replicas=1, rank=0, shuffle=False))
        return DataLoader(_Rounds(rounds), batch_size=None, shuffle=False)

    def _world_size(self) -> int:
        return int(getattr(self.trainer, "world_size", 1) or 1) if self.trainer is not None else 1

    def _test_loader(self) -> DataLoader:
        d = self.build()
        if self._world_size() > 1:
            # Each rank evaluates its share of the test set, no item twice (Lightning's default
            # DistributedSampler pads with repeats); the module all-reduces the sums.
            from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler

            test = TensorDataset(d.test_x, d.test_y)
            share = UnrepeatedDistributedSampler(test, num_replicas=self._world_size(), rank=self.trainer.global_rank, shuffle=False)
            return DataLoader(test, batch_size=self.eval_batch_size, sampler=share)
        return DataLoader(TensorDataset(d.test_x, d.test_y), batch_size=self.eval_batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return self._test_loader()

    def test_dataloader(self) -> DataLoader:
        return self._test_loader()

    def state_dict(self) -> dict:
        """What the clients' data is, for checkpoints: sizes, seed, partition and its fingerprint."""
        from lfed.fingerprint import data_fingerprint

        d = self.build()
        return {
            "num_clients": d.num_clients,
            "client_sizes": d.client_sizes.clone(),
            "seed": self.seed,
            "partition": self.partition,
            "fingerprint": data_fingerprint(self),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Nothing to restore (the partition is rebuilt from its seed); refuse another split.

        Raises:
            ValueError: If the checkpoint's clients were split differently (another dataset,
                number of clients, partition, seed, or other example indices), naming each difference.
        """
        from lfed.fingerprint import data_fingerprint, verify_fingerprint

        verify_fingerprint(state_dict.get("fingerprint"), data_fingerprint(self), "the checkpoint's data")
