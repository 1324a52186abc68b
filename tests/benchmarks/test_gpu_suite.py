"""benchmarks/gpu_suite.py in --quick mode on the CPU: the GPU check of issue 28 cannot rot.

The suite runs as its own process, as it will on a GPU machine; the test reads its JSON and fails
when a correctness check failed, a section or a timing case raised, or a timing is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

from conftest import REPO

SUITE = REPO / "benchmarks" / "gpu_suite.py"

#: The checks the suite must run (name prefixes), each with its tolerance and the max difference seen.
CHECKS = [
    "vmap vs loop, float64: quickstart MLP (FedAvg)",
    "vmap vs loop, float64: SmallCNN scaffold",
    "vmap vs loop, float64: SmallCNN igfl_s_time",
    "vmap vs loop, float64: SmallCNN efl",
    "quickstart float32: cpu vs cpu",
    "stop at 3, resume to 6 on cpu: efl",
    "client_state host vs device on cpu: scaffold",
    "robust rules and attacks, float64: cpu vs cpu",
    "BatchNorm ResNet-20 with augmentation, float64: vmap and loop on cpu vs vmap on cpu",
]


def test_quick_suite_on_the_cpu_passes_every_check_and_times_every_case(tmp_path):
    out = tmp_path / "suite"
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(SUITE), "--device", "cpu", "--quick", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert (out / "gpu_suite.json").is_file() and (out / "gpu_suite.md").is_file()
    r = json.loads((out / "gpu_suite.json").read_text())
    assert r["exit_status"] == 0 and r["quick"] and r["device"] == "cpu"
    secs = r["sections"]
    assert set(secs) == {"environment", "correctness", "setup", "host_sync", "timing", "profile", "compile_graphs", "precision",
                         "lora", "personal_eval", "resnet", "dp_sgd"}
    for name, sec in secs.items():
        assert sec["status"] == "ok", (name, sec.get("error"))

    # issue 53's GPU rows (a BatchNorm ResNet's cohort on vmap against the loop and the centralized step, with and without
    # augmentation), here at --quick's size: every variant timed, the ratios consistent, the table written
    cases = {c["name"]: c for c in secs["resnet"]["cases"]}
    assert set(cases) == {"lfed vmap", "lfed loop", "centralized", "lfed vmap, crop_flip"}
    assert cases["centralized"]["vs_centralized"] == 1.0 and cases["lfed loop"]["vs_loop"] == 1.0
    for case in cases.values():
        assert case["s_per_call"] > 0
        assert abs(case["vs_centralized"] - case["s_per_call"] / cases["centralized"]["s_per_call"]) < 1e-12
    assert "A BatchNorm ResNet's local training" in (out / "gpu_suite.md").read_text()

    # issue 54's GPU rows: example-level DP-SGD in the cohort against Opacus's loop, its noise-free step checked first
    dp = secs["dp_sgd"]
    assert dp["max_diff_vs_opacus_noise0"] < 1e-5 and [c["clients"] for c in dp["cases"]] == [2]
    assert all(c["lfed_s"] > 0 and c["opacus_s"] > 0 for c in dp["cases"])
    assert "Example-level DP-SGD: the vmapped cohort against an Opacus loop" in (out / "gpu_suite.md").read_text()

    env_ = secs["environment"]
    for key in ("python", "torch", "torch_cuda", "cuda_available", "device_name", "threads"):
        assert key in env_, key
    assert env_["torch"] == __import__("torch").__version__
    assert set(env_["imports"]) >= {"lightning", "jsonargparse", "wandb"}
    assert env_["lfed_file"].startswith(str(REPO))  # lfed of this checkout, not an installed one

    checks = secs["correctness"]["checks"]
    for want in CHECKS:
        found = [c for c in checks if c["name"].startswith(want)]
        assert len(found) == 1, (want, [c["name"] for c in checks])
        c = found[0]
        assert c["passed"], c
        assert c["tolerance"] and c["max_diff"] is not None and c["max_diff"] >= 0, c
    assert len(checks) == len(CHECKS)
    resume = next(c for c in checks if c["name"].startswith("stop at 3"))
    assert resume["rounds_done"] == 6 and resume["uninterrupted_run_repeats_bit_for_bit"]

    timing = secs["timing"]
    cases = timing["cases"]
    methods = {(c.get("method"), c.get("cohort")): c for c in cases}
    for cohort in (2, 4):
        for method in ("lfed vmap", "lfed loop", "plain loop", "hand vmap", "centralized"):
            c = methods[(method, cohort)]
            assert c["status"] == "ok", c  # these need nothing but torch and lfed: never skipped at --quick's budget
            assert c["examples_per_round"] == cohort * 20 and c["tflops"] > 0, c
            # TFLOP/s is the round's counted work over its steady seconds
            assert abs(c["tflops"] * 1e12 * c["steady_s_per_round"] - timing["train_flops_per_example"] * cohort * 20) < 1e-3 * (
                timing["train_flops_per_example"] * cohort * 20), c
        for ref in ("plain_loop", "hand_vmap", "centralized"):
            assert methods[("lfed vmap", cohort)][f"vs_{ref}"] > 0
    pfl = methods[("pfl (1 process)", 2)]
    if importlib.util.find_spec("pfl") is None:
        assert pfl["status"] == "skipped" and pfl["reason"].startswith("pfl not importable"), pfl
        assert "steady_s_per_round" not in pfl and "tflops" not in pfl
    else:
        assert pfl["status"] == "ok" and pfl["tflops"] > 0, pfl
    assert {c.get("grid") for c in cases} >= {"group", "sequential"}
    group = next(c for c in cases if c.get("grid") == "group")
    assert group["tflops"] > 0 and group["examples_per_round"] == 3 * 2 * 20
    one = methods[("lfed vmap", 2)]["steady_s_per_round"]
    assert abs(group["throughput_vs_one_run"] - (3 / group["steady_s_per_round"]) * one) < 1e-9 * group["throughput_vs_one_run"]
    for c in cases:
        if c["status"] == "skipped":
            assert c["reason"], c
            continue
        assert c["status"] == "ok", c
        assert c["steady_s_per_round"] > 0 and all(t > 0 for t in c["timed_rounds"]), c
        assert c.get("peak_rss_mib", 0) > 0, c
    assert timing["params"] == 151_882  # PflCNN at 12x12 (1,626,442 at 32x32)
    assert [g["target"].split(",")[0] for g in timing["targets"]] == [
        "lfed vmap / hand vmap", "lfed vmap / centralized", "lfed vmap / centralized", "grid of 3 as one group: throughput >= 3x one run's"]
    assert all(g["value"] is not None and g["value"] > 0 and isinstance(g["met"], bool) for g in timing["targets"])

    setup = secs["setup"]
    child = setup["children"][0]
    for part in ("import_torch_s", "import_lightning_s", "import_lfed_s", "build_s", "fit_to_first_round_s", "first_round_s",
                 "steady_round_s"):
        assert 0 < child[part] < 120, (part, child)
    assert child["lfed_own_s"] == child["build_s"] + child["fit_to_first_round_s"] + child["first_round_s"]
    assert child["to_first_round_s"] > child["import_lightning_s"] + child["lfed_own_s"] - child["first_round_s"]
    assert setup["lfed_own_under_1s"] == (setup["median"]["lfed_own_s"] < 1.0)
    assert len(child["rounds"]) == 3

    sync = secs["host_sync"]
    assert sync["sync_warnings"] == "not applicable on cpu"
    runs = {r["run"].split()[0]: r for r in sync["runs"]}
    assert set(runs) == {"fedavg", "scaffold", "dp_fedavg", "ditto", "lora"}
    for name, r in runs.items():
        if r["status"] == "skipped":
            assert name == "lora" and r["reason"].startswith("peft not importable"), r
            continue
        assert r["status"] == "ok", r
        assert r["sync_warnings_per_round"] == "not applicable on cpu"
        counts = r["local_scalar_dense_per_round"]
        assert len(counts) == 2 and all(isinstance(n, int) and n >= 0 for n in counts), r

    prec = secs["precision"]
    rounds = {c["precision"]: c for c in prec["cases"] if "precision" in c}
    assert set(rounds) == {"32-true", "bf16-mixed"}
    for c in rounds.values():
        assert c["status"] == "ok" and c["steady_s_per_round"] > 0 and c["tflops"] > 0, c
    assert prec["bf16_over_fp32_round"] == rounds["bf16-mixed"]["steady_s_per_round"] / rounds["32-true"]["steady_s_per_round"]
    accs = {r["precision"]: r for r in prec["accuracy"]}
    for r in accs.values():
        assert r["status"] == "ok" and 0 <= r["test_acc"] <= 1 and r["rounds"] == 6, r
    assert prec["acc_bf16_minus_fp32"] == [accs["bf16-mixed"]["test_acc"] - accs["32-true"]["test_acc"]]

    lora = secs["lora"]["cases"]
    assert [c["name"] for c in lora] == ["lfed, K 2", "peft_loop, K 2"]
    if importlib.util.find_spec("peft") is None:
        assert all(c["status"] == "skipped" and c["reason"].startswith("peft not importable") for c in lora), lora
    else:
        assert all(c["status"] == "ok" and c["steady_s_per_round"] > 0 for c in lora), lora
        assert lora[0]["loop_over_lfed"] > 0
        assert lora[0]["client0_max_abs_diff_vs_loop"] < 1e-5 * max(lora[0]["client0_max_abs_w"], 1.0)  # the same updates

    personal = secs["personal_eval"]["cases"]
    assert len(personal) == 1 and personal[0]["status"] == "ok", personal
    assert personal[0]["accuracies_equal"] and personal[0]["vmapped_s"] > 0 and personal[0]["loop_s"] > 0

    prof = secs["profile"]
    assert prof["round_wall_s"] > 0 and prof["top_ops"] and prof["local_steps"] == 2
    variants = {v["variant"]: v for v in secs["compile_graphs"]["variants"]}
    assert variants["eager vmap(grad)"]["ms"] > 0
    assert variants["recorded (make_fx)"]["exact"]  # lfed's replay is the eager step bit for bit
    compiled = next(v for k, v in variants.items() if k.startswith("torch.compile"))
    assert compiled["status"] == "ok" and compiled["ms"] > 0 and "keep" in compiled, compiled
    assert variants["CUDA graph of the recorded step"]["status"] == "skipped"

    md = (out / "gpu_suite.md").read_text()
    for heading in ("## Environment", "## Correctness", "## Timing", "## Profile", "## The vmapped local step", "## Set-up in its parts",
                    "## Host synchronizations per round", "## bf16-mixed against float32", "## LoRA cohort against a peft loop",
                    "## Personalized evaluation of every client"):
        assert heading in md, heading
    assert "PLACEHOLDER" in md and "SYNTHETIC" in md and "FAIL" not in md and "ERROR" not in md
    assert "| TFLOP/s |" in md and "throughput vs one run" in md and "Issue 37's targets" in md
    if importlib.util.find_spec("pfl") is None:
        assert "skipped: pfl not importable" in md


def test_the_pfl_cnn_has_pfl_researchs_parameter_count_and_flops():
    sys.path.insert(0, str(SUITE.parent))
    try:
        from gpu_suite import PflCNN, train_flops_per_example
    finally:
        sys.path.remove(str(SUITE.parent))
    assert sum(p.numel() for p in PflCNN().parameters()) == 1_626_442
    # by hand at 32x32, 2 FLOPs a multiply-add: forward conv1 30*30*32*27 + conv2 28*28*64*288 + fc 12544*128 + 128*10
    # = 16,828,928 multiply-adds; backward twice that except conv1's input gradient (not needed): 2 * 16,828,928 - 777,600
    fwd = 30 * 30 * 32 * 27 + 28 * 28 * 64 * 288 + 12544 * 128 + 128 * 10
    assert train_flops_per_example(32) == 2 * (3 * fwd - 30 * 30 * 32 * 27)
    assert train_flops_per_example(32, batch=1) == train_flops_per_example(32, batch=10)  # per example

