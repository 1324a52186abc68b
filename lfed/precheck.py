"""A settings mistake of ``lfed fit|validate|test`` answered before torch and Lightning are imported (issue 66).

``import lightning.pytorch`` alone costs ~5 CPU s, and the full command (:mod:`lfed.lightning.cli`) needs it to build
its parser. :func:`precheck` reads the command line and its ``--config`` files with PyYAML only and refuses what it can
see without them, with the full command's own one line (``lfed fit: error: ...``, exit status 2), in a fraction of a
second:

* a ``--config`` file that does not exist or is not YAML;
* a key that is not a setting (``--model.fractoin``, ``modle:`` in a file), with the closest setting named;
* a name that is not one of its allowed names (``--model.algorithm fedprx``, ``model.partial_work``,
  ``model.engine.backend``), with the closest name;
* ``fit``'s simple values out of range: ``model.fraction``, ``model.training``'s, ``model.stragglers``',
  ``model.engine.chunk_size``, ``data``'s numbers, ``data.dataset``, ``data.partition`` and ``trainer.max_steps``.

What it knows it reads from the sources, never a copy: the settings are the signatures of Lightning's ``Trainer``,
:class:`~lfed.lightning.module.FederatedModule` and :class:`~lfed.data.federated.FederatedDataset` and the fields of
the settings' groups, read with :mod:`ast` from their files (a few milliseconds); the names are the registry's
``PRESETS``, ``DATASETS``, ``PARTITIONS`` and ``PARTIAL_WORK``, read the same way; the value checks are
:mod:`lfed.checks`' and :mod:`lfed.participation.fractions`' (no torch). Anything else (a ``class_path`` and its
``init_args``, a component's own settings, a role's name, lfed 0.3's keys, Trainer values, an abbreviated option, a
type it does not know) it leaves to the full command, and whenever it cannot read a source it says nothing: it never
refuses what the full command accepts. ``tests/test_precheck.py`` holds its tables to the real parser's, its messages
to the full command's, and every shipped config to passing it.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

from lfed.precheck_tables import COMMANDS, TOP_LEVEL, Tables, tables

__all__ = ["COMMANDS", "TOP_LEVEL", "Tables", "precheck", "tables"]

#: Arguments whose meaning the full command decides alone (help, printing the config, Lightning's refused optimizer).
DEFER = ("-h", "--help", "--help-all", "--print_config", "--optimizer", "--lr_scheduler")

_INT = re.compile(r"[+-]?\d+")


# ------------------------------------------------------------------------------------------------- the command line
#: A setting given through its component's own settings (``--data.train.class_path ...``): given, not read here.
_GIVEN = object()


class _Defer(Exception):
    """Something the pre-check does not read: the full command decides."""


class _Refused(Exception):
    """A mistake, said in one line (the message)."""


def _unknown_message(key: str, known: list[str], sub: str, files: list[str]) -> str:
    """lfed's line for a key that is not a setting (:func:`lfed.lightning.cli_errors.key_message`'s wording)."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
    where = ""
    for name in files:  # the last --config file that holds the key
        node: Any = _load(name, quiet=True)
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            where = f"--config {name}: "
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{where}{key}: not a setting of lfed {sub}{hint}; lfed {sub} --help lists them"


def _literal_message(key: str, value: str, names: tuple[str, ...], optional: bool) -> str:
    """The parser's line for a name that is not one of ``names`` (:func:`lfed.lightning.cli_errors.one_line`'s)."""
    quoted = ", ".join(repr(n) for n in names)
    reasons = f" (Expected a typing.Literal[{quoted}])" if optional else ""
    close = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{key}: expected one of {quoted}, got {value}{reasons}{hint}"


def _load(name: str, quiet: bool = False) -> Any:
    """A ``--config`` file's YAML (``quiet``: None for any problem)."""
    import yaml

    try:
        return yaml.safe_load(Path(name).read_text())
    except yaml.YAMLError as err:
        if quiet:
            return None
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None)
        if not problem:
            raise _Defer from err
        hint = " (YAML indents with spaces, never tabs)" if "\\t" in problem or "\t" in problem else ""
        raise _Refused(f"--config {name}: not valid YAML{at}: {problem}{hint}") from err
    except (OSError, UnicodeDecodeError) as err:
        if quiet:
            return None
        raise _Defer from err


