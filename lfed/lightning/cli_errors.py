"""A mistake in ``lfed fit|validate|test``'s configuration, found before the run's first round, said in one line.

:func:`lfed.lightning.cli.main` prints a :class:`ConfigError` as ``lfed fit: error: <argument>: <what is allowed>`` and
exits with status 2. Its message is made here: the parser's ``Parser key`` messages (:func:`one_line`), an unknown key
(:func:`key_message`: the closest setting named), a component's own check under a ``class_path``
(:func:`nested_message`: its key found), a ``--config`` file that is not YAML (:func:`yaml_message`); and here are the
checks of the command's Trainer settings that refuse a run before anything starts (:func:`check_command`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Callback

from lfed.core.registry import NAMES, component_class, names
from lfed.lightning.cli_args import SUBCOMMANDS

#: Environment variable that makes ``lfed`` show the traceback of a configuration error.
DEBUG_ENV = "LFED_DEBUG"

#: What a mistake in the configuration raises before the run's first round (lfed's checks).
CONFIG_ERRORS = (ValueError, TypeError, FileNotFoundError, MisconfigurationException)


class ConfigError(Exception):
    """A mistake in a run's configuration, found before its first round; its message is one line.

    :class:`lfed.lightning.cli.LfedCLI` raises it with ``config_errors=True`` (the ``lfed`` console script), with
    the original exception as its ``__cause__``.
    """


class FirstStep(Callback):
    """Notes when the run's first step starts: a round (``fit``) or an evaluation batch.

    An exception before it is raised while the run is being set up (its configuration); one
    after it, by the run itself.
    """

    def __init__(self) -> None:
        self.started = False

    def _start(self, *args: Any, **kwargs: Any) -> None:
        self.started = True

    on_train_batch_start = on_validation_batch_start = on_test_batch_start = on_predict_batch_start = _start


_CLASS = re.compile(r"<class '(?:builtins\.)?([\w.]+)'>")


def _type_names(text: str) -> str:
    """``"[<class 'torch.nn.modules.module.Module'>, <class 'NoneType'>]"`` -> ``"torch.nn.modules.module.Module or null"``."""
    names = ["null" if n == "NoneType" else n for n in _CLASS.findall(text)]
    return " or ".join(names)


def _parser_key_message(key: str, body: list[str]) -> str:
    """One line from jsonargparse's ``Parser key "K": ...`` message: the key, what is allowed, what was given."""
    text = "\n".join(body)
    given = re.search(r"(?:Given value|Got value): (.*)", text)
    literal = re.search(r"Expected a typing\.Literal\[(.*)\]", text)
    expected = None
    if literal:
        expected = f"one of {literal.group(1)}"
    elif "Subtypes:" in text:
        expected = _type_names(text.split("Subtypes:", 1)[1].splitlines()[0])
    elif m := re.search(r"Expected a (<class '[^']+'>)", text):
        expected = _type_names(m.group(1))
    reasons: list[str] = []
    if "Errors:" in text:
        for line in text.split("Errors:", 1)[1].splitlines():
            line = line.strip()
            if line.startswith(("Given value", "Subtypes:")):
                break
            if line.startswith("- "):
                reasons.append(line[2:])
            elif line and reasons:
                reasons[-1] = f"{reasons[-1]} {line}"
        reasons = [r for r in reasons if not re.fullmatch(r"Expected a <class 'NoneType'>", r)]
    if expected is None or given is None:
        return f"{key}: " + " ".join(line.strip() for line in body if line.strip())
    tail = f" ({'; '.join(reasons)})" if reasons else ""
    got = given.group(1).strip()
    if literal:  # a misspelt name: the closest allowed one (issue 66: fedprx listed 29 names and no suggestion)
        options = re.findall(r"'([^']*)'", literal.group(1))
        close = difflib.get_close_matches(got.strip("'\""), options, n=1, cutoff=0.6)
        tail += f" (did you mean {close[0]!r}?)" if close else ""
    return f"{key}: expected {expected}, got {got}{tail}"


def with_full_key(message: str, settings_of_run: Callable[[], dict[str, Any]]) -> str:
    """``message`` with its leading setting named by its full key (issue 66): a component's check says
    ``fraction must be in (0, 1], got 1.5``; the command line says ``model.fraction``. The leading name (``fraction``,
    ``engine.backend``) becomes the one key of the run's ``model``/``data`` settings it ends with; a name that is
    already a full key, none, or several, leave the message as it is."""
    m = re.match(r"([A-Za-z_][\w.]*)(:| must | is | should )", message)
    if m is None or m.group(1).startswith(("model.", "data.", "trainer.")):
        return message
    try:
        settings = settings_of_run()
    except Exception:  # noqa: BLE001 - the message without its full key is still lfed's
        return message
    name, found = m.group(1), []

    def walk(value: Any, path: str) -> None:
        if path == name or path.endswith("." + name):
            found.append(path)
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else k)

    walk({k: v for k, v in settings.items() if k in ("model", "data")}, "")
    found = [f for f in found if "." in f]
    return message if len(found) != 1 else found[0] + message[len(name):]


