"""Scaling: seconds per round and memory as the number of clients N and the cohort size K grow.

Synthetic data (Gaussian inputs of 64 features, labels from a random linear teacher), ``n``
examples per client (IID split), an MLP 64-200-200-10 (55,210 parameters), B = 10, E = 1, for
``fedavg`` and ``scaffold`` (whose control variates ``c_k`` are ``N x P`` numbers). Every setting
runs in a fresh process through the public API (FederatedDataModule.from_tensors,
FederatedModule, a quiet Lightning Trainer), started on a quiet machine (:mod:`harness`; ``--repeats``: the
settings interleaved, medians shown), and reports:

* set-up: process start to the first round (imports, data, partition, state allocation);
* s/round: median wall-clock of rounds 2..R;
* peak RSS of the process (``resource.getrusage``, MB);
* per-client state: bytes of the module's tensors with one row per client (``N x ...``).

    python benchmarks/scaling.py                           # N = 100, 1,000, 10,000 at K = 10; K = 10..1,000 at N = 1,000
    python benchmarks/scaling.py --clients 100,1000 --cohorts 10,100 --rounds 5
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import harness  # noqa: E402


def one(cfg: dict) -> dict:
    """Run one setting in this process; return its measurements."""
    os.environ.setdefault("WANDB_MODE", "disabled")
    import torch
    from lightning.pytorch import Callback, Trainer

    from lfed import FederatedDataModule, FederatedModule  # first: lfed's OpenMP defaults before torch loads
    from lfed.models.zoo import MLP

    if cfg.get("threads"):
        torch.set_num_threads(cfg["threads"])
    N, K, n, d = cfg["N"], cfg["K"], cfg["n"], 64
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(d, 10, generator=g)
    x = torch.randn(N * n + 1000, d, generator=g)
    y = (x @ teacher).argmax(1)
    dm = FederatedDataModule.from_tensors(x[1000:], y[1000:], x[:1000], y[:1000], num_clients=N, partition="iid",
                                          holdout_fraction=0.0, num_classes=10)
    module = FederatedModule(MLP(d, (200, 200), 10), algorithm=cfg["algo"], fraction=K / N,
                             training=dict(client_lr=0.05, batch_size=10, local_epochs=1), seed=0)
    marks: dict[str, float] = {}
    ends: list[float] = []

    class Clock(Callback):
        def on_train_start(self, *a, **k) -> None:
            marks["start"] = harness.clock()

        def on_train_batch_end(self, *a, **k) -> None:
            ends.append(harness.clock())

    trainer = Trainer(max_steps=cfg["rounds"], accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0, callbacks=[Clock()])
    trainer.fit(module, datamodule=dm)
    rounds = [b - a for a, b in zip([marks["start"]] + ends[:-1], ends)]
    state = sum(b.numel() * b.element_size() for _, b in module.named_buffers() if b.dim() >= 1 and b.shape[0] == N)
    return {
        **cfg, "P": module.layout.num_params, "setup_s": marks["start"] - T_START,
        "round_s": statistics.median(rounds[1:]) if len(rounds) > 1 else rounds[0], "first_round_s": rounds[0],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "client_state_mb": state / 2**20,
        "backend": module.engine.backend, "threads": torch.get_num_threads(),
    }


def run(cfg: dict) -> dict | str:
    """``one(cfg)`` in a fresh process: its result, or the reason it failed."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", json.dumps(cfg)],
                          capture_output=True, text=True, env=dict(os.environ, WANDB_MODE="disabled"))
    if proc.returncode != 0 or harness.RESULT not in proc.stdout:
        return "failed: " + ((proc.stderr or proc.stdout).strip().splitlines() or ["?"])[-1]
    return harness.result_line(proc.stdout)


def main() -> None:
    p = harness.parser(__doc__, repeats=1, out=None, out_flags=("--json",))
    p.add_argument("--clients", default="100,1000,10000", help="N values (at --k)")
    p.add_argument("--k", type=int, default=10, help="cohort size of the N sweep")
    p.add_argument("--cohorts", default="10,100,1000", help="K values (at --n-for-k clients)")
    p.add_argument("--n-for-k", type=int, default=1000)
    p.add_argument("--examples", type=int, default=20, help="examples per client")
    p.add_argument("--algorithms", default="fedavg,scaffold")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        harness.print_result(one(json.loads(args.one)))
        return
    if args.quick:
        args.clients, args.cohorts, args.n_for_k, args.algorithms, args.rounds = "100", "10", 100, "fedavg", 2
    settings = [(a, int(N), args.k) for a in args.algorithms.split(",") for N in args.clients.split(",") if N]
    settings += [(a, args.n_for_k, int(K)) for a in args.algorithms.split(",") for K in args.cohorts.split(",") if K
                 and (a, args.n_for_k, int(K)) not in settings]
    print(f"{harness.machine_line()}; {args.examples} examples/client, {args.rounds} rounds", flush=True)
    runs = harness.interleave(
        {(algo, N, K): (lambda algo=algo, N=N, K=K: run({"algo": algo, "N": N, "K": K, "n": args.examples, "rounds": args.rounds,
                                                        "threads": args.threads})) for algo, N, K in settings},
        repeats=args.repeats)
    print("| algorithm | N | K | set-up (s) | s/round | peak RSS (MB) | per-client state (MB) |")
    print("|---|---|---|---|---|---|---|")
    results = []
    for (algo, N, K), t in runs.items():
        ok = [r for r in t.results if isinstance(r, dict)]
        if not ok:
            print(f"| {algo} | {N:,} | {K:,} | {t.results[0]} | | | |")
            continue
        results += ok
        med = {k: statistics.median(r[k] for r in ok) for k in ("setup_s", "round_s", "peak_rss_mb", "client_state_mb")}
        print(f"| {algo} | {N:,} | {K:,} | {med['setup_s']:.2f} | {med['round_s']:.4f} | {med['peak_rss_mb']:,.0f} | "
              f"{med['client_state_mb']:,.1f} |", flush=True)
    print(f"load before each run: {harness.load_range(harness.all_loads(runs.values()))}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
