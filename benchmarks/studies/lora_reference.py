"""The two rows of the LoRA Shakespeare study that the protocol does not train: the base alone, and bits up.

* **The base alone**: the LoRA config before any round (``B = 0``, so the adapted net *is* the base) evaluated
  by ``lfed test`` on each seed's split (``data.seed`` draws each client's held-out and validation windows),
  the same figures the protocol reports for the trained methods: each client's next-character accuracy and
  perplexity on its own held-out text, mean over clients and the worst 10%.
* **Bits uploaded per round**: one round of each method's config, read off lfed's communication meter
  (``comm/bits_up``: what the clients' uploads cost, as lfed counts them for every run) and divided by the
  round's uploads: bits per client per round, and per round.

    LFED_DATA_DIR=../shared/data python benchmarks/studies/lora_reference.py configs/paper/grids/lora_shakespeare.yaml

Prints a markdown table (RESULTS.md, under the study's section) and writes
``benchmarks/results/protocol/<study>_reference.json``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # studies/, the harness
import harness  # noqa: E402
from paper_protocol import OUT, load_study  # noqa: E402
from paper_results import REPO, Runner  # noqa: E402


def cli_for(configs: list[Path], args: list[str], data_dir: str, workdir: str):
    """The run's CLI built as the protocol builds it (:meth:`paper_results.Runner._args`: the same flags), not run."""
    from lfed.lightning.cli import LfedCLI
    from lfed.lightning.datamodule import FederatedDataModule
    from lfed.lightning.module import FederatedModule

    argv = Runner(Path(data_dir), Path(workdir), print)._args(configs, ["--checkpoint_every=0", *args])
    return LfedCLI(FederatedModule, FederatedDataModule, run=False, args=argv, save_config_callback=None)


def base_alone(study, seed: int, data_dir: str, workdir: str) -> dict[str, float]:
    """The base (``B = 0``) on each client's held-out text of ``seed``'s split."""
    cli = cli_for(list(study.base), [*study.overrides, f"--seed_everything={seed}", f"--model.seed={seed}",
                                               f"--data.seed={seed}"], data_dir, workdir)
    (metrics,) = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
    return {k: float(v) for k, v in metrics.items() if k.startswith(("global/", "global_val/"))}


def bits_per_round(study, method, data_dir: str, workdir: str) -> dict[str, float]:
    """One round of ``method``: lfed's meter's bits up, per round and per upload."""
    cli = cli_for([*study.base, method.config], [*study.overrides, *method.overrides, "--trainer.max_steps=1",
                                                 "--trainer.val_check_interval=1", "--trainer.limit_val_batches=0",
                                                 "--seed_everything=0"], data_dir, workdir)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    comm = cli.model.comm
    return {"uploads": int(comm.round_uploads), "bits_up": float(comm.round_bits_up),
            "bits_per_upload": float(comm.round_bits_up) / max(1, int(comm.round_uploads)),
            "trained_parameters": int(cli.model.layout.num_params)}


def main(argv: list[str] | None = None) -> dict:
    p = harness.parser(__doc__, quick=False, description=__doc__.split("\n\n")[0])
    p.add_argument("study", type=Path, help="the study file (configs/paper/grids/lora_shakespeare*.yaml)")
    p.add_argument("--data-dir", default=os.environ.get("LFED_DATA_DIR"), help="dataset folder (default $LFED_DATA_DIR)")
    args = p.parse_args(argv)
    if args.data_dir is None:
        p.error("--data-dir: give the dataset folder (or set LFED_DATA_DIR)")
    study = load_study(args.study)
    start, load0 = harness.clock(), harness.loadavg()
    with tempfile.TemporaryDirectory() as work:
        base = {seed: base_alone(study, seed, args.data_dir, work) for seed in study.seeds}
        bits = {m.name: bits_per_round(study, m, args.data_dir, work) for m in study.methods}
    import statistics

    def stat(key: str, scale: float = 1.0) -> str:
        xs = [scale * base[s][key] for s in study.seeds]
        return f"{statistics.fmean(xs):.2f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.2f}"

    lines = [f"| the base alone (B = 0, no round) | {stat('global/acc_mean', 100)} | {stat('global/acc_worst10pct', 100)} "
             f"| {stat('global/perplexity_mean')} | {stat('global/perplexity_worst10pct')} |"]
    table = ["| reference | held-out acc (%) mean | worst 10% (%) | perplexity mean | perplexity worst 10% |",
             "|---|---|---|---|---|", *lines, "",
             "| method | trained and uploaded parameters | bits up per client per round | bits up per round (all clients) |",
             "|---|---|---|---|"]
    for name, b in bits.items():
        table.append(f"| {name} | {b['trained_parameters']:,} | {b['bits_per_upload']:,.0f} | {b['bits_up']:,.0f} |")
    print("\n".join(table))
    print(f"({harness.clock() - start:.0f} s, load {load0:.2f} at the start, {harness.loadavg():.2f} at the end)")
    result = {"base_alone": base, "bits": bits, "table": table}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{study.name}_reference.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    assert REPO.is_dir()
    main()