def one_line(message: str) -> str:
    """An error message as one line (jsonargparse's ``Parser key`` messages: key, allowed, given).

    >>> one_line('Parser key "model.training.client_lr":\\n  Expected a <class ' + "'float'>. Got value: abc")
    'model.training.client_lr: expected float, got abc'
    >>> one_line("ckpt_path: x.ckpt does not match this configuration:\\n  data.seed: checkpoint 0, this run 1")
    'ckpt_path: x.ckpt does not match this configuration: data.seed: checkpoint 0, this run 1'
    """
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    if not lines:
        return str(message).strip() or "(no message)"
    m = re.match(r'Parser key "([^"]+)":\s*(.*)', lines[0])
    if m:
        return _parser_key_message(m.group(1), [m.group(2), *lines[1:]])
    out = lines[0]
    for line in lines[1:]:
        out += (" " if out.endswith(":") else "; ") + line
    return out


def yaml_message(args: list[str], err: Exception) -> str:
    """One line for a ``--config`` file that is not YAML: the file, the line and column, what the parser found."""
    files = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"]
    files += [a.split("=", 1)[1] for a in args if isinstance(a, str) and a.startswith("--config=")]
    where = "--config"
    for name in files:
        try:
            yaml.safe_load(Path(name).read_text())
        except yaml.YAMLError as own:
            err, where = own, f"--config {name}"
            break
        except OSError:
            continue
    return f"{where}: not valid YAML{yaml_problem(err)}"


