"""benchmarks/gpu_suite.py in --quick mode on the CPU: the GPU check of issue 28 cannot rot.

The suite runs as its own process, as it will on a GPU machine; the test reads its JSON and fails
when a correctness check failed, a section or a timing case raised, or a timing is missing.
"""

from __future__ import annotations

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
    assert set(secs) == {"environment", "correctness", "timing", "profile", "compile_graphs"}
    for name, sec in secs.items():
        assert sec["status"] == "ok", (name, sec.get("error"))

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

    cases = secs["timing"]["cases"]
    methods = {(c.get("method"), c.get("cohort")) for c in cases}
    for cohort in (2, 4):
        assert {("lfed vmap", cohort), ("lfed loop", cohort), ("plain loop", cohort)} <= methods
    assert {c.get("grid") for c in cases} >= {"group", "sequential"}
    for c in cases:
        if c["status"] == "skipped":
            assert c["reason"], c
            continue
        assert c["status"] == "ok", c
        assert c["steady_s_per_round"] > 0 and all(t > 0 for t in c["timed_rounds"]), c
        assert c.get("peak_rss_mib", 0) > 0, c
    assert any(c["status"] == "ok" for c in cases)
    assert secs["timing"]["params"] == 151_882  # PflCNN at 12x12 (1,626,442 at 32x32)

    prof = secs["profile"]
    assert prof["round_wall_s"] > 0 and prof["top_ops"] and prof["local_steps"] == 2
    variants = {v["variant"]: v for v in secs["compile_graphs"]["variants"]}
    assert variants["eager vmap(grad)"]["ms"] > 0
    assert variants["recorded (make_fx)"]["exact"]  # lfed's replay is the eager step bit for bit
    compiled = next(v for k, v in variants.items() if k.startswith("torch.compile"))
    assert compiled["status"] == "ok" and compiled["ms"] > 0 and "keep" in compiled, compiled
    assert variants["CUDA graph of the recorded step"]["status"] == "skipped"

    md = (out / "gpu_suite.md").read_text()
    for heading in ("## Environment", "## Correctness", "## Timing", "## Profile", "## The vmapped local step"):
        assert heading in md
    assert "PLACEHOLDER" in md and "SYNTHETIC" in md and "FAIL" not in md


def test_the_pfl_cnn_has_pfl_researchs_parameter_count():
    sys.path.insert(0, str(SUITE.parent))
    try:
        from gpu_suite import PflCNN
    finally:
        sys.path.remove(str(SUITE.parent))
    assert sum(p.numel() for p in PflCNN().parameters()) == 1_626_442
