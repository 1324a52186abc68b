"""What the pre-aggregators share: the rule they feed, built from a name or given (docs/robustness.md §2.7)."""

from __future__ import annotations

from typing import Any

from lfed.robust.rules.base import RobustCombination

__all__ = ["PreAggregator"]


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def _robust_rule(rule: Any) -> Any:
    """``rule`` as a component: given as one, or built with its defaults from a robust rule's name (each rule's own
    ``name``, as the ``combination`` table names it) or a dotted class path; anything else is returned as it is, for
    the caller to refuse. Resolved here, not through :mod:`lfed.core.registry`: the methods sit below the core."""
    if not isinstance(rule, str):
        return rule
    if "." in rule:
        import importlib

        module, _, name = rule.rpartition(".")
        try:
            return getattr(importlib.import_module(module), name)()
        except (ImportError, AttributeError):
            return rule
    # (every rule is defined: importing this module imported its package, lfed.robust.rules, which imports each rule)
    found = [c for c in _subclasses(RobustCombination) if c.__dict__.get("name") == rule]
    return found[0]() if found else rule


class PreAggregator(RobustCombination):
    """A robust rule run on rows this component makes from the counting updates (bucket means, neighbour means).

    The inner ``rule`` is a name of the ``combination`` table (``krum``, ``median``, ...) or a
    :class:`~lfed.robust.rules.base.RobustCombination`; it is a submodule, so its state (centered clipping's center)
    is in the checkpoint. Its ``f`` is the run's: given here, or the attack's.
    """

    def __init__(self, rule: Any = "median", f: int | None = None) -> None:
        super().__init__(f)
        inner = _robust_rule(rule)
        if not isinstance(inner, RobustCombination) or isinstance(inner, PreAggregator):
            given = repr(rule) if isinstance(rule, str) else f"{type(rule).__name__} ({getattr(rule, 'name', '')})"
            raise ValueError(f"rule: {given} is not a robust rule to feed (median, trimmed_mean, krum, multi_krum, "
                             "bulyan, geometric_median, centered_clipping, norm_bound, or a RobustCombination)")
        self.rule = inner

    @property
    def uses_weights(self) -> bool:  # type: ignore[override]
        return self.rule.uses_weights

    def hparams(self) -> dict:
        return {**super().hparams(), **{f"rule_{k}": v for k, v in self.rule.hparams().items()}, "rule": self.rule.name}

    def structure(self) -> dict:
        return {"rule": self.rule.name}

    def setup_state(self, store, num_examples, num_params, like) -> None:
        super().setup_state(store, num_examples, num_params, like)
        self.rule.setup_state(store, num_examples, num_params, like)

    def check_data(self, data) -> None:
        self.rule.check_data(data)

    def check(self, context) -> list[str]:
        self.rule._attack = (context.components or {}).get("attack")
        return super().check(context)
