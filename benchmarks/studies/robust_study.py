"""Byzantine robustness under a fair protocol (issue 52): every rule against every attack, the worst case per rule.

    LFED_DATA_DIR=/work/shared/data nice -n 19 python benchmarks/studies/robust_study.py           # the study (cached)
    LFED_DATA_DIR=/work/shared/data python benchmarks/studies/robust_study.py --quick               # a smoke test

The setting is ``configs/paper/robust/mnist.yaml`` (MNIST, 15 clients all every round, 2 local steps of batch 32,
MLP 784-64-10, 30 rounds: small, so that its 2,376 runs fit a 2-core CPU in about an hour). The protocol, ByzFL's
(Gonzalez et al. 2025) on this CPU's budget:

1. For each rule, heterogeneity (IID, Dirichlet 1, Dirichlet 0.1) and Byzantine share ``f`` (0.1, 0.2 of the 15
   clients: 2 and 3, each rule told that ``f``), every attack runs at every client learning rate of ``LRS`` with the
   first seed. The rule's learning rate is the one whose **worst validation accuracy over the attacks** is highest
   (the last-10% mean on the server's validation split, never the test set): the defender tunes once, and the
   adversary then picks the attack.
2. That learning rate runs every attack with the other seeds (the seed changes the partition, the Byzantine set,
   the initial model and the batches).
3. Reported: test accuracy over the last 10% of rounds, mean ± std over the 3 seeds, per attack; the **worst case** per
   rule (the minimum over attacks of the seed means); and the clean run (no attack, the rule's own best learning rate).

Runs train together as groups (``lfed grid``'s engine, ``paper_results.Runner.train_together``), one group per
heterogeneity, ``f`` and seed, and are cached in ``benchmarks/results/robust/run_cache.jsonl`` (one line a run): a rerun reads them unless
the config's parsed settings changed (a comment edited does not count: ``paper_results.inputs_fingerprint``). The
cache does not fingerprint lfed's code: after a change to a rule or an attack, move the cache aside to retrain. The
tables go into RESULTS.md between ``<!-- robust:mnist -->`` markers. Not part of the test suite.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # studies/, the harness
import harness  # noqa: E402
from paper_results import REPO, Runner, git_head  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "robust"
BASE = REPO / "configs" / "paper" / "robust" / "mnist.yaml"
LRS = [0.1, 0.3]
SEEDS = [0, 1, 2]
SHARES = [0.1, 0.2]
HETEROGENEITY = {"IID": ["--data.partition=iid"], "Dir(1)": ["--data.partition=dirichlet", "--data.rho=1.0"],
                 "Dir(0.1)": ["--data.partition=dirichlet", "--data.rho=0.1"]}


def _rule(path: str, **init: object) -> str:
    return json.dumps({"class_path": f"lfed.robust.rules.{path}", "init_args": init}) if init else path


RULES = {  # label -> the combination setting (f: the attack's, each rule told the run's Byzantine count)
    "mean": "mean",
    "median": "median",
    "trimmed mean": "trimmed_mean",
    "Krum": "krum",
    "Multi-Krum": "multi_krum",
    "Bulyan": "bulyan",
    "geometric median": "geometric_median",
    "centered clipping": _rule("CenteredClipping", tau=1.0),
    "bucketing + median": _rule("Bucketing", rule="median", bucket_size=2),
    "bucketing + trimmed mean": _rule("Bucketing", rule="trimmed_mean", bucket_size=2),
    "NNM + median": _rule("NearestNeighborMixing", rule="median"),
    "NNM + Krum": _rule("NearestNeighborMixing", rule="krum"),
}
ATTACKS = {"sign flip": "SignFlip", "Gaussian": "Gaussian", "label flip": "LabelFlip", "ALIE": "ALIE", "IPM": "IPM",
           "min-max": "MinMax", "Mimic": "Mimic"}


#: f Byzantine clients that send their honest updates (the base Attack crafts nothing): the rule told f, no attack
HONEST = "honest (told f)"


def attack(name: str, f: float) -> str:
    cls = "base.Attack" if name == HONEST else ATTACKS[name]
    return json.dumps({"class_path": f"lfed.robust.attacks.{cls}", "init_args": {"fraction": f}})


def job(rule: str, het: str, f: float | None, att: str | None, lr: float, seed: int, rounds: int, every: int):
    args = [*HETEROGENEITY[het], f"--model.combination={RULES[rule]}", f"--model.training.client_lr={lr}",
            f"--trainer.max_steps={rounds}", f"--trainer.val_check_interval={every}", f"--seed_everything={seed}",
            f"--model.seed={seed}", f"--data.seed={seed}"]
    if att is not None:
        args.append(f"--model.attack={attack(att, f)}")
    name = f"robust/{het}/{rule}/{att or 'none'}/f{f or 0}/lr{lr:g}/seed{seed}/{rounds}r"
    return name, [BASE], args


def feasible(rule: str, f: float | None, clients: int = 15) -> bool:
    """Whether ``rule``'s requirement holds with ``⌈f · K⌉`` Byzantine updates of ``K`` (bucketing + Krum does not at
    f = 0.2 of 15: 8 buckets, Krum needs 9)."""
    from lfed.core.registry import build_component

    spec = RULES[rule]
    comb = build_component("combination", spec) if not spec.startswith("{") else build_component(
        "combination", json.loads(spec)["class_path"], **json.loads(spec)["init_args"])
    return clients >= comb.min_inputs(math.ceil((f or 0) * clients - 1e-9)) if getattr(comb, "takes_f", False) else True


def val(run) -> float:
    v = run.summary.get("final/val_acc_last10pct")
    return -math.inf if v is None or "diverged_at_round" in run.extra or not math.isfinite(v) else float(v)


def test_acc(run) -> float:
    return math.nan if "diverged_at_round" in run.extra else run.last10


def main() -> None:
    p = harness.parser(__doc__, quick_help="2 rules, 2 attacks, IID, 4 rounds, 2 seeds; no RESULTS.md",
                       description=__doc__.split("\n")[0])
    p.add_argument("--data_dir", default=os.environ.get("LFED_DATA_DIR", str(REPO.parent / "shared" / "data")))
    a = p.parse_args()
    rules = ["mean", "Krum"] if a.quick else list(RULES)
    attacks = ["sign flip", "ALIE"] if a.quick else list(ATTACKS)
    hets = ["IID"] if a.quick else list(HETEROGENEITY)
    seeds = SEEDS[:2] if a.quick else SEEDS
    rounds, every = (4, 2) if a.quick else (30, 5)
    start = harness.clock()
    log = print
    runner = Runner(Path(a.data_dir), OUT / "work", log, cache=None if a.quick else OUT / "run_cache")

    def run(*key):
        return runner.run(*job(*key, rounds, every))

    def together(keys):
        jobs = [job(*k, rounds, every) for k in keys]
        if any(not runner.is_cached(*j) for j in jobs):
            runner.train_together(jobs)

    chosen: dict[tuple, float] = {}
    for het in hets:  # 1. every attack at every lr, first seed; the lr of the best worst case
        for f in SHARES:
            together([(r, het, f, t, lr, seeds[0]) for r in rules if feasible(r, f) for t in attacks for lr in LRS])
            for r in [r for r in rules if feasible(r, f)]:
                chosen[(r, het, f)] = max(LRS, key=lambda lr: min(val(run(r, het, f, t, lr, seeds[0])) for t in attacks))
        together([(r, het, None, None, lr, seeds[0]) for r in rules for lr in LRS])  # clean: its own best lr
        for r in rules:
            chosen[(r, het, None)] = max(LRS, key=lambda lr: val(run(r, het, None, None, lr, seeds[0])))
    for het in hets:  # 2. the chosen lrs on the other seeds; the rule told f without an attack, at its lr, every seed
        for seed in seeds[1:]:
            together([(r, het, f, t, chosen[(r, het, f)], seed) for r in rules for f in SHARES if feasible(r, f)
                      for t in attacks]
                     + [(r, het, None, None, chosen[(r, het, None)], seed) for r in rules])
        for seed in seeds:
            together([(r, het, f, HONEST, chosen[(r, het, f)], seed) for r in rules for f in SHARES if feasible(r, f)])
    table = {}
    for het in hets:
        for f in [None, *SHARES]:
            for r in rules:
                for t in ([None] if f is None else [*attacks, HONEST]):
                    if not feasible(r, f):
                        continue
                    accs = [test_acc(run(r, het, f, t, chosen[(r, het, f)], s)) for s in seeds]
                    table[(het, f, r, t)] = accs
    minutes = (harness.clock() - start) / 60
    text = report(table, chosen, rules, attacks, hets, seeds, rounds, minutes, runner.trained)
    print(text)
    if not a.quick:
        (OUT / "robust_mnist.md").write_text(text)
        write_results(text)


def _ms(xs: list[float]) -> tuple[float, float]:
    ok = [x for x in xs if math.isfinite(x)]
    if len(ok) < len(xs) or not ok:
        return math.nan, math.nan
    return statistics.fmean(ok), (statistics.stdev(ok) if len(ok) > 1 else 0.0)


def _cell(xs: list[float]) -> str:
    m, s = _ms(xs)
    return "diverged" if not math.isfinite(m) else f"{100 * m:.1f} ± {100 * s:.1f}"


def report(table, chosen, rules, attacks, hets, seeds, rounds, minutes, trained) -> str:
    lines = []
    for het in hets:
        for f in SHARES:
            lines += ["", f"#### {het}, f = {f:g} ({round(f * 15)} of 15 clients Byzantine)", "",
                      "| rule | lr | " + " | ".join(attacks) + " | **worst case** | no attack, told f | clean, f = 0 |",
                      "|---|---|" + "---|" * len(attacks) + "---|---|---|"]
            for r in rules:
                if not feasible(r, f):
                    lines.append(f"| {r} | – | " + " | ".join("n/a" for _ in attacks) + " | n/a (K too small for f) | – | – |")
                    continue
                means = [_ms(table[(het, f, r, t)])[0] for t in attacks]
                worst = min((m if math.isfinite(m) else 0.0) for m in means)
                worst_name = attacks[[(m if math.isfinite(m) else 0.0) for m in means].index(worst)]
                lines.append(f"| {r} | {chosen[(r, het, f)]:g} | " + " | ".join(_cell(table[(het, f, r, t)]) for t in attacks)
                             + f" | **{100 * worst:.1f}** ({worst_name}) | {_cell(table[(het, f, r, HONEST)])} | "
                             f"{_cell(table[(het, None, r, None)])} |")
    lines += ["", f"Test accuracy (%) over the last 10% of {rounds} rounds, mean ± std over seeds {seeds}; lr: the client "
              f"learning rate chosen by the best worst-case validation accuracy over the attacks (first seed); no attack, told f: "
              f"the rule with its f and the Byzantine clients sending their honest updates, at that lr (the price of "
              f"robustness); clean, f = 0: no Byzantine client and f = 0 (trimmed mean, Multi-Krum, Bulyan and NNM are then "
              f"the mean), at its own best lr. {trained} runs trained by this invocation in {minutes:.0f} "
              f"minutes (lfed {git_head()}); `python benchmarks/studies/robust_study.py`."]
    return "\n".join(lines)


def write_results(text: str) -> None:
    path = REPO / "RESULTS.md"
    body = path.read_text()
    start, end = "<!-- robust:mnist -->", "<!-- /robust:mnist -->"
    if start in body:
        head, rest = body.split(start, 1)
        body = head + start + "\n" + text.strip() + "\n" + end + rest.split(end, 1)[1]
    else:
        body += f"\n{start}\n{text.strip()}\n{end}\n"
    path.write_text(body)


if __name__ == "__main__":
    main()
