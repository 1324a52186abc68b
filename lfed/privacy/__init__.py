"""Client-level differential privacy (SPEC §10): DP-FedAvg with a fixed denominator, adaptive clipping and an accountant.

* :mod:`lfed.privacy.clipping`: per-client L2 clipping of the cohort's ``[K, P]`` updates at once;
* :mod:`lfed.privacy.accountant`: the privacy ledger of a run (``dp-accounting``'s RDP accountant);
* :mod:`lfed.privacy.dp_fedavg`: :class:`DPFedAvg`, the server combination (clip, noise, fixed denominator,
  adaptive clipping, local DP), with Poisson sampling (:class:`lfed.sampling.PoissonSampler`);
* :mod:`lfed.privacy.releases`: DP-FedAvg's refusal of every value a component releases beside its update
  (:attr:`lfed.component.Component.releases`);
* :mod:`lfed.privacy.metrics`: the gate on the metrics a DP run logs (private ones only, or the rest marked
  ``unaccounted/``);
* :mod:`lfed.privacy.audit`: the one-run audit by canary clients (Steinke, Nasr, Jagielski 2023), ε_lower against ε.

docs/privacy.md states the formulas and the accountant's assumptions.
"""

from lfed.privacy.accountant import PrivacyAccountant
from lfed.privacy.clipping import clip_rows
from lfed.privacy.dp_fedavg import DPFedAvg

__all__ = ["DPFedAvg", "PrivacyAccountant", "clip_rows"]
