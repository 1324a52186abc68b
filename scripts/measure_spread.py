"""Measure how far lfed's results move where docs/reproducibility.md promises a tolerance, not bits.

    python scripts/measure_spread.py                # every environment this machine offers, then the table
    python scripts/measure_spread.py --out DIR      # keep each environment's tensors and the table's JSON in DIR
    python scripts/measure_spread.py --out DIR --reuse   # record only the environments DIR lacks, then the table

Each environment is a fresh interpreter with ``ATEN_CPU_CAPABILITY`` in {default, avx2, avx512 where the CPU has
it}, ``OMP_NUM_THREADS`` in {1, 2}, and, to stand in for a CPU of another vendor (MKL picks its GEMM code path
by CPU: the differences a machine of another kind shows), ``MKL_CBWR`` in {COMPATIBLE, AVX2} at the machine's
capability. In each it computes, in float64 and in float32, each model started from the same weights (drawn in
float64 by a seeded generator, so that every environment starts alike):

* ``run.vmap`` / ``run.loop`` / ``run.chunk1``: SCAFFOLD on digits (10 clients, half a round each, MLP 64-32-10,
  4 rounds) through ``build_run`` + ``fit_run`` on the vmap backend, the loop backend, and vmap in chunks of one
  client; the global model and the server control variate;
* ``cohort.chunk8`` / ``cohort.chunk3`` / ``cohort.rank2`` / ``cohort.rank3``: one cohort of 8 clients of a
  wide net with a frozen body (tests/engine/test_fastpaths.py's, 512 wide) on the vmap backend, whole, in chunks
  of 3, and in the shares ranks 2 and 3 of a DDP world train (lfed.engine.ranks.train_share: what each rank
  computes before the all-gather, which moves the rows bit for bit);
* ``fixture.<name>``: each old checkpoint of tests/fixtures resumed to its end (float32, as its config runs), the
  continuation tests/core/test_settings.py compares with the one recorded in the fixture; and
  ``scratch.<name>``, the same run from round 0 on this machine (its initial weights drawn by torch from the seed);
* ``init.mlp`` / ``init.wide``: the models' initial weights as torch draws them from a seed (float32).

Then, per comparison, the largest ``max|a - b| / max|b|`` over the tensors (relative to the tensor's scale) and
the largest ``max|a - b|``: within one environment (vmap against loop, chunks, ranks, a resume against a run
from scratch whose first rounds were computed elsewhere) and across environments (each result against the same
result in the first environment: one machine against another of other kernels and threads).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = {"checkpoint_0_3": 3, "checkpoint_0_4_fedbuff": 6, "checkpoint_0_4_adafl": 6}


def environments() -> list[dict[str, str]]:
    """The environments to compare: the first is the reference (the machine's own capability, 2 threads)."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    caps = ["default"] + (["avx2"] if " avx2" in flags else []) + (["avx512"] if " avx512f" in flags else [])
    own = caps[-1]
    out = [{"ATEN_CPU_CAPABILITY": own, "OMP_NUM_THREADS": "2"}]
    out += [{"ATEN_CPU_CAPABILITY": c, "OMP_NUM_THREADS": t} for c in caps for t in ("1", "2")
            if (c, t) != (own, "2")]
    out += [{"ATEN_CPU_CAPABILITY": own, "OMP_NUM_THREADS": "2", "MKL_CBWR": m} for m in ("COMPATIBLE", "AVX2")]
    return out


def label(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items())


# --------------------------------------------------------------------------- in one environment


def _wide_net():
    import torch
    from torch import nn

    class WideFrozen(nn.Module):  # tests/engine/test_fastpaths.py's _WideFrozen
        def __init__(self, width=512):
            super().__init__()
            self.stem = nn.Linear(6, 4)
            self.body = nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                                      nn.Linear(width, 3))
            for p in self.body.parameters():
                p.requires_grad_(False)

        def forward(self, x):
            return self.body(self.stem(x))

    torch.manual_seed(1)
    return WideFrozen()


def same_start(net, dtype):
    """``net`` in ``dtype`` with every parameter drawn from a float64 generator (uniform in +-1/sqrt(fan-in)): the same
    start in every environment (torch's own initialisation draws in float32 by kernels that differ between ATen's
    DEFAULT and its AVX2/AVX512 capabilities by one float32 ulp: ``init_results`` measures that apart)."""
    import torch

    net = net.to(dtype)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in net.parameters():
            bound = 1.0 / p.shape[-1] ** 0.5
            p.copy_((torch.rand(p.shape, generator=g, dtype=torch.float64) * 2 - 1) * bound)
    return net


