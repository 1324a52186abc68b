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
    [config] = tmp_path.glob("runs/*/version_0/config.yaml")
    combination = yaml.safe_load(config.read_text())["model"]["combination"]
    assert combination["class_path"] == "lfed.privacy.audit.CanaryDPFedAvg"  # the config's DP-FedAvg, with canaries
    assert combination["init_args"]["noise_multiplier"] == 0.8 and combination["init_args"]["clip"] == 0.5
    assert combination["init_args"]["canaries"] == 20


@pytest.mark.parametrize("args, line", [
    (["--config", str(REPO / "configs" / "quickstart.yaml")],
     "lfed audit: error: model.combination: lfed audit audits a DP-FedAvg run, and this one's combination is 'mean' "
     "(algorithm 'fedavg'); give a config with combination: lfed.privacy.DPFedAvg (configs/dp_digits.yaml, configs/dp_mnist.yaml)"),
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
