"""The server's side of a round (docs/algorithms.md §3-§7): who takes part, how updates are weighted, sent and combined, and the server step.

* weighting (§3): :class:`AggregationWeights`; :class:`SizeWeights`, :class:`UniformWeights`, :class:`DWFedWeights`;
* combination (§4): :class:`ServerCombination`; :class:`Mean`, :class:`IGFLAttention` (returns an
  :class:`AttentionResult`);
* server optimizers (§4.1), stepped on the pseudo-gradient ``-Δ``: :class:`FedAdam`, :class:`FedYogi`,
  :class:`FedAdagrad` (SGD with ``lr = 1`` is ``w + Δ``);
* sampling (§5): :class:`ClientSampler`; :class:`UniformSampler`, :class:`PoissonSampler`,
  :class:`AttentionSampler`;
* participation (§5-§6): :class:`Participation` (a cohort fraction or a :class:`FractionSchedule`:
  :class:`ConstantFraction`, :class:`StepwiseFraction`, :class:`ExplicitFraction`; and stragglers);
* channel (§7): :class:`Channel`; :class:`Dense`, :class:`TernaryTopK`;
* asynchronous rounds: :class:`Asynchronous`; :class:`FedBuff`, :class:`FedAsync` (docs/async.md).

Every name is imported on first use.
"""

from lfed import _lazy_exports

_LAZY = {
    "AggregationWeights": "lfed.server.weighting",
    "SizeWeights": "lfed.server.weighting",
    "UniformWeights": "lfed.server.weighting",
    "DWFedWeights": "lfed.server.weighting",
    "DegenerateWeightsWarning": "lfed.server.weight_formulas",
    "ServerCombination": "lfed.server.combination",
    "Mean": "lfed.server.combination",
    "IGFLAttention": "lfed.server.combination",
    "AttentionResult": "lfed.server.attention",
    "FedAdam": "lfed.server.optimizers",
    "FedYogi": "lfed.server.optimizers",
    "FedAdagrad": "lfed.server.optimizers",
    "ClientSampler": "lfed.participation.sampling",
    "UniformSampler": "lfed.participation.sampling",
    "PoissonSampler": "lfed.participation.sampling",
    "AttentionSampler": "lfed.participation.sampling",
    "Participation": "lfed.participation.participation",
    "FractionSchedule": "lfed.participation.sampling",
    "ConstantFraction": "lfed.participation.sampling",
    "StepwiseFraction": "lfed.participation.sampling",
    "ExplicitFraction": "lfed.participation.sampling",
    "Channel": "lfed.server.channel",
    "Dense": "lfed.server.channel",
    "TernaryTopK": "lfed.server.channel",
    "Asynchronous": "lfed.core.asynchronous",
    "FedBuff": "lfed.core.asynchronous",
    "FedAsync": "lfed.core.asynchronous",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)