class _Reader:
    """The command line and its config files, read in the parser's order into one dict of settings."""

    def __init__(self, t: Tables, sub: str, args: list[str], files: list[str]) -> None:
        self.t, self.sub, self.args = t, sub, args
        self.known = t.known()
        self.files = files  # the files named by `--config NAME` (key_message's "where")
        self.settings: dict[str, Any] = {}
        self.unknown: str | None = None  # the first unknown key of the command line (said after the parse, as argparse)

    # -- keys
    def _kind(self, key: str) -> str:
        """``known`` (a setting), ``below`` (under a setting the full command reads: a class's ``init_args``, a
        group's field of a class), ``deprecated`` (lfed 0.3's) or ``unknown``."""
        parts = key.split(".")
        top = self.t.top_level[self.sub]
        if len(parts) == 1:
            return "known" if key in top else "unknown"
        section, name = parts[0], parts[1]
        if section not in self.t.sections:
            return "below" if section in top else "unknown"
        if section == "model" and name in self.t.deprecated:
            return "deprecated"
        if name not in self.t.sections[section]:
            return "unknown"
        group = self.t.groups.get(f"{section}.{name}")
        if len(parts) == 2:
            return "known"
        if group is not None and len(parts) == 3:
            return "known" if parts[2] in group else "unknown"
        if group is not None and parts[2] not in group:
            return "unknown"
        return "below"

    def _check_name(self, key: str, value: Any) -> None:
        if key in self.t.literals and isinstance(value, str):
            names, optional = self.t.literals[key]
            if value not in names:
                raise _Refused(_literal_message(key, value, names, optional))

    def _set(self, key: str, value: Any) -> None:
        node = self.settings
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise _Defer
        node[parts[-1]] = value

    # -- a config file
    def config(self, name: str) -> None:
        if not Path(name).is_file():
            if Path(name).exists() or not isinstance(_value(name), str):
                raise _Defer  # a folder, or the settings themselves (--config '{model: {fraction: 0.5}}'): the parser reads it
            raise _Refused(f"config: File does not exist: '{os.path.join(os.getcwd(), name)}'")
        content = _load(name)
        if content is None:
            return
        if not isinstance(content, dict):
            raise _Defer
        self._walk(content, "")

    def _walk(self, node: dict, prefix: str) -> None:
        for k, value in node.items():
            if not isinstance(k, str) or k.startswith("__"):
                raise _Defer
            key = f"{prefix}{k}"
            kind = self._kind(key)
            if kind == "deprecated":
                raise _Defer
            if kind == "unknown":
                while isinstance(value, dict) and value:  # the parser names the first leaf under an unknown key
                    first = next(iter(value))
                    key, value = f"{key}.{first}", value[first]
                raise _Refused(_unknown_message(key, self.known, self.sub, self.files))
            descend = key in self.t.sections or key in self.t.groups
            if descend and isinstance(value, dict):
                self._walk(value, key + ".")
                continue
            if descend and value is not None:
                raise _Defer  # a section or group as another value: the parser says
            if kind == "known":
                self._check_name(key, value)
                self._set(key, value)

    # -- the command line
    def read(self) -> None:
        args, i = self.args, 0
        while i < len(args):
            a = args[i]
            if a in DEFER or a.startswith(("--help", "--print_config")) or not a.startswith("--"):
                raise _Defer
            key, eq, raw = a[2:].partition("=")
            if not eq:
                if i + 1 >= len(args) or args[i + 1].startswith("-") and not _number(args[i + 1]):
                    raise _Defer  # a flag, or a value the parser reads otherwise
                raw, i = args[i + 1], i + 1
            i += 1
            if key == "config":
                self.config(raw)
                continue
            if not key or key.split(".")[0] in ("optimizer", "lr_scheduler"):
                raise _Defer  # Lightning's optimizer arguments: the full command refuses them in its own words
            if key.endswith("+"):
                continue  # an item appended to a list setting (trainer.callbacks+)
            kind = self._kind(key)
            if kind == "deprecated" or (kind == "unknown" and self._abbreviates(key)):
                raise _Defer
            if kind == "unknown":
                self.unknown = self.unknown or key
                continue
            if kind == "below":  # a component's own setting (--data.train.class_path ...): its setting is given, unread
                parts = key.split(".")
                self._set(".".join(parts[:3] if ".".join(parts[:2]) in self.t.groups else parts[:2]), _GIVEN)
                continue
            value = _value(raw)
            if key in self.t.sections or key in self.t.groups:
                raise _Defer  # a whole section as one value
            self._check_name(key, value)
            self._set(key, value)
        if self.unknown is not None:
            raise _Refused(_unknown_message(self.unknown, self.known, self.sub, self.files))

    def _abbreviates(self, key: str) -> bool:
        """Whether ``--key`` is the start of an option (argparse takes an unambiguous start for the option)."""
        return any(k.startswith(key) for k in [*self.t.top_level[self.sub], *self.known])


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _value(raw: str) -> Any:
    """A command-line value as the parser reads it (YAML); a string it cannot read stays the string."""
    import yaml

    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


