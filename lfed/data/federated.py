"""FederatedDataset: a dataset split over simulated clients, held as tensors, with no Lightning in it.

The pooled training set lives in two tensors; a client is a list of positions in them
(packed into an ``[N, max_n]`` index with sizes), so a whole cohort's batch is gathered on the
device in one indexing operation. Each client also has a held-out split for client-side
evaluation (docs/algorithms.md §9). :mod:`lfed.lightning.datamodule` wraps it for Lightning (the rounds as the
training loader, evaluation ticks).
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.utils.data import Dataset

from lfed.data.augment import Augmentation, build_augmentation
from lfed.data.built import HOST_FIELDS, FederatedData
from lfed.data.datasets import DATASETS, load_dataset
from lfed.data.partition import PARTITIONS, partition_flat
from lfed.data.splits import holdout_split_flat, label_counts_flat, validation_split
from lfed.data.synthetic import Synthetic
from lfed.data.tensors import DatasetTensors, inverted_pixels, validate_labels
from lfed.data.user_tensors import as_tensors

__all__ = ["FederatedData", "FederatedDataset", "HOST_FIELDS", "UnusedSettingWarning", "client_validation_seed", "share_datasets"]


class UnusedSettingWarning(UserWarning):
    """A setting given a value that the chosen configuration never reads (it would change nothing)."""

def client_validation_seed(seed: int) -> int:
    """The seed of the clients' validation splits: another stream than the held-out split's (``seed``)."""
    return (seed * 1_000_003 + 7_919) % (2**63)


def share_datasets(datamodules) -> None:
    """Load each dataset once for modules that partition the same one (the runs of a grid)."""
    loaded: dict[tuple, DatasetTensors] = {}
    for dm in datamodules:
        key = dm.dataset_key() if hasattr(dm, "dataset_key") else None
        if key is not None and dm.data is not None:  # built already (the Trainer's own data module)
            loaded.setdefault(key, dm._load())
    for dm in datamodules:
        key = dm.dataset_key() if hasattr(dm, "dataset_key") else None
        if key is None or dm.data is not None or len(datamodules) == 1:
            continue
        if key not in loaded:
            loaded[key] = dm._load()
        dm.use_dataset(loaded[key])


class FederatedDataset:
    """A dataset partitioned over ``num_clients`` simulated clients (docs/algorithms.md §8), with no Lightning in it.

    What a round needs of the data (:meth:`build` gives the :class:`FederatedData`); :func:`lfed.core.fit.fit_run`
    takes it as it is, and :class:`lfed.lightning.datamodule.FederatedDataModule` is the same with Lightning's loaders.

    Args:
        dataset: A built-in dataset name (``digits``, ``mnist``, ``fashion_mnist``,
            ``cifar10``, ``cifar100``, ``emnist``, ``femnist``, ``shakespeare``, ``cifar_synthetic``, ``synthetic``).
        data_dir: Where dataset files live (default ``$LFED_DATA_DIR`` or ``~/.cache/lfed``).
        download: Let torchvision download missing files (needs network).
        num_clients: ``N``.
        partition: ``iid``, ``shards``, ``dirichlet``, ``classes`` or ``natural`` (LEAF writers).
        rho: Dirichlet concentration ρ (per-class ``ρ / C``).
        shards_per_client: Shards per client for ``shards``.
        classes_per_client: ``m`` for ``classes``.
        holdout_fraction: Share of each client's examples held out for client-side evaluation (the
            client's own test split: ``client/*``, ``personal/*``, ``global/*``).
        client_validation_fraction: Share of each client's training examples kept as its own validation
            split (``personal_val/*``, ``global_val/*``; docs/personalization.md).
        validation_fraction: Share of the pooled training set set aside, before partitioning, as
            the server's validation set (no client holds it). With a share above 0 every
            evaluation also reports ``val/acc`` and ``val/loss`` (and the run
            ``final/val_acc_last10pct``): choose hyper-parameters on those, report ``test/*``.
        seed: Seed of the partition.
        eval_batch_size: Examples per forward pass of every evaluation.
        invert_pixels: Use ``1 - x`` (float inputs in ``[0, 1]``): LEAF FEMNIST's white background
            (1.0) becomes MNIST's convention, ink = 1 (why: docs/personalization.md).
        train: Your own training data instead of ``dataset``: ``(x, y)`` tensors or a ``Dataset`` of
            pairs (read once; a random transform is frozen). Targets: class labels, or floats (regression:
            loss only, ``partition='iid'``).
        test: Your own test data, same forms.
        num_classes: Number of classes of your own data (default: largest training label + 1;
            a test label outside the training classes is refused unless this is given).
        augment: Augmentation redrawn at every local step on the device (:mod:`lfed.data.augment`):
            ``crop_flip`` (random crop with padding 4, then a horizontal flip with probability 1/2), ``crop``,
            ``flip``, or an :class:`~lfed.data.augment.Augmentation` (``class_path``); None: none. Each client,
            step and example draws its own parameters from the round's seed; evaluation never augments.
        synthetic_alpha, synthetic_beta: α and β of ``dataset='synthetic'``, FedProx's Synthetic(α, β)
            (:mod:`lfed.data.synthetic`, docs/algorithms.md §8.1): ``num_clients`` devices generated from
            ``(seed, k)``, one client each (``partition='natural'``); the test set is every device's test share.
        synthetic_iid: ``dataset='synthetic'``: the reference's Synthetic-IID (one model for every device, centred
            inputs; α and β unread).
        lazy: ``dataset='synthetic'``: make each cohort's devices when it trains, never the whole population
            (:mod:`lfed.data.lazy`): 10^6-10^7 devices cost their sizes (8 bytes a device) and the cohort's examples.
            Needs ``test_devices``, and no held-out or validation split (the fractions 0).
        test_devices: ``dataset='synthetic'``: the test set is the test shares of this many devices, a seeded sample
            (all of them when there are no more); None: every device's. Required with ``lazy``.
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
        validation_fraction: float = 0.0,
        client_validation_fraction: float = 0.0,
        seed: int = 0,
        eval_batch_size: int = 2048,
        invert_pixels: bool = False,
        train: tuple[Tensor, Tensor] | Dataset | None = None,
        test: tuple[Tensor, Tensor] | Dataset | None = None,
        num_classes: int | None = None,
        augment: str | Augmentation | None = None,
        synthetic_alpha: float = 1.0,
        synthetic_beta: float = 1.0,
        synthetic_iid: bool = False,
        lazy: bool = False,
        test_devices: int | None = None,
    ) -> None:
        self.augment = build_augmentation(augment)
        if num_clients < 1:
            raise ValueError(f"num_clients: must be >= 1, got {num_clients}")
        if not 0 <= holdout_fraction < 1:
            raise ValueError(f"holdout_fraction: must be in [0, 1), got {holdout_fraction}")
        if isinstance(validation_fraction, bool) or not 0 <= validation_fraction < 1:
            raise ValueError(f"validation_fraction: must be in [0, 1), got {validation_fraction}")
        if isinstance(client_validation_fraction, bool) or not 0 <= client_validation_fraction < 1:
            raise ValueError(f"client_validation_fraction: must be in [0, 1), got {client_validation_fraction}")
        if eval_batch_size < 1:
            raise ValueError(f"eval_batch_size: must be >= 1, got {eval_batch_size}")
        if partition not in PARTITIONS:  # before anything starts (W&B, run files), naming the argument and a close match
            close = difflib.get_close_matches(str(partition), PARTITIONS, n=1)
            raise ValueError(f"partition: {partition!r} is not one of {PARTITIONS}"
                             + (f" (did you mean {close[0]!r}?)" if close else ""))
        if isinstance(rho, bool) or not rho > 0 or rho == float("inf"):
            raise ValueError(f"rho: the Dirichlet concentration, a number > 0, got {rho}")
        for name, value in (("shards_per_client", shards_per_client), ("classes_per_client", classes_per_client)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        if (train is None) != (test is None):
            raise ValueError("train/test: give both your own train and test data, or neither (and a dataset name)")
        #: the settings as given (what the Lightning layer keeps as the data module's hyper-parameters)
        self.settings = {k: v for k, v in locals().items() if k not in ("self", "train", "test", "__class__")}
        self.dataset = dataset
        self.data_dir = data_dir
        self.download = download
        self.num_clients = num_clients
        self.partition = partition
        self.rho = rho
        self.shards_per_client = shards_per_client
        self.classes_per_client = classes_per_client
        self.holdout_fraction = holdout_fraction
        self.validation_fraction = validation_fraction
        self.client_validation_fraction = client_validation_fraction
        self.seed = seed
        self.eval_batch_size = eval_batch_size
        if not isinstance(invert_pixels, bool):
            raise ValueError(f"invert_pixels: must be true or false, got {invert_pixels!r}")
        self.invert_pixels = invert_pixels
        self._user_train = train
        self._user_test = test
        self._user_num_classes = num_classes
        self.data: FederatedData | None = None
        if train is None and dataset not in DATASETS:
            close = difflib.get_close_matches(str(dataset), DATASETS, n=1)
            raise ValueError(f"dataset: {dataset!r} is not one of {DATASETS}"
                             + (f" (did you mean {close[0]!r}?)" if close else ""))
        self.synthetic = self._synthetic_spec(synthetic_alpha, synthetic_beta, synthetic_iid)
        self.lazy, self.test_devices = self._lazy_settings(lazy, test_devices)
        self._warn_unread(rho, shards_per_client, classes_per_client)

    def _warn_unread(self, rho: float, shards_per_client: int, classes_per_client: int) -> None:
        """A partition's setting that the chosen partition ignores, said before round 0."""
        read_by = {"rho": (rho, 1.0, "dirichlet"), "shards_per_client": (shards_per_client, 2, "shards"),
                   "classes_per_client": (classes_per_client, 2, "classes")}
        for name, (value, default, reader) in read_by.items():
            if value != default and self.partition != reader:
                warnings.warn(f"{name}: {value} does nothing with partition: {self.partition!r} (only partition: "
                              f"{reader!r} reads it)", UnusedSettingWarning, stacklevel=3)

    def _synthetic_spec(self, alpha: float, beta: float, iid: bool) -> Synthetic | None:
        """The Synthetic(α, β) settings when ``dataset='synthetic'`` (checked); else None, warning of set ones."""
        if self._user_train is not None or self.dataset != "synthetic":
            given = [f"synthetic_{k}: {v}" for k, v, d in (("alpha", alpha, 1.0), ("beta", beta, 1.0),
                                                         ("iid", iid, False)) if v != d]
            if given:
                warnings.warn(f"{', '.join(given)} does nothing with dataset: {self.dataset!r} (only dataset: "
                              "'synthetic' reads it)", UnusedSettingWarning, stacklevel=3)
            return None
        if self.partition != "natural":
            raise ValueError(f"partition: dataset 'synthetic' generates num_clients devices, one client each; set "
                             f"partition: natural (got {self.partition!r})")
        try:
            return Synthetic(alpha=alpha, beta=beta, iid=iid, seed=self.seed)
        except ValueError as err:
            raise ValueError(f"synthetic_{err}") from None

    def _lazy_settings(self, lazy: bool, test_devices: int | None) -> tuple[bool, int | None]:
        """``lazy`` and ``test_devices``, checked against the other settings (module docstring of lfed.data.lazy)."""
        if not isinstance(lazy, bool):
            raise ValueError(f"lazy: must be true or false, got {lazy!r}")
        if test_devices is not None and (isinstance(test_devices, bool) or not isinstance(test_devices, int)
                                         or test_devices < 1):
            raise ValueError(f"test_devices: a number of devices >= 1, or null (every device's test share), "
                             f"got {test_devices!r}")
        if self.synthetic is None:
            given = [f"{k}: {v}" for k, v, d in (("lazy", lazy, False), ("test_devices", test_devices, None)) if v != d]
            if lazy:
                raise ValueError(f"lazy: a population made per client is dataset 'synthetic' (FedProx's Synthetic); "
                                 f"dataset {self.dataset!r} is loaded whole")
            if given:
                warnings.warn(f"{', '.join(given)} does nothing with dataset: {self.dataset!r} (only dataset: "
                              "'synthetic' reads it)", UnusedSettingWarning, stacklevel=3)
            return lazy, test_devices
        if lazy:
            if test_devices is None:
                raise ValueError("test_devices: with lazy, the test set is the test shares of a sample of devices; give "
                                 f"its size (e.g. 1000; {self.num_clients} for every device's)")
            for name in ("holdout_fraction", "validation_fraction", "client_validation_fraction"):
                if getattr(self, name) > 0:
                    raise ValueError(f"{name}: must be 0 with lazy (a population made per client has no held-out or "
                                     f"validation splits; the test set is test_devices' test shares), got "
                                     f"{getattr(self, name)}")
            if self.augment is not None:
                raise ValueError("augment: not with lazy (Synthetic's inputs are vectors, not images)")
        return lazy, test_devices

    @classmethod
    def from_tensors(
        cls, train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, **kwargs
    ) -> FederatedDataset:
        """A dataset over your own tensors (see the class arguments for ``kwargs``)."""
        return cls(dataset="custom", train=(train_x, train_y), test=(test_x, test_y), **kwargs)

    # ------------------------------------------------------------------ building
    def dataset_key(self) -> tuple | None:
        """What identifies the loaded dataset (None for tensors of the user's): modules with one key share a load."""
        if self._user_train is not None:
            return None
        if self.lazy:  # nothing loaded to share: each module makes its cohorts
            return None
        key = (self.dataset, str(self.data_dir), self.download, self.invert_pixels)
        return key if self.synthetic is None else (*key, self.synthetic, self.num_clients)

    def use_dataset(self, loaded: DatasetTensors) -> None:
        """Partition ``loaded`` (the dataset another module of the same :meth:`dataset_key` loaded) instead of loading it."""
        self._loaded = loaded

    def _load(self) -> DatasetTensors:
        if getattr(self, "_loaded", None) is not None:
            return self._loaded
        ds = self._load_as_stored()
        return inverted_pixels(ds) if self.invert_pixels else ds

    def _load_as_stored(self) -> DatasetTensors:
        if self._user_train is None:
            return load_dataset(self.dataset, self.data_dir, self.download, synthetic=self.synthetic,
                                num_clients=self.num_clients)
        tx, ty = as_tensors(self._user_train, "train")
        vx, vy = as_tensors(self._user_test, "test")
        if tx.shape[1:] != vx.shape[1:] or tx.dtype != vx.dtype:
            raise ValueError(f"train/test: inputs differ: train {tuple(tx.shape[1:])} {tx.dtype}, "
                             f"test {tuple(vx.shape[1:])} {vx.dtype} per example")
        if ty.dtype.is_floating_point != vy.dtype.is_floating_point or ty.shape[1:] != vy.shape[1:]:
            raise ValueError(f"train/test: targets differ: train {tuple(ty.shape[1:])} {ty.dtype}, "
                             f"test {tuple(vy.shape[1:])} {vy.dtype} per example (both class labels or both regression)")
        if ty.dtype.is_floating_point:
            if self._user_num_classes is not None:
                raise ValueError("num_classes: given, but the targets are floating (regression); "
                                 "leave num_classes out, or give integer class labels")
            return DatasetTensors("custom", tx, ty, vx, vy, None)
        if self._user_num_classes is not None:
            return DatasetTensors("custom", tx, ty, vx, vy, self._user_num_classes)
        C = int(ty.max()) + 1
        if bool((vy >= C).any()):
            raise ValueError(
                f"test labels: label {int(vy[vy >= C][0])} is outside the training classes [0, {C}) (the largest "
                f"training label is {C - 1}); a model cannot learn a class it never sees. Give num_classes "
                "explicitly if the training set really lacks some classes"
            )
        return DatasetTensors("custom", tx, ty, vx, vy, C)

    def build(self) -> FederatedData:
        """Load, validate and partition the data (idempotent)."""
        if self.data is not None:
            return self.data
        if self.lazy:
            from lfed.data.lazy import LazyFederatedData
            from lfed.data.synthetic import SyntheticSource

            self.data = LazyFederatedData(SyntheticSource(self.synthetic, self.num_clients), self.test_devices, self.seed)
            return self.data
        self._loaded = self._load()
        ds = self._sampled_test_devices(self._loaded)
        regression = ds.num_classes is None
        if regression:
            if self.partition != "iid":
                raise ValueError(f"partition: {self.partition!r} splits by class label, but the targets are floating "
                                 "(regression); use partition='iid'")
        else:
            validate_labels(ds.train_y, ds.num_classes, f"{ds.name} train labels")
            validate_labels(ds.test_y, ds.num_classes, f"{ds.name} test labels")
        labels = torch.zeros(ds.train_y.shape[0], dtype=torch.long) if regression else ds.train_y
        groups, val_index = ds.train_groups, None
        if self.validation_fraction > 0:
            rest, val_index = validation_split(labels.shape[0], self.validation_fraction, self.seed)
            labels = labels[rest]
            groups = None if groups is None else groups[rest]
        # the clients' indices flat: one sort, never a tensor per client (partition_flat)
        flat, all_sizes = partition_flat(
            labels,
            self.num_clients,
            self.partition,
            self.seed,
            rho=self.rho,
            shards_per_client=self.shards_per_client,
            classes_per_client=self.classes_per_client,
            num_classes=ds.num_classes,
            groups=groups,
        )
        if val_index is not None:  # positions among the rest -> positions in the pooled set
            flat = rest.to(flat.device)[flat]
        train, sizes, held, h_sizes = holdout_split_flat(flat, all_sizes, self.holdout_fraction, self.seed)
        cv_flat = cv_sizes = None
        if self.client_validation_fraction > 0:  # each client's own validation split, from what it trains on
            train, sizes, cv_flat, cv_sizes = holdout_split_flat(train, sizes, self.client_validation_fraction,
                                                                 client_validation_seed(self.seed))
            cv_sizes = cv_sizes.to(cv_flat.device)
        sizes = sizes.to(train.device)
        num = sizes.numel()
        if self.holdout_fraction > 0:
            h_flat, h_sizes = held, h_sizes.to(held.device)
        else:  # no held-out split: FederatedData's [N, 1] zeros
            h_flat, h_sizes = None, torch.zeros(num, dtype=torch.long)
        if self.augment is not None:
            self.augment.check(tuple(ds.train_x.shape[1:]))
        self.data = FederatedData(
            augment=self.augment,
            train_x=ds.train_x,
            train_y=ds.train_y,
            test_x=ds.test_x,
            test_y=ds.test_y,
            client_index=None,
            client_flat=train,  # the clients' positions flat (CSR with the sizes): never N x the largest client
            client_sizes=sizes,
            holdout_index=None,
            holdout_flat=h_flat,
            holdout_sizes=h_sizes,
            label_counts=(torch.zeros(num, 0, dtype=torch.long) if regression
                          else label_counts_flat(ds.train_y, train, sizes, ds.num_classes)),
            num_classes=ds.num_classes,
            val_index=val_index,
            client_val_index=None,
            client_val_flat=cv_flat,
            client_val_sizes=cv_sizes,
            notes=frozenset(n for n, yes in (("test_from_clients", ds.test_groups is not None),
                                             ("val_from_clients", val_index is not None and ds.train_groups is not None)) if yes),
        )
        return self.data

    def _sampled_test_devices(self, ds: DatasetTensors) -> DatasetTensors:
        """``ds`` with its test set the test shares of ``test_devices`` sampled devices (``dataset='synthetic'``), the
        same devices as with ``lazy`` (:func:`lfed.data.lazy.evaluation_devices`); ``ds`` itself otherwise."""
        if self.synthetic is None or self.test_devices is None:
            return ds
        from lfed.data.lazy import evaluation_devices

        keep = torch.isin(ds.test_groups, evaluation_devices(self.num_clients, self.test_devices, self.seed))
        return DatasetTensors(ds.name, ds.train_x, ds.train_y, ds.test_x[keep], ds.test_y[keep], ds.num_classes,
                              train_groups=ds.train_groups, test_groups=ds.test_groups[keep])

    @property
    def sample_shape(self) -> Sequence[int]:
        """Shape of one input example."""
        return tuple(self.build().train_x.shape[1:])

    def state_dict(self) -> dict:
        """What the clients' data is, for checkpoints: its size, seed, partition and fingerprint, and a digest of the
        clients' sizes (recomputed from the settings and the data, so no per-client array is stored: a checkpoint of
        lfed 0.5 held ``client_sizes [N]``, 8 bytes a client)."""
        from lfed.state.fingerprint import data_fingerprint

        d = self.build()
        return {
            "num_clients": d.num_clients,
            "client_sizes_digest": d.digests()["client_sizes"],
            "seed": self.seed,
            "partition": self.partition,
            "fingerprint": data_fingerprint(self),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Nothing to restore (the partition is rebuilt from its seed); refuse another split.

        The clients' sizes are compared too: by their digest (``client_sizes_digest``), or, in a checkpoint of lfed
        0.5 or earlier, by the array it stored (``client_sizes``).

        Raises:
            ValueError: If the checkpoint's clients were split differently (another dataset,
                number of clients, partition, seed, or other example indices), naming each difference.
        """
        from lfed.state.fingerprint import data_fingerprint, tensor_digest, verify_fingerprint

        saved = state_dict.get("fingerprint")
        current = data_fingerprint(self, saved)
        sizes = state_dict.get("client_sizes_digest")
        if sizes is None and isinstance(state_dict.get("client_sizes"), Tensor):  # lfed <= 0.5: the array itself
            sizes = tensor_digest(state_dict["client_sizes"].long())
        if saved is not None and sizes is not None:
            saved = {**saved, "data.client_sizes_digest": sizes}
            current = {**current, "data.client_sizes_digest": self.build().digests()["client_sizes"]}
        verify_fingerprint(saved, current, "the checkpoint's data")
