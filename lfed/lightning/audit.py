"""``lfed audit --config X``: a DP-FedAvg run with canary clients, then its one-run privacy audit on one screen.

The run is the config's, trained as ``lfed fit`` trains it (progress bar, checkpoints, logs), with its DP-FedAvg
combination made a :class:`lfed.privacy.audit.CanaryDPFedAvg` of the same settings: ``--canaries`` canary clients,
each included with probability 1/2 (Steinke, Nasr, Jagielski, NeurIPS 2023, "Privacy auditing with one (1) training
run": docs/privacy.md). At the end it prints the ε the accountant claims, the audit's lower bound on ε at the chosen
confidence, the guesses, and what an audit can and cannot certify. Exit status 0 when the bound is within the claim,
1 when it exceeds it (the run leaks more than it claims), 2 for a mistake in the command.

    lfed audit --config configs/dp_digits.yaml
    lfed audit --config configs/dp_digits.yaml --leak no_noise      # a planted leak the audit must catch
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

__all__ = ["main", "report"]

LEAKS = ("none", "no_noise", "no_clip")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lfed audit", description=__doc__.splitlines()[0],
                                epilog="Every other argument is lfed fit's (--config, --model.*, --data.*, --trainer.*).")
    p.add_argument("--canaries", type=int, default=1000, help="canary clients m (default 1000; at least 2)")
    p.add_argument("--leak", choices=LEAKS, default="none",
                   help="plant a leak the audit must catch: no_noise (server noise skipped, still accounted) or no_clip")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence of the lower bound, in (0, 1) (default 0.95)")
    return p


def _last(args: list[str], key: str) -> str | None:
    """The last value the command line gives ``key`` (``--key v`` or ``--key=v``)."""
    value = None
    for i, a in enumerate(args):
        if a == key and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(key + "="):
            value = a.split("=", 1)[1]
    return value


def _combination(args: list[str]) -> tuple[Any, Any]:
    """The run's ``model.algorithm`` and ``model.combination`` as the configs and the command line give them (last wins)."""
    algorithm = combination = None
    for i, a in enumerate(args[:-1]):
        if a == "--config":
            try:
                model = (yaml.safe_load(Path(args[i + 1]).read_text()) or {}).get("model") or {}
            except (OSError, yaml.YAMLError, AttributeError):
                continue  # lfed fit's own parsing names the file's problem
            algorithm = model.get("algorithm", algorithm)
            combination = model.get("combination", combination)
    algorithm = _last(args, "--model.algorithm") or algorithm
    combination = _last(args, "--model.combination") or combination
    return algorithm, combination


def check_dp(args: list[str]) -> None:
    """Refuse, before anything starts, a run that is not DP-FedAvg (there is no claim to audit)."""
    from lfed.base.component import load_class
    from lfed.core.registry import NAMES, PRESETS, component_class

    algorithm, combination = _combination(args)
    dp = load_class(NAMES["combination"]["dp_fedavg"], object, "combination")
    if isinstance(combination, dict):
        combination = combination.get("class_path")
    if combination is None:
        combination = PRESETS.get(str(algorithm or "fedavg"), {}).get("combination")
    cls = component_class("combination", combination) if isinstance(combination, str) else None
    if cls is None or not issubclass(cls, dp):
        raise ValueError(f"model.combination: lfed audit audits a DP-FedAvg run, and this one's combination is "
                         f"{combination or 'mean'!r} (algorithm {algorithm or 'fedavg'!r}); give a config with "
                         "combination: lfed.privacy.DPFedAvg (configs/dp_digits.yaml, configs/dp_mnist.yaml)")


