"""Every run says what its bits depend on (issue 63, docs/reproducibility.md): the checkpoint and the run's folder
record the environment; a resume in another environment goes on and says so in one line, naming what differs."""

from __future__ import annotations

import json
import warnings

import torch
from test_checkpoint import checkpoint_dir, fit, load, write_config

import lfed
from lfed.state.environment import BITS_DEPEND_ON, EnvironmentWarning, environment, environment_note


def test_the_record_names_versions_device_capability_threads_and_the_deterministic_setting():
    record = environment()
    assert record["lfed"] == lfed.__version__ and record["torch"].startswith(torch.__version__)
    assert record["device"] == "cpu" and record["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert record["threads"] == torch.get_num_threads()
    assert record["deterministic_algorithms"] == torch.are_deterministic_algorithms_enabled()
    assert "lfed_commit" in record and set(BITS_DEPEND_ON) <= record.keys()
    assert json.loads(json.dumps(record)) == record  # plain values: a checkpoint loads them with weights_only


def test_the_line_names_each_difference_and_another_lfed_version():
    here = environment()
    assert environment_note(here, here) is None
    line = environment_note({**here, "threads": 7, "cpu_capability": "AVX2"}, {**here, "cpu_capability": "AVX512"}, "x.ckpt")
    assert "\n" not in line and line.startswith("resuming x.ckpt in another environment (cpu_capability AVX2 -> AVX512; "
                                                "threads 7 -> ")
    assert "exact in its maths but not in its bits" in line
    line = environment_note({**here, "lfed": "0.5.0"}, {**here, "lfed": "0.6.0"}, "x.ckpt")
    assert "written by lfed 0.5.0, with lfed 0.6.0:" in line
    assert "written by lfed 0.4 or earlier (it records no environment)" in environment_note(None, here, "x.ckpt")


def test_a_run_resumed_with_other_threads_says_so_once_and_goes_on(tmp_path):
    """OMP_NUM_THREADS 1 -> 2 (torch.set_num_threads, as the variable does at start-up): the resume prints one line
    naming the threads and continues to its last round; a resume in the checkpoint's own environment says nothing."""
    config = write_config(tmp_path / "cfg.yaml", "scaffold", rounds=4, every=2)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        fit(config, "--trainer.max_steps=2")
        last = checkpoint_dir(tmp_path / "run") / "last.ckpt"
        saved = load(last)
        assert saved["global_step"] == 2 and saved["lfed"]["environment"]["threads"] == 1
        torch.set_num_threads(2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resumed = fit(config, "--ckpt_path", "last")
        lines = [str(w.message) for w in caught if issubclass(w.category, EnvironmentWarning)]
        assert resumed.trainer.global_step == 4 and load(last)["lfed"]["environment"]["threads"] == 2
        assert len(lines) == 1 and "\n" not in lines[0], lines
        assert lines[0].startswith(f"resuming {last} in another environment (threads 1 -> 2)")
        assert "exact in its maths but not in its bits" in lines[0]
        with warnings.catch_warnings(record=True) as caught:  # written with 2 threads, resumed with 2: no line
            warnings.simplefilter("always")
            again = fit(config, "--trainer.max_steps=6", "--ckpt_path", "last")
        assert again.trainer.global_step == 6 and not [str(w.message) for w in caught if issubclass(w.category, EnvironmentWarning)]
    finally:
        torch.set_num_threads(before)
    records = json.loads((last.parent.parent / "environment.json").read_text())
    assert [(r["from_round"], r["threads"]) for r in records] == [(0, 1), (2, 2), (4, 2)]
    assert all(r["lfed"] == lfed.__version__ and r["cpu_capability"] for r in records)
