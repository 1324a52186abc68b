"""Client-level differential privacy (docs/algorithms.md §11): DP-FedAvg with a fixed denominator, adaptive clipping and an accountant.

* :mod:`lfed.privacy.clipping`: per-client L2 clipping of the cohort's ``[K, P]`` updates at once;
* :mod:`lfed.privacy.accountant`: the privacy ledger of a run (``dp-accounting``'s RDP accountant);
* :mod:`lfed.privacy.dp_fedavg`: :class:`DPFedAvg`, the server combination (clip, noise, fixed denominator,
  adaptive clipping, local DP), with Poisson sampling (:class:`lfed.participation.sampling.PoissonSampler`);
* :mod:`lfed.privacy.releases`: DP-FedAvg's refusal of every value a component releases beside its update
  (a component's ``releases``);
* :mod:`lfed.base.metric_gate`: the gate on the metrics a DP run logs (private ones only, or the rest marked
  ``unaccounted/``);
* :mod:`lfed.privacy.audit`: the one-run audit by canary clients (Steinke, Nasr, Jagielski 2023), ε_lower against ε.

docs/privacy.md states the formulas and the accountant's assumptions. The names below are importable from
``lfed.privacy`` and imported on first use (``import lfed.privacy`` loads neither torch nor ``dp-accounting``).
"""

from lfed import _lazy_exports

_LAZY = {
    "DPFedAvg": "lfed.privacy.dp_fedavg",
    "DPSGD": "lfed.privacy.dp_sgd",
    "PrivacyAccountant": "lfed.privacy.accountant",
    "calibrate_noise": "lfed.privacy.accountant",
    "clip_rows": "lfed.privacy.clipping",
    "clip_factors": "lfed.privacy.clipping",
    "MetricGate": "lfed.base.metric_gate",
    "check_releases": "lfed.privacy.releases",
    "CanaryDPFedAvg": "lfed.privacy.audit",
    "AuditResult": "lfed.privacy.audit",
    "epsilon_lower_bound": "lfed.privacy.audit",
    "SecureAggregation": "lfed.privacy.secagg",
    "DistributedDP": "lfed.privacy.distributed_dp",
    "CanaryDistributedDP": "lfed.privacy.audit",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)
