"""Building a large population: partition and ``FederatedDataModule.build`` seconds as N grows.

Synthetic labels (10 classes), ``--examples`` examples per client, each partition scheme and the
data module's build (partition, held-out split, packing, label counts), each in a fresh process,
repeats interleaved, each started on a quiet machine (:mod:`harness`), medians shown. Compare two versions of lfed by running it with each on
``PYTHONPATH``:

    python benchmarks/population_build.py --clients 10000,100000 --repeats 3

``--cpu``: the build alone (held-out share 0 and 0.2, 8 features), its process CPU seconds and the peak RSS it adds
(``ru_maxrss`` after it minus before), each in a fresh process: figures for a shared machine (issue 65), e.g.
``QUIET_WAIT=0 nice python benchmarks/population_build.py --cpu --clients 1000000 --repeats 2``.

``--checkpoint``: the size of a Lightning checkpoint of issue 65's job (FedAvg, MLP 16-32-10, K = 100, one round,
``Trainer.save_checkpoint``), its largest entry, and the CPU seconds of the save and of the data module's
``load_state_dict`` (what a resume checks of the data).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import harness


def one(N: int, n: int) -> dict:
    import torch

    from lfed.data import partition as P
    from lfed.lightning.datamodule import FederatedDataModule

    g = torch.Generator().manual_seed(0)
    x = torch.randn(N * n + 100, 8, generator=g)
    y = torch.randint(0, 10, (N * n + 100,), generator=g)
    out = {}
    for scheme, kw in [("iid", {}), ("shards", {}), ("dirichlet", {"rho": 0.5}), ("classes", {})]:
        with harness.stopwatch() as sw:
            P.partition(y[100:], N, scheme, seed=0, **kw)
        out[scheme] = sw.seconds
    for holdout in (0.0, 0.2):
        dm = FederatedDataModule.from_tensors(x[100:], y[100:], x[:100], y[:100], num_clients=N, partition="iid",
                                              holdout_fraction=holdout, num_classes=10)
        with harness.stopwatch() as sw:
            dm.build()
        out[f"build (holdout {holdout})"] = sw.seconds
    return out


def one_cpu(N: int, n: int, holdout: float) -> dict:
    import resource
    import time

    import torch

    from lfed.lightning.datamodule import FederatedDataModule

    g = torch.Generator().manual_seed(0)
    x = torch.randn(N * n + 100, 8, generator=g)
    y = torch.randint(0, 10, (N * n + 100,), generator=g)
    dm = FederatedDataModule.from_tensors(x[100:], y[100:], x[:100], y[:100], num_clients=N, partition="iid",
                                          holdout_fraction=holdout, num_classes=10)
    rss, cpu = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.process_time()
    dm.build()
    cpu, rss = time.process_time() - cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss
    return {"build CPU s": cpu, "peak RSS added GB": rss / 2**20}  # ru_maxrss: KiB on Linux


def one_checkpoint(N: int, n: int) -> dict:
    import io
    import tempfile
    import time
    import warnings

    import torch
    from lightning.pytorch import Trainer

    from lfed.lightning.datamodule import FederatedDataModule
    from lfed.lightning.module import FederatedModule
    from lfed.models import MLP

    warnings.filterwarnings("ignore")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N * n + 100, 16, generator=g)
    y = torch.randint(0, 10, (N * n + 100,), generator=g)
    dm = FederatedDataModule.from_tensors(x[100:], y[100:], x[:100], y[:100], num_clients=N, partition="iid",
                                          holdout_fraction=0.0, num_classes=10)
    module = FederatedModule(MLP(16, [32], 10), fraction=min(1.0, 100 / N),
                             training=dict(client_lr=0.1, batch_size=5, local_steps=1))
    with tempfile.TemporaryDirectory() as folder:
        trainer = Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, accelerator="cpu",
                          default_root_dir=folder)
        trainer.fit(module, dm)
        path = os.path.join(folder, "last.ckpt")
        save = time.process_time()
        trainer.save_checkpoint(path)
        save = time.process_time() - save
        size = os.path.getsize(path)
        checkpoint = torch.load(path, weights_only=False, map_location="cpu")

    def saved(v) -> int:
        buffer = io.BytesIO()
        torch.save(v, buffer)
        return buffer.tell()

    largest = max(checkpoint, key=lambda k: saved(checkpoint[k]))
    load = time.process_time()
    dm.load_state_dict(checkpoint["FederatedDataModule"])
    load = time.process_time() - load
    return {"checkpoint MB": size / 1e6, "largest entry": f"{largest} ({saved(checkpoint[largest]) / 1e6:.3f} MB)",
            "save CPU s": save, "data load_state_dict CPU s": load}


def main_checkpoint(args) -> None:
    Ns = [int(v) for v in args.clients.split(",")]
    runs = harness.interleave({N: harness.python([os.path.abspath(__file__), "--one", json.dumps([N, args.examples, "ckpt"])])
                               for N in Ns}, repeats=args.repeats)
    print(f"{harness.machine_line()}, {args.examples} examples/client, {args.repeats} repeats, medians")
    print("| N | checkpoint MB | largest entry | save CPU s | data load_state_dict CPU s |\n|---|---|---|---|---|")
    for N, timing in runs.items():
        parts = [harness.result_line(out) for out in timing.results]
        mb, save, load = (statistics.median(r[k] for r in parts)
                          for k in ("checkpoint MB", "save CPU s", "data load_state_dict CPU s"))
        print(f"| {N:,} | {mb:.3f} | {parts[0]['largest entry']} | {save:.3f} | {load:.3f} |")


def main_cpu(args) -> None:
    Ns = [int(v) for v in args.clients.split(",")]
    jobs = {(N, h): harness.python([os.path.abspath(__file__), "--one", json.dumps([N, args.examples, h])])
            for N in Ns for h in (0.0, 0.2)}
    runs = harness.interleave(jobs, repeats=args.repeats)
    print(f"{harness.machine_line()}, {args.examples} examples/client, {args.repeats} repeats, medians")
    print("| N | held out | build CPU s | peak RSS added GB |\n|---|---|---|---|")
    for (N, h), timing in runs.items():
        parts = [harness.result_line(out) for out in timing.results]
        cpu, rss = (statistics.median(r[k] for r in parts) for k in ("build CPU s", "peak RSS added GB"))
        print(f"| {N:,} | {h} | {cpu:.2f} | {rss:.2f} |")
    print(f"load before each run: {harness.load_range(harness.all_loads(runs.values()))}")


def main() -> None:
    p = harness.parser(__doc__, repeats=3)
    p.add_argument("--clients", default="10000,100000")
    p.add_argument("--examples", type=int, default=5)
    p.add_argument("--cpu", action="store_true", help="the build alone: process CPU seconds and peak RSS added")
    p.add_argument("--checkpoint", action="store_true", help="a one-round run's checkpoint: its size and CPU seconds")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        job = json.loads(args.one)
        if len(job) == 3 and job[2] == "ckpt":
            harness.print_result(one_checkpoint(*job[:2]))
        else:
            harness.print_result(one(*job) if len(job) == 2 else one_cpu(*job))
        return
    if args.quick:
        args.clients, args.repeats = "1000", 1
    if args.cpu or args.checkpoint:
        (main_cpu if args.cpu else main_checkpoint)(args)
        return
    print(f"{harness.machine_line()}, {args.examples} examples/client, {args.repeats} repeats, seconds (median)", flush=True)
    Ns = [int(v) for v in args.clients.split(",")]
    runs = harness.interleave({N: harness.python([os.path.abspath(__file__), "--one", json.dumps([N, args.examples])])
                               for N in Ns}, repeats=args.repeats)
    keys = list(harness.result_line(runs[Ns[0]].results[0]))
    print("| N | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for N in Ns:
        parts = [harness.result_line(out) for out in runs[N].results]
        print(f"| {N:,} | " + " | ".join(f"{statistics.median(r[k] for r in parts):.2f}" for k in keys) + " |")
    print(f"load before each run: {harness.load_range(harness.all_loads(runs.values()))}")


if __name__ == "__main__":
    main()
