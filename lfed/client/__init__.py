"""Client rules (docs/algorithms.md §2): what each client does in a round, one class per method.

* :class:`ClientRule`: the base class (hooks ``step_rule``, ``loss_term``, ``after_local``,
  ``server_combination``; personalized: ``personal_rows``, ``start_weights``, ``start_buffers``,
  ``make_sharing``);
* the built-in objectives :class:`Plain` (FedAvg), :class:`Prox` (FedProx), :class:`Scaffold`,
  :class:`IGFL` (IGFL-C), :class:`EFL` and :class:`FedDyn`;
* what a rule returns, the engine's (exported by :mod:`lfed.engine` and :mod:`lfed`): ``StepRule``
  (``w ← w - lr (grad_scale g + decay ⊙ w + shift)``) and ``LossTerm`` (a term added to each example's loss; its
  function may take the net it trains, ``TermModel``).

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
}
#: 0.5 exported the engine's step-rule types from here too; each name is exported by one package since 0.6
#: (``lfed.engine``, and the root ``lfed``). These still resolve, with one FutureWarning, until 0.7.
_MOVED = {"StepRule": "lfed.engine", "LossTerm": "lfed.engine", "TermModel": "lfed.engine.term"}

__all__ = sorted(_LAZY)


def _moved(name: str) -> None:
    if name in _MOVED:
        import warnings

        warnings.warn(f"lfed.client.{name}: import it from lfed (or {_MOVED[name]}); lfed.client's re-export of the "
                      "engine's name is deprecated in 0.6 and goes in 0.7", FutureWarning, stacklevel=3)


__getattr__, __dir__ = _lazy_exports(__name__, {**_LAZY, **_MOVED}, before=_moved)