# ---------------------------------------------------------------------------------------------------- the values
def _float(value: Any) -> float | None:
    """A ``float`` setting's value as the parser gives it to the class (an int becomes a float); None: not a number
    the parser reads (it says so itself)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value) if _number(value) and value.strip().lower() not in ("nan", "inf", "-inf", "+inf") else None
        except ValueError:
            return None
    return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INT.fullmatch(value.strip()):
        return int(value)
    return None


def _check_values(settings: dict[str, Any]) -> None:
    """``fit``'s checks of simple values, in the order the full command meets them: the Trainer's end, the model's
    settings, the data's (:class:`lfed.data.federated.FederatedDataset`'s first checks)."""

    def section(name: str) -> dict[str, Any]:
        value = settings.get(name)
        return value if isinstance(value, dict) else {}

    def refuse(prefix: str, check, *args, **kwargs) -> None:
        try:
            check(*args, **kwargs)
        except ValueError as err:
            raise _Refused(f"{prefix}{err}") from None

    _check_trainer(section("trainer"))
    _check_model(section("model"), refuse)
    _check_data(section("data"))


def _check_trainer(trainer: dict[str, Any]) -> None:
    """The run's end (:func:`lfed.lightning.cli_errors.check_an_end`)."""
    steps = _int(trainer.get("max_steps"))
    given_epochs = trainer.get("max_epochs")
    epochs = _int(given_epochs)
    if steps is not None and steps < 1 and trainer.get("max_time") is None and (given_epochs is None or epochs is not None):
        if epochs is not None and epochs >= 0:  # lfed.lightning.cli_errors.check_an_end
            raise _Refused(f"trainer.max_epochs: a federated run counts rounds, not epochs (one training step is one "
                           f"round); give trainer.max_steps, the number of rounds (>= 1), instead of max_epochs={epochs}")
        raise _Refused(f"trainer.max_steps: the rounds of the run, an integer >= 1, got {steps} (a run with no end)")



def _check_model(model: dict[str, Any], refuse) -> None:
    """The model's simple settings, as their own checks say them (``refuse(prefix, check, *args)``)."""
    from lfed.checks import integer, number
    from lfed.participation.fractions import _check_fraction

    training = model.get("training")
    if isinstance(training, dict):  # lfed.core.algorithm.LocalTraining.__post_init__
        lr, batch = _float(training.get("client_lr", 0.05)), _int(training.get("batch_size", 10))
        epochs, steps = _int(training.get("local_epochs", 1)), training.get("local_steps")
        if lr is not None:
            refuse("model.training.", number, "client_lr", lr, above=0)
        if batch is not None and training.get("batch_size", 10) is not None:
            refuse("model.training.", integer, "batch_size", batch, at_least=1, detail=" or None (full batch)")
        if steps is None and epochs is not None:
            refuse("model.training.", integer, "local_epochs", epochs, at_least=1)
        elif _int(steps) is not None:
            refuse("model.training.", integer, "local_steps", _int(steps), at_least=1, detail=" or None (local_epochs)")
    stragglers = model.get("stragglers")
    if isinstance(stragglers, dict):  # lfed.participation.stragglers.Stragglers.__post_init__
        for name in ("p_inactive", "p_incomplete"):
            p = _float(stragglers.get(name, 0.0))
            if p is not None:
                refuse("model.stragglers.", number, name, p, at_least=0, at_most=1, detail=" (a probability)")
    engine = model.get("engine")
    if isinstance(engine, dict) and _int(engine.get("chunk_size")) is not None:  # lfed.core.groups.Engine
        refuse("model.", integer, "engine.chunk_size", _int(engine["chunk_size"]), at_least=1,
               detail=" or None (the whole cohort)")
    fraction = _float(model.get("fraction")) if not isinstance(model.get("fraction"), str) else None
    if fraction is not None:
        refuse("model.", _check_fraction, "fraction", fraction)