def init_results() -> dict:
    """Each model's initial weights as torch draws them from a seed (float32, as built)."""
    import torch

    from lfed.models.zoo import MLP

    torch.manual_seed(0)
    mlp = MLP(in_features=64, hidden=[32], num_classes=10)
    return {name: torch.cat([p.detach().reshape(-1) for p in net.parameters()])
            for name, net in (("init.mlp", mlp), ("init.wide", _wide_net()))}


def cohort_results(dtype) -> dict:
    """The wide cohort of tests/engine/test_fastpaths.py::test_chunks_bound_activations_and_change_nothing."""
    import torch

    from lfed.engine import CohortTrainer, StepRule
    from lfed.engine.ranks import Ranks, TrainJob, train_share

    net = same_start(_wide_net(), dtype)
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(80, 6, generator=g, dtype=dtype), torch.randint(0, 3, (80,), generator=g)
    idx = torch.randperm(80, generator=torch.Generator().manual_seed(1))[:80].view(8, 10)
    steps = torch.tensor([3, 1, 3, 2, 3, 0, 3, 2])

    def job(trainer):
        return TrainJob(trainer.layout.module_vector(net), X, Y, idx, torch.full((8,), 10), steps, StepRule(), 0.1, 4,
                        torch.Generator().manual_seed(5))

    out = {}
    for size in (8, 3):
        trainer = CohortTrainer(net, backend="vmap", chunk_size=size)
        out[f"cohort.chunk{size}"] = job(trainer).train(trainer).weights
    trainer = CohortTrainer(net, backend="vmap", chunk_size=8)
    for world in (2, 3):
        rows = torch.full_like(out["cohort.chunk8"], float("nan"))
        for r in range(world):
            parts, local = train_share(trainer, Ranks(r, world), job(trainer))
            rows[parts[r]] = local.weights
        out[f"cohort.rank{world}"] = rows
    return out


def run_results(dtype) -> dict:
    import torch

    from lfed.core.algorithm import LocalTraining
    from lfed.core.fit import fit_run
    from lfed.core.settings import Engine, build_run
    from lfed.data.federated import FederatedDataset
    from lfed.models.zoo import MLP

    out = {}
    for name, engine in (("vmap", Engine(backend="vmap")), ("loop", Engine(backend="loop")),
                         ("chunk1", Engine(backend="vmap", chunk_size=1))):
        net = same_start(MLP(in_features=64, hidden=[32], num_classes=10), dtype)
        run = build_run(net=net, algorithm="scaffold", fraction=0.5, seed=3, engine=engine,
                        training=LocalTraining(client_lr=0.1, batch_size=8, local_epochs=1))
        data = FederatedDataset(dataset="digits", num_clients=10, partition="dirichlet", rho=0.5, seed=0)
        fit_run(run, data, 4)
        out[f"run.{name}"] = torch.cat([run.layout.module_vector(run.net), run.components.objective.state("control")])
    return out


def fixture_results(root: Path) -> dict:
    """Each old checkpoint resumed to its end, and its run from scratch, as flat state dicts of tensors."""
    import shutil

    import torch

    from lfed.core.settings import upgrade_args
    from lfed.lightning.cli import run_cli

    out = {}
    for name, steps in FIXTURES.items():
        data = REPO / "tests" / "fixtures" / name
        ckpt = root / f"{name}.ckpt"
        shutil.copy(data / "last.ckpt", ckpt)
        config = root / f"{name}.yaml"  # 0.3's spelling upgraded (what scripts/upgrade_configs.py writes)
        config.write_text(upgrade_args(["--config", str(data / "config.yaml")])[0][1] if name.endswith("0_3")
                          else (data / "config.yaml").read_text())
        common = ["--config", str(config), f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={steps}",
                  "--checkpoint_every=0"]
        for kind, extra in (("fixture", ["--ckpt_path", str(ckpt)]), ("scratch", [])):
            cli = run_cli(["fit", *common, f"--trainer.default_root_dir={root / kind / name}", *extra])
            state = cli.model.state_dict()
            out.update({f"{kind}.{name}.{k}": v.detach().clone() for k, v in state.items()
                        if isinstance(v, torch.Tensor) and v.is_floating_point()})
    return out


def record(path: Path) -> None:
    """Every result of this environment into ``path`` (torch.save of a dict of tensors)."""
    import torch

    from lfed.state.environment import environment

    results = {f"{k}@float32": v for k, v in init_results().items()}
    for dtype in (torch.float64, torch.float32):
        tag = str(dtype).removeprefix("torch.")
        results.update({f"{k}@{tag}": v for k, v in {**run_results(dtype), **cohort_results(dtype)}.items()})
    with tempfile.TemporaryDirectory() as tmp:
        results.update({f"{k}@float32": v for k, v in fixture_results(Path(tmp)).items()})
    torch.save({"environment": environment(), "results": results,
                "label": {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "MKL_CBWR") if k in os.environ}},
               path)


# --------------------------------------------------------------------------- across environments


