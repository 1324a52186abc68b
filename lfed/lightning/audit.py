"""``lfed audit --config X``: a private run with canaries, then its one-run privacy audit on one screen.

The run is the config's, trained as ``lfed fit`` trains it (progress bar, checkpoints, logs), with its private mechanism
made the canary version of the same settings (Steinke, Nasr, Jagielski, NeurIPS 2023, "Privacy auditing with one (1)
training run": docs/privacy.md), each canary included with probability 1/2:

* client-level DP-FedAvg (``combination: dp_fedavg``): ``--canaries`` canary clients (:class:`lfed.privacy.audit.CanaryDPFedAvg`);
* distributed DP (``combination: distributed_dp``): canary clients through the Skellam mechanism and secure aggregation
  (:class:`lfed.privacy.audit.CanaryDistributedDP`; its leaks include ``plaintext``);
* example-level DP-SGD (``objective: dp_sgd``, when the combination is not private): canary examples of one client,
  audited from that client's uploads (:class:`lfed.privacy.audit_examples.CanaryDPSGD`).

At the end it prints the ε the accountant claims, the audit's lower bound on ε at the chosen confidence, the guesses,
and what an audit can and cannot certify. Exit status 0 when the bound is within the claim, 1 when it exceeds it (the
run leaks more than it claims), 2 for a mistake in the command.

    lfed audit --config configs/dp_digits.yaml
    lfed audit --config configs/dp_digits.yaml --leak no_noise      # a planted leak the audit must catch
    lfed audit --config configs/dp_sgd_digits.yaml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

__all__ = ["main", "report"]

LEAKS = ("none", "no_noise", "no_clip", "plaintext")


class Mode:
    """What ``lfed audit`` audits in a run: the setting it replaces, the canary class, its leaks and its words."""

    def __init__(self, setting: str, canary: str, beta: str, leaks: tuple[str, ...], unit: str, seen: str) -> None:
        self.setting, self.canary, self.beta, self.leaks, self.unit, self.seen = setting, canary, beta, leaks, unit, seen


MODES = {
    "dp_fedavg": Mode("combination", "lfed.privacy.audit.CanaryDPFedAvg", "beta", ("no_noise", "no_clip"),
                      "canary clients", "the run's releases of the global model"),
    "distributed_dp": Mode("combination", "lfed.privacy.audit.CanaryDistributedDP", "audit_beta",
                           ("no_noise", "no_clip", "plaintext"), "canary clients", "the decoded sums of the rounds"),
    "dp_sgd": Mode("objective", "lfed.privacy.audit_examples.CanaryDPSGD", "beta", ("no_noise", "no_clip"),
                   "canary examples of client {canary_client}", "that client's uploads to the server"),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lfed audit", description=__doc__.splitlines()[0],
                                epilog="Every other argument is lfed fit's (--config, --model.*, --data.*, --trainer.*).")
    p.add_argument("--canaries", type=int, default=1000, help="canary clients m (default 1000; at least 2)")
    p.add_argument("--leak", choices=LEAKS, default="none",
                   help="plant a leak the audit must catch: no_noise (the noise skipped, still accounted), no_clip, or "
                        "plaintext (distributed DP: the canaries' uploads seen in the clear)")
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


def _settings(args: list[str]) -> tuple[Any, Any, Any]:
    """The run's ``model.algorithm``, ``model.combination`` and ``model.objective`` as the configs and the command line
    give them (last wins)."""
    found: dict[str, Any] = {"algorithm": None, "combination": None, "objective": None}
    for i, a in enumerate(args[:-1]):
        if a == "--config":
            try:
                model = (yaml.safe_load(Path(args[i + 1]).read_text()) or {}).get("model") or {}
            except (OSError, yaml.YAMLError, AttributeError):
                continue  # lfed fit's own parsing names the file's problem
            for key in found:
                found[key] = model.get(key, found[key])
    for key in found:
        found[key] = _last(args, f"--model.{key}") or found[key]
    return found["algorithm"], found["combination"], found["objective"]


def check_dp(args: list[str]) -> Mode:
    """The private mechanism of the run to audit; refuse, before anything starts, a run without one."""
    from lfed.base.component import load_class
    from lfed.core.registry import NAMES, PRESETS, component_class

    algorithm, combination, objective = _settings(args)
    if isinstance(combination, dict):
        combination = combination.get("class_path")
    if combination is None:
        combination = PRESETS.get(str(algorithm or "fedavg"), {}).get("combination")
    if isinstance(objective, dict):
        objective = objective.get("class_path")
    for role, choice, names in (("combination", combination, ("dp_fedavg", "distributed_dp")),
                                ("objective", objective, ("dp_sgd",))):
        cls = component_class(role, choice) if isinstance(choice, str) else None
        for name in names:
            if cls is not None and issubclass(cls, load_class(NAMES[role][name], object, role)):
                return MODES[name]
    raise ValueError(f"model.combination: lfed audit audits a private run, and this one's combination is "
                     f"{combination or 'mean'!r} (algorithm {algorithm or 'fedavg'!r}) and its objective "
                     f"{objective or 'plain'!r}; give a config with combination: dp_fedavg or distributed_dp, or "
                     "objective: dp_sgd (configs/dp_digits.yaml, configs/distributed_dp_digits.yaml, "
                     "configs/dp_sgd_digits.yaml)")


def report(result: Any, run_dir: Any, leak: str, mode: Mode = MODES["dp_fedavg"],
           canary_client: int | None = None) -> tuple[str, bool]:
    """The audit's screen and whether the bound is within the claim (``canary_client``: the client whose canary
    examples an example-level audit planted)."""
    from lfed.privacy.audit import epsilon_lower_bound

    ok = result.epsilon_lower <= result.epsilon
    confidence = 100 * (1 - result.beta)
    reach = max(epsilon_lower_bound(result.m, 2 * k, 2 * k, result.delta, result.beta / len(result.per_k)) for k in result.per_k)
    lines = [
        f"lfed audit: one-run privacy audit (Steinke, Nasr, Jagielski 2023) of {run_dir}",
        f"  claimed   ε = {result.epsilon:.4g} at δ = {result.delta:.3g} (the accountant's, for this run's rounds, q and z)",
        f"  audited   ε ≥ {result.epsilon_lower:.4g} at {confidence:.4g}% confidence ({result.m} canaries, {result.included} "
        f"included; {result.r} guesses, {result.v} correct; {mode.unit.format(canary_client=canary_client)})",
        "  guesses   " + ", ".join(f"k = {k}: {v}/{2 * k} correct, ε ≥ {e:.3g}" for k, (v, e) in sorted(result.per_k.items())),
        f"  reach     the largest ε_lower {result.m} canaries can give at this δ (every guess right): {reach:.4g}"
        + (f"; a claim above it (ε = {result.epsilon:.4g}) cannot be contradicted here" if reach < result.epsilon else ""),
        ("  verdict   consistent: the audit found no more leakage than the claim (ε_lower ≤ ε)" if ok else
         "  verdict   VIOLATION: the run leaks more than it claims (ε_lower > ε): a bug or a leak in what leaves the clients"),
        "  what it certifies: a lower bound. ε_lower > ε proves the claim wrong; ε_lower ≤ ε does not prove it right (one",
        "  run's bound is far below ε for large ε and few canaries); it audits " + mode.seen + " only.",
    ]
    if 2 * result.m * result.delta >= result.beta:  # Theorem 5.2's δ term alone exceeds β: no ε can be rejected
        lines.append(f"  warning   2mδ = {2 * result.m * result.delta:.3g} ≥ β = {result.beta:.3g}: at this δ the audit can reject no ε; "
                     f"audit at a small δ (--model.{mode.setting}.init_args.delta 1e-6)")
    if leak != "none":
        lines.append(f"  planted   leak {leak!r}: the claim is false by construction; "
                     + ("the audit caught it" if not ok else "the audit could not show it at this reach (more canaries, "
                        "or a run with a smaller ε)"))
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> None:
    """``lfed audit`` (dispatched by :mod:`lfed.entry`): one line and exit 2 for a mistake, as ``lfed fit``."""
    from lfed.lightning.cli import LfedCLI
    from lfed.lightning.cli_errors import DEBUG_ENV, ConfigError
    from lfed.lightning.datamodule import FederatedDataModule
    from lfed.lightning.module import FederatedModule
    from lfed.lightning.reporting import silence_library_noise

    argv = list(sys.argv[1:] if argv is None else argv)
    ours, rest = parser().parse_known_args(argv)
    try:
        if ours.canaries < 2:
            raise ValueError(f"canaries: at least 2 canary clients, got {ours.canaries}")
        if not 0 < ours.confidence < 1:
            raise ValueError(f"confidence: must be in (0, 1), got {ours.confidence}")
        mode = check_dp(rest)
        if ours.leak not in ("none", *mode.leaks):
            raise ValueError(f"leak: {ours.leak!r} is not a leak of this run's mechanism ({mode.canary.rsplit('.', 1)[1]}): "
                             f"one of {('none', *mode.leaks)}")
    except ValueError as err:
        print(f"lfed audit: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    at = f"--model.{mode.setting}"
    args = ["fit", *rest, at, mode.canary, f"{at}.init_args.canaries", str(ours.canaries),
            f"{at}.init_args.{mode.beta}", str(1 - ours.confidence)]
    if ours.leak != "none":
        args += [f"{at}.init_args.leak", ours.leak]
    silence_library_noise()
    debug = bool(__import__("os").environ.get(DEBUG_ENV, "").strip() not in ("", "0"))
    try:
        cli = LfedCLI(FederatedModule, FederatedDataModule, save_config_kwargs={"overwrite": True}, config_errors=not debug,
                      args=args)
    except ConfigError as err:
        print(f"lfed audit: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    dp = getattr(cli.model.runs[0].components, mode.setting)
    text, ok = report(dp.audit(), getattr(cli, "run_dir", ""), ours.leak, mode, getattr(dp, "canary_client", None))
    print(text, flush=True)
    sys.exit(0 if ok else 1)
