"""``lfed audit`` (lfed/lightning/audit.py, issue 51): the privacy audit as a command a user runs, one screen at the end.

The audit's statistics are tested in tests/privacy/test_audit.py; here: the command runs the config's DP-FedAvg run with
canaries of the same settings, reports the claim beside the bound, and refuses what it cannot audit in one line."""

from __future__ import annotations

import sys

import pytest
import yaml
from conftest import REPO

from lfed.lightning.audit import main

DP = REPO / "configs" / "dp_digits.yaml"


def _audit(monkeypatch, capsys, tmp_path, *args: str) -> tuple[int, str, str]:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setattr(sys, "argv", ["lfed", "audit", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


def _quiet_run(tmp_path, config: str, rounds: int) -> list[str]:
    """``--config`` and the Trainer flags of a short run without a progress bar or logger, under ``tmp_path``."""
    return ["--config", str(REPO / "configs" / config), "--trainer.max_steps", str(rounds), "--trainer.enable_progress_bar",
            "false", "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path)]


def _saved_setting(tmp_path, role: str) -> dict:
    """The ``model.<role>`` the audited run saved in its ``config.yaml``."""
    [config] = tmp_path.glob("runs/*/version_0/config.yaml")
    return yaml.safe_load(config.read_text())["model"][role]


def test_the_audit_of_a_dp_run_reports_the_claim_beside_the_bound(monkeypatch, capsys, tmp_path):
    code, out, err = _audit(monkeypatch, capsys, tmp_path, "--config", str(DP), "--trainer.max_steps", "3",
                            "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
                            "--trainer.default_root_dir", str(tmp_path), "--canaries", "20")
    assert code == 0, err
    screen = out[out.index("lfed audit: one-run privacy audit"):].splitlines()
    assert screen[1].startswith("  claimed   ε = ") and "at δ = " in screen[1]
    assert screen[2].startswith("  audited   ε ≥ ") and "at 95% confidence (20 canaries, " in screen[2]
    assert [ln for ln in screen if ln.startswith("  verdict")][0].startswith("  verdict   consistent")
    assert screen[4].startswith("  reach     the largest ε_lower 20 canaries can give")
    combination = _saved_setting(tmp_path, "combination")
    assert combination["class_path"] == "lfed.privacy.audit.CanaryDPFedAvg"  # the config's DP-FedAvg, with canaries
    assert combination["init_args"]["noise_multiplier"] == 0.8 and combination["init_args"]["clip"] == 0.5
    assert combination["init_args"]["canaries"] == 20


@pytest.mark.parametrize("args, line", [
    (["--config", str(REPO / "configs" / "quickstart.yaml")],
     "lfed audit: error: model.combination: lfed audit audits a private run, and this one's combination is 'mean' "
     "(algorithm 'fedavg') and its objective 'plain'; give a config with combination: dp_fedavg or distributed_dp, or "
     "objective: dp_sgd (configs/dp_digits.yaml, configs/distributed_dp_digits.yaml, configs/dp_sgd_digits.yaml)"),
    (["--config", str(DP), "--leak", "plaintext"],
     "lfed audit: error: leak: 'plaintext' is not a leak of this run's mechanism (CanaryDPFedAvg): one of "
     "('none', 'no_noise', 'no_clip')"),
    (["--config", str(DP), "--canaries", "1"], "lfed audit: error: canaries: at least 2 canary clients, got 1"),
    (["--config", str(DP), "--confidence", "1.5"], "lfed audit: error: confidence: must be in (0, 1), got 1.5"),
])
def test_what_cannot_be_audited_is_one_line_before_anything_starts(args, line, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, out, err = _audit(monkeypatch, capsys, tmp_path, *args)
    assert code == 2 and err.strip().splitlines()[-1] == line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("leak, code, verdict", [("none", 0, "  verdict   consistent"), ("no_noise", 1, "  verdict   VIOLATION")])
def test_the_command_catches_a_planted_leak_and_passes_the_mechanism(leak, code, verdict, monkeypatch, capsys, tmp_path):
    """400 canaries beside the digits clients, z = 3, δ = 1e-6, 10 rounds: the claim is below what the canaries can
    contradict; with the server noise skipped (still accounted) every guess is right and the bound exceeds the claim."""
    got, out, err = _audit(monkeypatch, capsys, tmp_path, "--config", str(DP), "--trainer.max_steps", "10",
                           "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
                           "--trainer.default_root_dir", str(tmp_path), "--canaries", "400", "--leak", leak,
                           "--model.combination.init_args.delta", "1e-6", "--model.combination.init_args.noise_multiplier", "3")
    screen = out[out.index("lfed audit: one-run privacy audit"):].splitlines()
    assert got == code, out[-3000:] + err[-3000:]
    assert [ln for ln in screen if ln.startswith("  verdict")][0].startswith(verdict)
    claimed = float(screen[1].split("ε = ")[1].split()[0])
    reach = float(screen[4].split(": ")[1].split(";")[0])
    assert claimed < reach  # this audit can contradict this claim
    if leak != "none":
        assert screen[-1] == "  planted   leak 'no_noise': the claim is false by construction; the audit caught it"


def test_the_audit_of_example_level_dp_sgd_uses_canary_examples(monkeypatch, capsys, tmp_path):
    """objective: dp_sgd: the command swaps in CanaryDPSGD with the config's settings and reports the canary client's ε."""
    # every client every round, so that the canary client (client 0) takes part whatever the cohorts' draw
    code, out, err = _audit(monkeypatch, capsys, tmp_path, *_quiet_run(tmp_path, "dp_sgd_digits.yaml", 3), "--canaries",
                            "40", "--model.objective.init_args.noise_multiplier", "1.7", "--model.fraction", "1.0")
    assert code == 0, err
    screen = out[out.index("lfed audit: one-run privacy audit"):].splitlines()
    assert "(40 canaries, " in screen[2] and screen[2].endswith("canary examples of client 0)")
    assert screen[-1].endswith("it audits that client's uploads to the server only.")
    objective = _saved_setting(tmp_path, "objective")
    assert objective["class_path"] == "lfed.privacy.audit_examples.CanaryDPSGD"
    assert objective["init_args"]["noise_multiplier"] == 1.7 and objective["init_args"]["clip"] == 1.0
    assert objective["init_args"]["canaries"] == 40


def test_the_audit_of_distributed_dp_keeps_the_configs_settings(monkeypatch, capsys, tmp_path):
    """combination: distributed_dp: the command swaps in CanaryDistributedDP with the config's settings."""
    code, out, err = _audit(monkeypatch, capsys, tmp_path, *_quiet_run(tmp_path, "distributed_dp_digits.yaml", 1),
                            "--canaries", "20", "--model.combination.init_args.noise_multiplier", "2.5")
    assert code == 0, err
    combination = _saved_setting(tmp_path, "combination")
    assert combination["class_path"] == "lfed.privacy.audit.CanaryDistributedDP"
    assert combination["init_args"]["noise_multiplier"] == 2.5 and combination["init_args"]["bits"] == 20
    assert combination["init_args"]["canaries"] == 20 and combination["init_args"]["audit_beta"] == pytest.approx(0.05)
