"""Two groups of a run's settings: how the cohort is computed (:class:`Engine`) and what an evaluation scores
(:class:`Evaluation`); and :func:`as_group`, a group from None, a dict or itself. The run (:mod:`lfed.core.run`) and
its settings (:mod:`lfed.core.settings`, ``RunSettings``) both take them; the other two groups are
:class:`lfed.core.algorithm.LocalTraining` and :class:`lfed.participation.stragglers.Stragglers`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from lfed.checks import integer, one_of

__all__ = ["Engine", "Evaluation", "as_group"]


@dataclass(frozen=True)
class Engine:
    """How the cohort is computed and where per-client state lives.

    Attributes:
        backend: ``auto``, ``vmap`` (the cohort as one computation) or ``loop`` (client by client).
        chunk_size: Train at most this many clients at once (bounds memory); None: the whole cohort.
        client_state: Where per-client rows live (:mod:`lfed.state.stores`): ``device``, ``host`` or ``disk``.
        client_state_dir: The ``disk`` files' directory (None: ``<default_root_dir>/client_state``).
    """

    backend: Literal["auto", "vmap", "loop"] = "auto"
    chunk_size: int | None = None
    client_state: Literal["device", "host", "disk"] = "device"
    client_state_dir: str | None = None

    def __post_init__(self) -> None:
        from lfed.engine import BACKENDS
        from lfed.state.stores import PLACEMENTS

        one_of("engine.backend", self.backend, BACKENDS)
        one_of("engine.client_state", self.client_state, PLACEMENTS)
        if self.chunk_size is not None:
            integer("engine.chunk_size", self.chunk_size, at_least=1, detail=" or None (the whole cohort)")
        if self.client_state_dir is not None and self.client_state != "disk":
            raise ValueError("engine.client_state_dir: only used with client_state='disk' (engine.client_state), "
                             f"got client_state={self.client_state!r}")


@dataclass(frozen=True)
class Evaluation:
    """What an evaluation scores besides the global model on the test set.

    Attributes:
        personal_clients: Clients scored on their own held-out splits (``global/*``, ``personal/*``;
            docs/personalization.md): None, all; a number, a seeded sample of that many.
        client_sample: Clients whose held-out splits score the global model at every evaluation (``client/acc_*``):
            a seeded sample of this many of the clients with a held-out split, the same at every evaluation (default
            10,000, so an evaluation's cost is bounded whatever the population; its standard error is logged as
            ``client/acc_mean_se``); None, every one (chunked).
        personal_chunk: Clients whose personal models are scored per vmapped call (bounds memory).
        round_local_accuracy: Score the trained models on their held-out splits each round (``bmta_local``).
        accuracy_targets: Test accuracies for the "rounds (uploads) to reach" report.
    """

    personal_clients: int | None = None
    client_sample: int | None = 10_000
    personal_chunk: int = 256
    round_local_accuracy: bool = True
    accuracy_targets: list[float] | None = None

    def __post_init__(self) -> None:
        if self.personal_clients is not None:
            integer("evaluation.personal_clients", self.personal_clients, at_least=1, detail=" or None (every client)")
        integer("evaluation.personal_chunk", self.personal_chunk, at_least=1)
        if self.client_sample is not None:
            integer("evaluation.client_sample", self.client_sample, at_least=1, detail=" or None (every client)")
        if not isinstance(self.round_local_accuracy, bool):
            raise ValueError(f"evaluation.round_local_accuracy: must be true or false, got {self.round_local_accuracy!r}")
        from lfed.evaluation.communication import check_accuracy_targets

        try:
            check_accuracy_targets(self.accuracy_targets)
        except ValueError as err:
            raise ValueError(f"evaluation.{err}") from None


def as_group(value: Any, cls: type, name: str):
    """A group given as None (its defaults), a dict of some of its fields, or itself (``name``: the setting's, in
    the errors)."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"{name}: unknown settings {unknown}; known: {sorted(known)}")
        return cls(**value)
    article = "an" if cls.__name__[0] in "AEIOU" else "a"
    raise TypeError(f"{name}: {article} {cls.__name__}, a dict of its settings or None, got {type(value).__name__}")