def yaml_problem(err: Exception) -> str:
    """`` at line 3, column 1: found character '\\t' that cannot start any token (YAML indents with spaces, never tabs)``:
    where a YAML file is broken and what the parser found, for one line (``--config`` files, sweep files)."""
    mark = getattr(err, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or one_line(str(err))
    hint = " (YAML indents with spaces, never tabs)" if "\\t" in problem or "\t" in problem else ""
    return f"{at}: {problem}{hint}"


def key_message(text: str, args: list[str], parser: Any) -> str | None:
    """One line for a key the parser does not know (a typo on the command line or in a ``--config`` file: the file
    and the closest setting named), or a component's setting given without its class
    (``--model.objective.mu 0.5`` on the default objective: the classes that have it named); None for others.
    ``parser``: the CLI's parser (None when it failed before there was one)."""
    nested = re.search(r'Parser key "model\.(\w+)".*NestedArg\(key=\'([^\']+)\', val=\'([^\']*)\'\)', text, re.S)
    if nested and nested.group(1) in NAMES:
        import inspect

        role, key, value = nested.groups()
        key = key.removeprefix("init_args.")
        having = []
        for name in names(role):
            cls = component_class(role, name)
            if cls is not None and key in inspect.signature(cls.__init__).parameters:
                having.append(f"{cls.__module__}.{cls.__qualname__}")
        having = list(dict.fromkeys(having))
        example = having[0] if having else "<its class path>"
        classes = f" ({key} is a setting of {', '.join(having)})" if having else f" (no built-in {role} has a setting {key!r})"
        return (f"model.{role}.{key}: a setting of the {role}'s class, and this command gives no class for it (a name, or "
                f"the default, takes its defaults); give the class first: --model.{role} {example} "
                f"--model.{role}.init_args.{key} {value}{classes}")
    unknown = re.search(r"does not accept option '([^']+)'", text) or re.search(r"unrecognized arguments: --([^\s=]+)", text)
    if not unknown:
        return None
    key = unknown.group(1)
    known = known_keys(parser, args)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
    where = ""
    for name in [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"]:
        try:
            node = yaml.safe_load(Path(name).read_text())
        except (OSError, yaml.YAMLError):
            continue
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            where = f"--config {name}: "
    hint = f" (did you mean {close[0]}?)" if close else ""
    sub = next((a for a in args if a in SUBCOMMANDS), "fit")
    return f"{where}{key}: not a setting of lfed {sub}{hint}; lfed {sub} --help lists them"

def known_keys(parser: Any, args: list[str]) -> list[str]:
    """Every setting the parser of this command knows (``model.training.client_lr``, ``trainer.max_steps``, ...); none
    when there is no parser yet."""
    sub = getattr(parser, "_subcommands_action", None)
    name = next((a for a in args if a in SUBCOMMANDS), None)
    if sub is not None and name in getattr(sub, "_name_parser_map", {}):
        parser = sub._name_parser_map[name]
    if parser is None:
        return []
    return sorted({a.dest for a in parser._actions if isinstance(a.dest, str) and "." in a.dest})

def nested_message(text: str, settings_of_run: Callable[[], dict[str, Any]]) -> str | None:
    """lfed's own message of a component's setting under a ``class_path`` first, as one line with its argument path.

    jsonargparse reports a ``ValueError`` of a component's ``__init__`` (``delta: must be ... in (0, 1), got 1.5``)
    inside its "Does not validate against any of the Union subtypes" text, without the key; this finds the
    component's key in the config by its class path: ``model.combination.init_args.delta: must be ...``.
    ``settings_of_run``: the run's settings as parsed (asked for only here; a failure leaves the key unnamed).
    """
    if "Union subtypes" not in text or "Errors:" not in text:
        return None
    reasons = [ln.strip()[2:] for ln in text.split("Errors:", 1)[1].splitlines() if ln.strip().startswith("- ")]
    own = [r for r in reasons if not r.startswith(("Expected a ", "Not a valid", "Problem with given class_path",
                                                     "Import path", "Type "))]
    found = re.search(r"class_path='([^']+)'", text)
    if not own or found is None:
        return None
    key = None
    try:
        settings = settings_of_run()
    except Exception:  # noqa: BLE001 - the message without its key is still lfed's
        settings = {}

    def walk(value: Any, path: str) -> None:
        nonlocal key
        if isinstance(value, dict):
            if value.get("class_path") == found.group(1) and key is None:
                key = path
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else k)

    walk({k: v for k, v in settings.items() if k in ("model", "data")}, "")
    reason = own[0]
    name = re.match(r"([A-Za-z_][\w.]*): (.*)", reason)
    if key is None:
        return f"{found.group(1)}: {reason}"
    if name:
        return f"{key}.init_args.{name.group(1)}: {name.group(2)}"
    return f"{key}: {reason}"


def check_an_end(trainer: Any) -> None:
    """``lfed fit`` needs an end: ``trainer.max_steps`` >= 1 rounds (or a ``max_time`` of its own; epochs are no unit of a
    federated run, so ``max_epochs`` without ``max_steps`` is refused)."""
    steps = trainer.get("max_steps")
    if steps is not None and steps >= 1:
        return
    epochs, time = trainer.get("max_epochs"), trainer.get("max_time")
    if time is not None:
        return
    if epochs is not None and epochs >= 0:  # lfed's loader has no epochs: an "epoch" would be 1,000 rounds
        raise ValueError(f"trainer.max_epochs: a federated run counts rounds, not epochs (one training step is one "
                         f"round); give trainer.max_steps, the number of rounds (>= 1), instead of max_epochs={epochs}")
    raise ValueError(f"trainer.max_steps: the rounds of the run, an integer >= 1, got {steps} (a run with no end)")


#: Lightning Trainer flags that cannot apply to a federated round, and why (lfed trains the clients itself: one
#: training step is one round of many clients' local steps, which Lightning's automatic optimization never sees).
NOT_FOR_ROUNDS = {
    "gradient_clip_val": "Lightning clips the gradient of one backward pass, and a round is many clients' local "
    "steps inside lfed's engine; drop it (to bound what a client sends: DP-FedAvg's clip, docs/privacy.md)",
    "accumulate_grad_batches": "one training step is one federated round, and rounds do not accumulate; drop it "
    "(a client's mini-batch is model.training.batch_size)",
}


def check_trainer_flags(trainer: Any) -> None:
    """Refuse, before anything starts, Trainer settings that cannot apply to a federated round or this machine."""
    for key, why in NOT_FOR_ROUNDS.items():
        value = trainer.get(key)
        if value is not None and value != {"gradient_clip_val": 0, "accumulate_grad_batches": 1}[key]:
            raise ValueError(f"trainer.{key}: {why}; got {value}")
    interval = trainer.get("val_check_interval")
    if isinstance(interval, float):
        raise ValueError(f"trainer.val_check_interval: evaluate every how many rounds, an integer >= 1, got {interval} "
                         "(a fraction of an epoch has no meaning: lfed's rounds are not epochs)")
    accelerator = trainer.get("accelerator")
    if isinstance(accelerator, str) and accelerator in ("gpu", "cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"trainer.accelerator: {accelerator!r} needs a CUDA device and torch sees none "
                             f"(torch {torch.__version__}, torch.cuda.is_available() is False); use "
                             "--trainer.accelerator auto (a GPU when there is one) or cpu")



def check_command(subcommand: str | None, cfg: Any) -> None:
    """Refuse a command before anything is built: ``validate``/``test`` without a ``--ckpt_path``, Trainer settings that
    cannot apply (:func:`check_trainer_flags`), ``fit`` without an end (:func:`check_an_end`)."""
    if subcommand in ("validate", "test") and cfg.get("ckpt_path") is None:
        raise ValueError(f"ckpt_path: lfed {subcommand} scores a trained model; give --ckpt_path <file.ckpt> "
                         "(or last: the latest checkpoint of this configuration)")
    check_trainer_flags(cfg.get("trainer", {}))
    if subcommand == "fit":
        check_an_end(cfg.get("trainer", {}))
