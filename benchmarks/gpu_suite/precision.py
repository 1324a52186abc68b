"""6. bf16-mixed against float32: the timing job's round and the quickstart's accuracy."""

from __future__ import annotations

import traceback

import harness

from .common import _cap, _f, _mem, _status, train_flops_per_example, trainer_for


def run(suite, p: dict) -> None:
    s = suite.s
    k = s.precision_cohort
    p["round_job"] = f"the timing section's job, lfed vmap, cohort {k}: steady s/round under the Trainer's precision"
    flops = getattr(suite, "flops_per_example", None) or train_flops_per_example(s.image_size, s.batch_size)
    suite.flops_per_example = flops
    rounds = {}
    for precision in ("32-true", "bf16-mixed"):
        est = None
        if "32-true" in rounds and rounds["32-true"].get("status") == "ok":
            est = rounds["32-true"]["steady_s_per_round"] * (s.warmup + s.timed) * 2 + 10
        rounds[precision] = suite.timed_case(
            p, {"name": f"lfed vmap, cohort {k}, precision {precision}", "precision": precision, "cohort": k,
                "examples_per_round": k * s.images_per_client},
            lambda pr=precision: suite.lfed_case("vmap", k, precision=pr), est, reserve=False)
    a, b = rounds["bf16-mixed"], rounds["32-true"]
    if a["status"] == "ok" and b["status"] == "ok":
        p["bf16_over_fp32_round"] = a["steady_s_per_round"] / b["steady_s_per_round"]
    p["accuracy_job"] = (f"the quickstart (digits, 20 clients, MLP 64-200-200-10, FedAvg) for {s.precision_rounds} rounds, "
                         f"seeds {s.precision_seeds}: the test accuracy after the last round")
    acc = p.setdefault("accuracy", [])
    for seed in s.precision_seeds:
        for precision in ("32-true", "bf16-mixed"):
            row = {"seed": seed, "precision": precision}
            if suite.budget_left(False) < 15:
                row.update(status="skipped", reason="time budget")
            else:
                try:
                    from lightning.pytorch import seed_everything

                    m = suite.quickstart("auto", seed=seed)
                    seed_everything(seed, verbose=False)
                    with harness.stopwatch() as sw:
                        trainer_for(suite.device, s.precision_rounds, precision, evaluate_every=min(10, s.precision_rounds)).fit(
                            m, datamodule=suite.digits())
                    row.update(status="ok", test_acc=m.eval_history[-1][1], rounds=m.eval_history[-1][0], wall_s=sw.seconds)
                except Exception:  # noqa: BLE001
                    row.update(status="error", error=traceback.format_exc())
            acc.append(row)
            suite.write()
    got = {(r["seed"], r["precision"]): r["test_acc"] for r in acc if r["status"] == "ok"}
    diffs = [got[(sd, "bf16-mixed")] - got[(sd, "32-true")] for sd in s.precision_seeds
             if (sd, "bf16-mixed") in got and (sd, "32-true") in got]
    if diffs:
        p["acc_bf16_minus_fp32"] = diffs
    p["cases"] = p.get("cases", []) + [{"name": f"accuracy seed {r['seed']} {r['precision']}", "status": r["status"]}
                                       for r in acc]


def markdown(pr: dict) -> list[str]:
    """This section's part of gpu_suite.md."""
    L: list[str] = []
    if pr.get("cases"):
        L += ["## bf16-mixed against float32", "", _cap(pr.get("round_job", "")), "", "| case | status | steady s/round | TFLOP/s | peak memory |",
              "| --- | --- | --- | --- | --- |"]
        L += [f"| {c['name']} | {_status(c)} | {_f(c.get('steady_s_per_round'))} | {_f(c.get('tflops'), 3)} | {_mem(c)} |"
              for c in pr["cases"] if "precision" in c]
        L += ["", f"bf16-mixed / 32-true round: {_f(pr.get('bf16_over_fp32_round'), 3)}. {_cap(pr.get('accuracy_job', ''))}:", "",
              "| seed | precision | status | test acc | wall s |", "| --- | --- | --- | --- | --- |"]
        L += [f"| {r['seed']} | {r['precision']} | {_status(r)} | {_f(r.get('test_acc'))} | {_f(r.get('wall_s'), 3)} |"
              for r in pr.get("accuracy", [])]
        L += ["", f"Test accuracy, bf16-mixed minus 32-true per seed: {_f(pr.get('acc_bf16_minus_fp32'))}.", ""]
    return L
