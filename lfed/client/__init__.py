"""Client rules (docs/algorithms.md §2): what each client does in a round, one class per method.

* :class:`ClientRule`: the base class (hooks ``step_rule``, ``loss_term``, ``after_local``,
  ``server_combination``; personalized: ``personal_rows``, ``start_weights``, ``start_buffers``,
  ``make_sharing``);
* the built-in objectives :class:`Plain` (FedAvg), :class:`Prox` (FedProx), :class:`Scaffold`,
  :class:`IGFL` (IGFL-C), :class:`EFL` and :class:`FedDyn`;
* what a rule returns: :class:`StepRule` (``w ← w - lr (grad_scale g + decay ⊙ w + shift)``) and
  :class:`LossTerm` (a term added to each example's loss; its function may take the net it trains,
  :class:`TermModel`).

Personalized rules are in :mod:`lfed.personal`. Every name is imported on first use.
"""

from lfed import _lazy_exports

_LAZY = {
    "ClientRule": "lfed.client.objectives",
    "Plain": "lfed.client.objectives",
    "Prox": "lfed.client.objectives",
    "Scaffold": "lfed.client.objectives",
    "IGFL": "lfed.client.objectives",
    "EFL": "lfed.client.objectives",
    "FedDyn": "lfed.client.feddyn",
    "StepRule": "lfed.engine",
    "LossTerm": "lfed.engine",
    "TermModel": "lfed.engine.term",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)