def _check_data(data: dict[str, Any]) -> None:
    """:class:`lfed.data.federated.FederatedDataset`'s checks before anything is read."""
    clients = _int(data.get("num_clients"))
    if clients is not None and clients < 1:
        raise _Refused(f"data.num_clients: must be >= 1, got {clients}")
    holdout = _float(data.get("holdout_fraction"))
    if holdout is not None and not 0 <= holdout < 1:
        raise _Refused(f"data.holdout_fraction: must be in [0, 1), got {holdout}")
    for name in ("validation_fraction", "client_validation_fraction"):
        value = _float(data.get(name))
        if value is not None and not 0 <= value < 1:
            raise _Refused(f"data.{name}: must be in [0, 1), got {value}")
    batch = _int(data.get("eval_batch_size"))
    if batch is not None and batch < 1:
        raise _Refused(f"data.eval_batch_size: must be >= 1, got {batch}")
    partition = data.get("partition")
    t = tables()
    if isinstance(partition, str) and partition not in t.partitions:
        close = difflib.get_close_matches(partition, t.partitions, n=1)
        raise _Refused(f"data.partition: {partition!r} is not one of {t.partitions}"
                       + (f" (did you mean {close[0]!r}?)" if close else ""))
    rho = _float(data.get("rho"))
    if rho is not None and not rho > 0:
        raise _Refused(f"data.rho: the Dirichlet concentration, a number > 0, got {rho}")
    for name in ("shards_per_client", "classes_per_client"):
        value = _int(data.get(name))
        if value is not None and value < 1:
            raise _Refused(f"data.{name}: must be an integer >= 1, got {value!r}")
    dataset = data.get("dataset")
    if isinstance(dataset, str) and dataset not in t.datasets and data.get("train") is None and data.get("test") is None:
        close = difflib.get_close_matches(dataset, t.datasets, n=1)
        raise _Refused(f"data.dataset: {dataset!r} is not one of {t.datasets}"
                       + (f" (did you mean {close[0]!r}?)" if close else ""))


def precheck(argv: list[str]) -> str | None:
    """The one line of the first mistake :func:`precheck` can see in ``argv`` (``["fit", "--config", ...]``, the
    command line after ``lfed``), as ``lfed fit`` would say it after ``: error: ``; None when it sees none (or
    cannot read what it would need: the full command decides).

    Reads the command line and its ``--config`` files in the parser's order: a missing or broken file, a name
    that is not allowed, and the type-checked settings are said where the parser meets them; a key that is not a
    setting after the whole command line (argparse's order); then, for ``fit``, the simple values.
    """
    if not argv or argv[0] not in COMMANDS or any(a in DEFER or a.startswith(("--help", "--print_config")) for a in argv):
        return None  # nothing to check, or what the full command alone answers (its help, its config printed)
    sub, args = argv[0], ["--config" if a == "-c" else a for a in argv[1:]]
    files = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"]
    try:
        reader = _Reader(tables(), sub, args, files)
        reader.read()
        if sub == "fit":  # validate/test take the model's and data's settings from the checkpoint
            _check_values(reader.settings)
    except _Refused as refused:
        return str(refused)
    except Exception:  # noqa: BLE001 - whatever the pre-check cannot read, the full command reads
        return None
    return None
