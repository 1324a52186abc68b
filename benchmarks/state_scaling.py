"""Client-state placements at scale: memory and time as N grows, per placement (lfed.state.stores).

Synthetic data (Gaussian inputs, labels from a random linear teacher), ``--examples`` examples
per client (IID split), B = 10, E = 1, for SCAFFOLD (``c_k``: one ``[N, P]`` tensor) and EFL with
ternary compression q = 0.1 (Fisher reports ``u_k``, ``v_k`` and compression residuals: three),
with the MLP 64-200-200-10 (55,210 parameters) or the McMahan CIFAR CNN (1,756,426; 32x32x3
inputs). Every setting runs in a fresh process through the public API (FederatedDataModule,
FederatedModule with ``client_state=...``, a quiet Lightning Trainer) and reports:

* set-up: process start to the first round (imports, data, partition, state allocation);
* s/round: median wall-clock of rounds 2..R;
* peak RSS of the process (``resource.getrusage``: ``ru_maxrss``, MB);
* state: bytes the store holds for per-client tensors at the end (``ClientStateStore.nbytes``:
  dense buffers for ``device``; rows allocated plus the ``[N]`` index for ``host``; the same for
  ``disk``, whose rows are in the file, paged in as needed).

A ``device`` setting whose dense state would pass ``--dense-limit-gb`` is not run (reported as
skipped with its size). CPU only (``accelerator="cpu"``). Every run starts on a quiet machine
(:mod:`harness`; its load is in the table); ``--repeats`` interleaves the settings.

    python benchmarks/state_scaling.py                                   # the table (1 repeat)
    python benchmarks/state_scaling.py --clients 10000 --cohorts 100 --repeats 3   # round-time ratios
    python benchmarks/state_scaling.py --headline                        # SCAFFOLD, N = 100,000, K = 10, 20 rounds, host
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
import tempfile  # noqa: E402

import harness  # noqa: E402

#: Per-client tensors of P numbers each algorithm keeps.
LAZY_TENSORS = {"scaffold": 1, "efl": 3}
PARAMS = {"mlp": 55_210, "cifar_cnn": 1_756_426}


def one(cfg: dict) -> dict:
    """Run one setting in this process; return its measurements."""
    os.environ.setdefault("WANDB_MODE", "disabled")
    import torch
    from lightning.pytorch import Callback, Trainer

    from lfed import FederatedDataModule, FederatedModule
    from lfed.models.zoo import MLP, McMahanCIFARCNN

    N, K, n = cfg["N"], cfg["K"], cfg["n"]
    shape = (64,) if cfg["model"] == "mlp" else (3, 32, 32)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N * n + 200, *shape, generator=g)
    teacher = torch.randn(x[0].numel(), 10, generator=g)
    y = (x.flatten(1) @ teacher).argmax(1)
    dm = FederatedDataModule.from_tensors(x[200:], y[200:], x[:200], y[:200], num_clients=N, partition="iid",
                                          holdout_fraction=0.0, num_classes=10)
    net = MLP(64, (200, 200), 10) if cfg["model"] == "mlp" else McMahanCIFARCNN()
    extra = ({"channel": 0.1, "objective": {"class_path": "lfed.client.objectives.EFL", "init_args": {"fisher_samples": n}}}
             if cfg["algo"] == "efl" else {})
    module = FederatedModule(net, algorithm=cfg["algo"], fraction=K / N, training=dict(client_lr=0.05, batch_size=10, local_epochs=1),
                             seed=0, engine=dict(client_state=cfg["placement"],
                                                 client_state_dir=cfg.get("dir") if cfg["placement"] == "disk" else None), **extra)
    marks: dict[str, float] = {}
    ends: list[float] = []

    class Clock(Callback):
        def on_train_start(self, *a, **k) -> None:
            marks["start"] = harness.clock()

        def on_train_batch_end(self, *a, **k) -> None:
            ends.append(harness.clock())

    trainer = Trainer(max_steps=cfg["rounds"], accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0, callbacks=[Clock()], default_root_dir=cfg.get("dir"))
    trainer.fit(module, datamodule=dm)
    rounds = [b - a for a, b in zip([marks["start"]] + ends[:-1], ends)]
    state = sum(v for k, v in module.store.nbytes().items() if k.split(".")[1] != "scores")
    module.store.close()
    return {
        **cfg, "P": module.layout.num_params, "setup_s": marks["start"] - T_START,
        "round_s": statistics.median(rounds[1:]) if len(rounds) > 1 else rounds[0],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "state_mb": state / 2**20,
        "threads": torch.get_num_threads(),
    }


def run(cfg: dict) -> dict | str:
    """``one(cfg)`` in a fresh process: its result, or the reason it failed."""
    env = dict(os.environ, WANDB_MODE="disabled")
    with tempfile.TemporaryDirectory(prefix="lfed-state-") as d:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", json.dumps({**cfg, "dir": d})],
                              capture_output=True, text=True, env=env)
    if proc.returncode != 0 or harness.RESULT not in proc.stdout:
        return "failed: " + ((proc.stderr or proc.stdout).strip().splitlines() or ["?"])[-1]
    return harness.result_line(proc.stdout)


def main() -> None:
    p = harness.parser(__doc__, repeats=1, out=None, out_flags=("--json",))
    p.add_argument("--clients", default="1000,10000,100000")
    p.add_argument("--cohorts", default="10,100")
    p.add_argument("--algorithms", default="scaffold,efl")
    p.add_argument("--models", default="mlp")
    p.add_argument("--placements", default="device,host,disk")
    p.add_argument("--examples", type=int, default=5, help="examples per client")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--dense-limit-gb", type=float, default=6.0, help="skip device settings whose dense state is larger")
    p.add_argument("--headline", action="store_true", help="SCAFFOLD, N = 100,000, MLP, K = 10, 20 rounds, host")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        harness.print_result(one(json.loads(args.one)))
        return
    if args.quick:
        args.clients, args.cohorts, args.algorithms, args.placements, args.rounds = "100", "10", "scaffold", "device,host", 2
    if args.headline:
        args.clients, args.cohorts, args.algorithms, args.models, args.placements, args.rounds = "100000", "10", "scaffold", "mlp", "host", 20
    settings = [dict(algo=a, model=m, N=int(N), K=int(K), placement=pl, n=args.examples, rounds=args.rounds)
                for m in args.models.split(",") for a in args.algorithms.split(",") for N in args.clients.split(",")
                for K in args.cohorts.split(",") for pl in args.placements.split(",")]
    print(f"{harness.machine_line()}, CPU only; {args.examples} examples/client, {args.rounds} rounds, "
          f"{args.repeats} repeat(s)", flush=True)
    results: dict[int, list] = {}
    torun = {}
    for i, cfg in enumerate(settings):
        dense_gb = LAZY_TENSORS[cfg["algo"]] * cfg["N"] * PARAMS[cfg["model"]] * 4 / 2**30
        if cfg["placement"] == "device" and dense_gb > args.dense_limit_gb:
            results[i] = [f"skipped: dense state {dense_gb:,.1f} GB"]
        else:
            torun[i] = lambda cfg=cfg: run(cfg)
    for i, t in harness.interleave(torun, repeats=args.repeats).items():
        results[i] = [r if isinstance(r, str) else {**r, "load": load} for r, load in zip(t.results, t.loads)]
    print("| algorithm | model | N | K | placement | set-up (s) | s/round | peak RSS (MB) | state (MB) | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    out = []
    for i, cfg in enumerate(settings):
        ok = [r for r in results[i] if isinstance(r, dict)]
        head = f"| {cfg['algo']} | {cfg['model']} | {cfg['N']:,} | {cfg['K']} | {cfg['placement']} |"
        if not ok:
            print(f"{head} {results[i][0]} | | | | | |")
            continue
        med = {k: statistics.median(r[k] for r in ok) for k in ("setup_s", "round_s", "peak_rss_mb", "state_mb")}
        loads = "/".join(f"{r['load']:.1f}" for r in ok)
        print(f"{head} {med['setup_s']:.1f} | {med['round_s']:.4f} | {med['peak_rss_mb']:,.0f} | {med['state_mb']:,.1f} | {loads} |")
        out.append({**cfg, **med, "runs": ok})
    # host/disk round time over device at each setting where both ran
    for i, cfg in enumerate(settings):
        if cfg["placement"] == "device":
            continue
        base = [j for j, c in enumerate(settings) if c["placement"] == "device" and all(c[k] == cfg[k] for k in ("algo", "model", "N", "K"))]
        a = [r["round_s"] for r in results[i] if isinstance(r, dict)]
        b = [r["round_s"] for j in base for r in results[j] if isinstance(r, dict)]
        if a and b:
            print(f"# {cfg['algo']} {cfg['model']} N={cfg['N']:,} K={cfg['K']}: {cfg['placement']}/device s/round = "
                  f"{statistics.median(a) / statistics.median(b):.2f}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
