"""Evaluation (docs/algorithms.md §9): the global and local models' scores (:mod:`~lfed.evaluation.scores`), communication
accounting (:mod:`~lfed.evaluation.communication`) and a round's server amplification
(:mod:`~lfed.evaluation.amplification`). The names of 0.4's ``lfed.evaluation`` are exported here (imported on first use)."""

from lfed import _lazy_exports

#: 0.4's ``lfed.evaluation`` names, from their module now (imported on first use).
_LAZY = {
    "LossFn": "lfed.evaluation.scores",
    "is_classification": "lfed.evaluation.scores",
    "per_example_loss": "lfed.evaluation.scores",
    "evaluate_split": "lfed.evaluation.scores",
    "client_losses": "lfed.evaluation.scores",
    "client_accuracies": "lfed.evaluation.scores",
    "client_evaluation": "lfed.evaluation.scores",
    "worst_share_mean": "lfed.evaluation.scores",
    "output_shape_is_known": "lfed.evaluation.scores",
    "check_task": "lfed.evaluation.scores",
    "local_accuracy": "lfed.evaluation.scores",
    "own_split_scores": "lfed.evaluation.scores",
    "accuracy_summary": "lfed.evaluation.scores",
    "perplexity_summary": "lfed.evaluation.scores",
    "personal_accuracies": "lfed.evaluation.scores",
    "personal_scores": "lfed.evaluation.scores",
    "BestMeanAccuracy": "lfed.evaluation.scores",
}

__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)
