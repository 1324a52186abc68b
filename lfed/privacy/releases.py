"""What leaves the clients beyond the round's update, and DP-FedAvg's refusal of what it cannot account.

DP-FedAvg (:mod:`lfed.privacy.dp_fedavg`) accounts one value a round: the clipped, noised sum of the counting
clients' updates. A component that sends anything else computed from the clients' data to the server, to other
clients or into the global model says so where it is defined, in its declaration's ``Releases(values=...)`` (one
clause each: what, and how it leaves the clients; :mod:`lfed.base.declaration`); the run adds the net's own (BatchNorm running statistics,
:meth:`lfed.core.run.FederatedRun.net_releases`). A DP run refuses every one before round 0 with one line naming the
setting (:func:`refusal`); state that stays on its client (personal models, local layers) is no release.

The two parts of a component's declaration (``declares = Declaration(releases=Releases(...))``) DP reads, here and in
:class:`~lfed.privacy.DPFedAvg` (a component that declares neither has none):

* ``Releases(values=...)``: what the component sends beyond the round's aggregated update from the clients' data
  to the server, to other clients or into the global model, one clause each, what and how ("SCAFFOLD's server control
  variate c is averaged from the clients' raw control updates, unclipped and un-noised, and sent to every later
  cohort"). DP-FedAvg refuses a run with any before round 0.
* ``Releases(dp_shares=...)``: the noise multipliers of the component's own Gaussian releases of each round on
  the sampled cohort, each of clipped contributions and noise ``z_i`` times their clip (DP-SCAFFOLD's control
  updates): DP-FedAvg gives each its share of the round's multiplier ``z`` (``z_Δ = (z⁻² - Σ z_i⁻²)^(-1/2)``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lfed.base.declaration import declaration

__all__ = ["INSTEAD", "SETTINGS", "check_releases", "refusal", "releases_of"]

#: The setting that chooses the component of each role (the names a config and the command line use).
SETTINGS = {"participation": "fraction"}

#: What to use with DP instead, by setting.
INSTEAD = {
    "objective": "objective: plain or prox (or a personalized rule whose own state stays on the client)",
    "combination": "combination: lfed.privacy.DPFedAvg",
    "weighting": "weighting: uniform",
    "sampler": "sampler: poisson",
    "attack": "attack: sign_flip, gaussian, scaling or label_flip (Byzantine clients that read only their own data)",
    "net": "a net without running statistics (LayerNorm, GroupNorm or BatchNorm(track_running_stats=False))",
}


def refusal(setting: str, what: str, mechanism: str = "DP-FedAvg") -> str:
    """The one line refusing ``what`` (a release of ``setting``'s component) in a DP run of ``mechanism``."""
    instead = INSTEAD.get(setting, f"a {setting} that releases nothing but its update")
    if setting == "combination" and mechanism != "DP-FedAvg":
        instead = f"combination: {mechanism}"
    return (f"{setting}: {what}, so {mechanism}'s ε would not hold (it accounts only the clipped, noised update); "
            f"use {instead} with DP")


def releases_of(component: Any) -> tuple[str, ...]:
    """What ``component`` declares it releases (``Releases(values=...)``; none when it declares nothing)."""
    return declaration(component).releases.values


def check_releases(components: dict[str, Any], net_releases: Iterable[str] = (), mechanism: str = "DP-FedAvg") -> None:
    """Raise ``ValueError`` (:func:`refusal`) for the first release of any component (by role) or of the net."""
    for role, component in components.items():
        for what in releases_of(component):
            raise ValueError(refusal(SETTINGS.get(role, role), what, mechanism))
    for what in net_releases:
        raise ValueError(refusal("net", what, mechanism))