def report(result: Any, run_dir: Any, leak: str) -> tuple[str, bool]:
    """The audit's screen and whether the bound is within the claim."""
    from lfed.privacy.audit import epsilon_lower_bound

    ok = result.epsilon_lower <= result.epsilon
    confidence = 100 * (1 - result.beta)
    reach = max(epsilon_lower_bound(result.m, 2 * k, 2 * k, result.delta, result.beta / len(result.per_k)) for k in result.per_k)
    lines = [
        f"lfed audit: one-run privacy audit (Steinke, Nasr, Jagielski 2023) of {run_dir}",
        f"  claimed   ε = {result.epsilon:.4g} at δ = {result.delta:.3g} (the accountant's, for this run's rounds, q and z)",
        f"  audited   ε ≥ {result.epsilon_lower:.4g} at {confidence:.4g}% confidence ({result.m} canaries, {result.included} "
        f"included; {result.r} guesses, {result.v} correct)",
        "  guesses   " + ", ".join(f"k = {k}: {v}/{2 * k} correct, ε ≥ {e:.3g}" for k, (v, e) in sorted(result.per_k.items())),
        f"  reach     the largest ε_lower {result.m} canaries can give at this δ (every guess right): {reach:.4g}"
        + (f"; a claim above it (ε = {result.epsilon:.4g}) cannot be contradicted here" if reach < result.epsilon else ""),
        ("  verdict   consistent: the audit found no more leakage than the claim (ε_lower ≤ ε)" if ok else
         "  verdict   VIOLATION: the run leaks more than it claims (ε_lower > ε): a bug or a leak in what leaves the clients"),
        "  what it certifies: a lower bound. ε_lower > ε proves the claim wrong; ε_lower ≤ ε does not prove it right (one",
        "  run's bound is far below ε for large ε and few canaries); it audits the run's releases of the global model only.",
    ]
    if 2 * result.m * result.delta >= result.beta:  # Theorem 5.2's δ term alone exceeds β: no ε can be rejected
        lines.append(f"  warning   2mδ = {2 * result.m * result.delta:.3g} ≥ β = {result.beta:.3g}: at this δ the audit can reject no ε; "
                     "audit at a small δ (--model.combination.init_args.delta 1e-6)")
    if leak != "none":
        lines.append(f"  planted   leak {leak!r}: the claim is false by construction; "
                     + ("the audit caught it" if not ok else "the audit could not show it at this reach (more canaries, "
                        "or a run with a smaller ε)"))
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> None:
    """``lfed audit`` (dispatched by :mod:`lfed.entry`): one line and exit 2 for a mistake, as ``lfed fit``."""
    from lfed.lightning.cli import DEBUG_ENV, ConfigError, LfedCLI, silence_library_noise
    from lfed.lightning.datamodule import FederatedDataModule
    from lfed.lightning.module import FederatedModule

    argv = list(sys.argv[1:] if argv is None else argv)
    ours, rest = parser().parse_known_args(argv)
    try:
        if ours.canaries < 2:
            raise ValueError(f"canaries: at least 2 canary clients, got {ours.canaries}")
        if not 0 < ours.confidence < 1:
            raise ValueError(f"confidence: must be in (0, 1), got {ours.confidence}")
        check_dp(rest)
    except ValueError as err:
        print(f"lfed audit: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    args = ["fit", *rest, "--model.combination", "lfed.privacy.audit.CanaryDPFedAvg",
            "--model.combination.init_args.canaries", str(ours.canaries),
            "--model.combination.init_args.beta", str(1 - ours.confidence)]
    if ours.leak != "none":
        args += ["--model.combination.init_args.leak", ours.leak]
    silence_library_noise()
    debug = bool(__import__("os").environ.get(DEBUG_ENV, "").strip() not in ("", "0"))
    try:
        cli = LfedCLI(FederatedModule, FederatedDataModule, save_config_kwargs={"overwrite": True}, config_errors=not debug,
                      args=args)
    except ConfigError as err:
        print(f"lfed audit: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    dp = cli.model.runs[0].components.combination
    text, ok = report(dp.audit(), getattr(cli, "run_dir", ""), ours.leak)
    print(text, flush=True)
    sys.exit(0 if ok else 1)