def spread(a, b) -> tuple[float, float]:
    """``(max|a - b| / max|b|, max|a - b|)`` in float64."""
    d = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    scale = float(b.double().abs().max()) if b.numel() else 0.0
    return (d / scale if scale else d), d


def worst(pairs) -> tuple[float, float]:
    rel = ab = 0.0
    for a, b in pairs:
        r, d = spread(a, b)
        rel, ab = max(rel, r), max(ab, d)
    return rel, ab


def compare(files: list[Path]) -> dict:
    import torch

    loaded = [torch.load(f, weights_only=True) for f in files]
    table: dict[str, dict] = {}

    def put(name: str, dtype: str, rel_abs: tuple[float, float]) -> None:
        row = table.setdefault(name, {})
        old = row.get(dtype, (0.0, 0.0))
        row[dtype] = (max(old[0], rel_abs[0]), max(old[1], rel_abs[1]))

    for data in loaded:
        res = data["results"]
        for dtype in ("float64", "float32"):
            put("vmap against loop (SCAFFOLD, 4 rounds)", dtype, worst([(res[f"run.loop@{dtype}"], res[f"run.vmap@{dtype}"])]))
            put("chunks of 1 against the whole cohort (SCAFFOLD, 4 rounds)", dtype,
                worst([(res[f"run.chunk1@{dtype}"], res[f"run.vmap@{dtype}"])]))
            put("chunks of 3 against one chunk of 8 (wide frozen net)", dtype,
                worst([(res[f"cohort.chunk3@{dtype}"], res[f"cohort.chunk8@{dtype}"])]))
            put("ranks' shares (2 and 3 ranks) against one process (wide frozen net)", dtype,
                worst([(res[f"cohort.rank{w}@{dtype}"], res[f"cohort.chunk8@{dtype}"]) for w in (2, 3)]))
        fixture = [(res[k], res[k.replace("fixture.", "scratch.", 1)]) for k in res if k.startswith("fixture.")]
        put("old checkpoint resumed against a run from scratch here", "float32", worst(fixture))
    ref = loaded[0]["results"]
    groups = {
        "the same state, other kernels and threads (the runs and cohorts above)": ("run.", "cohort."),
        "an old checkpoint's continuation": ("fixture.",),
        "a run from scratch (initial weights drawn from the same seed)": ("scratch.",),
        "a model's initial weights drawn from the same seed": ("init.",),
    }
    for data in loaded[1:]:
        res = data["results"]
        for dtype in ("float64", "float32"):
            for name, prefixes in groups.items():
                keys = [k for k in ref if k.endswith(f"@{dtype}") and k.startswith(prefixes)]
                if keys:
                    found = worst((res[k], ref[k]) for k in keys)
                    put(f"one environment against another: {name}", dtype, found)
                    per_env = table.setdefault("by environment", {}).setdefault(label(data["label"]), {})
                    per_env[f"{name} @{dtype}"] = found
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="keep the tensors and the table's JSON here")
    parser.add_argument("--reuse", action="store_true", help="keep the environments already recorded in --out")
    parser.add_argument("--record", type=Path, default=None, help=argparse.SUPPRESS)  # one environment (a child)
    args = parser.parse_args()
    if args.record is not None:
        record(args.record)
        return
    out = args.out or Path(tempfile.mkdtemp(prefix="lfed-spread-"))
    out.mkdir(parents=True, exist_ok=True)
    files, started = [], time.perf_counter()
    for i, env in enumerate(environments()):
        path = out / f"env{i}.pt"
        files.append(path)
        if args.reuse and path.is_file():
            continue
        t = time.perf_counter()
        full = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "OMP_NUM_THREADS")}
        done = subprocess.run([sys.executable, __file__, "--record", str(path)], env={**full, **env,
                              "WANDB_MODE": "disabled"}, cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{label(env)}: failed\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        print(f"recorded {label(env)} ({time.perf_counter() - t:.0f} s)", flush=True)
    table = compare(files)
    (out / "spread.json").write_text(json.dumps({"environments": [label(e) for e in environments()],
                                                 "table": table}, indent=1))
    print(f"\n{len(files)} environments, {time.perf_counter() - started:.0f} s; reference: {label(environments()[0])}")
    print("| comparison | float64 max|Δ|/max|x| (max|Δ|) | float32 max|Δ|/max|x| (max|Δ|) |")
    print("|---|---|---|")
    for name, row in table.items():
        if name == "by environment":
            continue
        cells = [f"{row[d][0]:.2g} ({row[d][1]:.2g})" if d in row else "-" for d in ("float64", "float32")]
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    print("\nagainst the reference, by environment (max|Δ|/max|x|):")
    for env, rows in table.get("by environment", {}).items():
        print(f"  {env}: " + "; ".join(f"{k} {v[0]:.2g}" for k, v in rows.items()))


if __name__ == "__main__":
    main()
