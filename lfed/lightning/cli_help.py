"""``lfed fit|validate|test --help`` (:mod:`lfed.lightning.cli`): short lists of subclasses, the Trainer settings a run uses.

* ``--help`` lists at most a few of the hundreds of torch subclasses a type accepts (:func:`shorten_subclass_list`),
  and lfed's own classes a user passes (not its internal parts).
* Of Lightning's Trainer settings, ``--help`` lists those a federated run uses most (:data:`TRAINER_SHOWN`);
  ``--help-all`` every one (:class:`LfedHelpFormatter`).
"""

from __future__ import annotations

from typing import Any

from jsonargparse import DefaultHelpFormatter

from lfed.core.registry import entry, names

#: lfed classes that are subclasses of a torch type but no value a user passes (they are lfed's own parts).
_INTERNAL = ("lfed.FederatedModule", "lfed.lightning.module.", "lfed.client.", "lfed.engine.", "lfed.participation.sampling.ClientSampler",
             "lfed.participation.sampling.UniformSampler", "lfed.participation.sampling.AttentionSampler", "lfed.base.component.Component",
             "lfed.lightning.driver.", "lfed.participation.clock.")


#: The lfed classes an argument's help lists (others: every lfed class not in :data:`_INTERNAL`).
_LISTED = {"model.objective": tuple(sorted({entry("objective", n)[0].rsplit(".", 1)[0] + "." for n in names("objective")})),
           "model.net": ("lfed.models.",), "model.loss": ()}


def shorten_subclass_list(text: str, keep: int = 4, dest: str = "") -> str:
    """Shorten jsonargparse's ``", known subclasses: a, b, ..."`` help suffix.

    lfed's own classes are all kept; of the others, the first ``keep`` are shown and the rest
    counted (any importable class path is accepted all the same). ``dest``: the argument (the net lists
    lfed's models, the loss torch's losses, the objective lfed's client rules: :data:`_LISTED`).
    """
    mark = ", known subclasses: "
    if mark not in text:
        return text
    head, names = text.split(mark, 1)
    names = [n.strip() for n in names.split(",") if n.strip()]
    if dest in _LISTED:
        own = [n for n in names if n.startswith(_LISTED[dest]) and not n.endswith(".ClientRule")]
    else:
        own = [n for n in names if n.startswith("lfed.") and not n.startswith(_INTERNAL)]
    other = [n for n in names if not n.startswith("lfed.") and (dest != "model.loss" or n.endswith("Loss"))]
    shown = own + other[:keep]
    more = len(other) - len(other[:keep])
    tail = f", ... and {more} more (any importable class path)" if more > 0 else ""
    return f"{head}{mark}{', '.join(shown)}{tail}"


#: The Lightning Trainer settings ``lfed <command> --help`` lists (``--help-all``: every one of them).
TRAINER_SHOWN = ("trainer", "trainer.max_steps", "trainer.val_check_interval", "trainer.accelerator", "trainer.devices",
                 "trainer.strategy", "trainer.num_nodes", "trainer.precision", "trainer.default_root_dir", "trainer.logger",
                 "trainer.callbacks", "trainer.enable_progress_bar")


class LfedHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help formatter with the "known subclasses" lists shortened (:func:`shorten_subclass_list`) and,
    unless :attr:`full`, only the Trainer settings of :data:`TRAINER_SHOWN` (the rest counted in one line)."""

    #: Every Trainer setting (``--help-all``), or only :data:`TRAINER_SHOWN`.
    full = False

    def _shown(self, action: Any) -> bool:
        dest = getattr(action, "dest", "") or ""
        return self.full or not dest.startswith("trainer.") or dest in TRAINER_SHOWN

    def add_usage(self, usage: Any, actions: Any, groups: Any, prefix: Any = None) -> None:
        super().add_usage(usage, [a for a in actions if self._shown(a)], groups, prefix)

    def add_argument(self, action: Any) -> None:
        if not self._shown(action):
            return  # counted in the group's description (describe_trainer_group)
        full = getattr(action, "extra_help", None)
        if callable(full) and not getattr(full, "lfed_short", False):

            dest = getattr(action, "dest", "")

            def short(full=full, dest=dest) -> str:
                return shorten_subclass_list(full(), dest=dest)

            short.lfed_short = True  # type: ignore[attr-defined]
            action.extra_help = short
        super().add_argument(action)


def describe_trainer_group(parser: Any) -> None:
    """Unless ``--help-all``: the Trainer group's description says that ``--help`` lists the settings a run uses most and
    counts the others (:class:`LfedHelpFormatter` leaves them out)."""
    group = getattr(parser, "groups", {}).get("trainer")
    if group is not None and not LfedHelpFormatter.full:  # --help lists the Trainer settings a run uses most
        hidden = sum(1 for a in group._group_actions if a.dest.startswith("trainer.") and a.dest not in TRAINER_SHOWN)
        group.description = (f"Lightning's Trainer: the settings a federated run uses most (one training step is one "
                             f"round). {hidden} more are Lightning's own: --help-all lists them all.")
