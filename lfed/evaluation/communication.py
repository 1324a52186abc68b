"""Communication accounting: client uploads and bits per round and in total.

docs/algorithms.md §5 (003's communication cost ``Σ_t K_t``, "rounds (uploads) to reach X%
accuracy") and docs/algorithms.md §7 (bits up and down). The meter only adds up what the
caller reports; what counts as an upload (e.g. inactive clients upload nothing)
and how many bits a message has is the caller's decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from lfed.checks import number

__all__ = ["CommunicationMeter", "check_accuracy_targets", "rounds_to_reach"]


def _check_count(name: str, value: object) -> None:
    number(name, value, at_least=0)


def check_accuracy_targets(targets: Sequence[float] | None) -> list[float]:
    """Validate the accuracies of a "rounds (uploads) to reach X%" report (003's tables).

    Test accuracy is logged as a fraction, so targets are fractions too: 90% is ``0.9``.
    A target of ``90`` could never be reached and would silently report nothing.

    Args:
        targets: Accuracies in ``[0, 1]``, or ``None`` for none.

    Returns:
        The targets as a list of floats (empty for ``None``).

    Raises:
        ValueError: If ``targets`` is not a list of numbers in ``[0, 1]``.
    """
    if targets is None:
        return []
    if isinstance(targets, (str, bytes)) or not isinstance(targets, Sequence):
        raise ValueError(f"accuracy_targets must be a list of accuracies in [0, 1], got {targets!r}")
    out: list[float] = []
    for i, t in enumerate(targets):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= t <= 1.0:
            raise ValueError(
                f"accuracy_targets[{i}] must be an accuracy in [0, 1] (a fraction: 90% is 0.9), got {t!r}"
            )
        out.append(float(t))
    return out


def rounds_to_reach(
    history: Sequence[tuple[int, int, float]], target: float
) -> tuple[int, int] | None:
    """First point of a run at which accuracy reached ``target`` (003's tables).

    003 reports e.g. "423 (6690)": the accuracy first reached 90% after 423
    rounds and 6690 cumulative client uploads.

    Args:
        history: ``(rounds, cumulative_uploads, accuracy)`` per evaluation, in
            order. ``rounds`` is whatever the caller counts; to match 003 use the
            number of completed rounds (``CommunicationMeter.rounds``), not the
            0-based index of the last round. ``accuracy`` in the same units as
            ``target`` (fraction or percent).
        target: Accuracy to reach (``>=`` counts as reached).

    Returns:
        ``(rounds, cumulative_uploads)`` of the first entry with
        ``accuracy >= target``, or ``None`` if it is never reached.

    Raises:
        ValueError: If rounds are not strictly increasing or uploads decrease.
    """
    previous: tuple[int, int, float] | None = None
    for i, entry in enumerate(history):
        if len(entry) != 3:
            raise ValueError(f"history[{i}] must be (rounds, uploads, accuracy), got {entry!r}")
        rounds, uploads, accuracy = entry
        if previous is not None and (rounds <= previous[0] or uploads < previous[1]):
            raise ValueError(
                f"history must have strictly increasing rounds and non-decreasing uploads, "
                f"got {tuple(entry)} after {previous}"
            )
        previous = (rounds, uploads, accuracy)
    for rounds, uploads, accuracy in history:
        if accuracy >= target:
            return rounds, uploads
    return None


@dataclass
class CommunicationMeter:
    """Per-round and cumulative communication (docs/algorithms.md §5, §7).

    Call :meth:`record` once per completed round and :meth:`log_accuracy` after
    each evaluation. All fields are plain numbers, so :meth:`state_dict` can go
    into a Lightning checkpoint (``on_save_checkpoint``) and a resumed run goes
    on counting where it stopped.

    Attributes:
        rounds: Completed rounds recorded so far.
        uploads: Cumulative client uploads ``Σ_t K_t``.
        bits_up: Cumulative bits sent by clients.
        bits_down: Cumulative bits sent by the server.
        round_uploads: Uploads of the last recorded round.
        round_bits_up: Bits up of the last recorded round.
        round_bits_down: Bits down of the last recorded round.
        history: ``(rounds, uploads, accuracy)`` per :meth:`log_accuracy` call.
    """

    rounds: int = 0
    uploads: int = 0
    bits_up: float = 0
    bits_down: float = 0
    round_uploads: int = 0
    round_bits_up: float = 0
    round_bits_down: float = 0
    history: list[tuple[int, int, float]] = field(default_factory=list)

    def record(self, uploads: int, bits_up: float = 0, bits_down: float = 0) -> dict[str, float]:
        """Add one round.

        Args:
            uploads: Clients whose upload happened this round (``>= 0``).
            bits_up: Bits all clients sent this round.
            bits_down: Bits the server sent this round (e.g. the broadcast size
                times the number of receiving clients).

        Returns:
            The metrics of :meth:`metrics`.

        Raises:
            ValueError: On negative values or a non-int ``uploads``.
        """
        if isinstance(uploads, bool) or not isinstance(uploads, int):
            raise ValueError(f"uploads must be an int >= 0, got {uploads!r}")
        _check_count("uploads", uploads)
        _check_count("bits_up", bits_up)
        _check_count("bits_down", bits_down)
        self.rounds += 1
        self.round_uploads, self.round_bits_up, self.round_bits_down = uploads, bits_up, bits_down
        self.uploads += uploads
        self.bits_up += bits_up
        self.bits_down += bits_down
        return self.metrics()

    def metrics(self, prefix: str = "comm/") -> dict[str, float]:
        """Current values as a flat dict for ``LightningModule.log_dict``."""
        values = {
            "uploads": self.round_uploads,
            "uploads_total": self.uploads,
            "bits_up": self.round_bits_up,
            "bits_up_total": self.bits_up,
            "bits_down": self.round_bits_down,
            "bits_down_total": self.bits_down,
        }
        return {prefix + k: float(v) for k, v in values.items()}

    def log_accuracy(self, accuracy: float) -> None:
        """Remember ``(rounds, uploads, accuracy)`` at the current point of the run.

        A second call at the same ``rounds`` replaces the first.
        """
        if self.history and self.history[-1][0] == self.rounds:
            self.history.pop()
        self.history.append((self.rounds, self.uploads, float(accuracy)))

    def rounds_to_reach(self, target: float) -> tuple[int, int] | None:
        """:func:`rounds_to_reach` over this meter's history."""
        return rounds_to_reach(self.history, target)

    def state_dict(self) -> dict[str, Any]:
        """All fields as plain Python values."""
        state = asdict(self)
        state["history"] = [list(h) for h in self.history]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`'s output."""
        for name in ("rounds", "uploads", "bits_up", "bits_down"):
            setattr(self, name, state[name])
        for name in ("round_uploads", "round_bits_up", "round_bits_down"):
            setattr(self, name, state[name])
        self.history = [(int(r), int(u), float(a)) for r, u, a in state["history"]]
