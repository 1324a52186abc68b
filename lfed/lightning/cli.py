"""``lfed fit|validate|test --config ...``: LightningCLI over FederatedModule and FederatedDataModule.

Defaults that make a federated run read well:

* Every run writes into its own directory, ``<trainer.default_root_dir>/runs/<algorithm>-<dataset>-<config
  id>/version_<n>/`` (the current directory when ``default_root_dir`` is not set; the config id is a
  hash of the ``model``, ``data`` and ``seed_everything`` settings, :mod:`lfed.lightning.reporting`): ``config.yaml``,
  ``metrics.csv`` (every logged metric, one row per round), ``checkpoints/last.ckpt``, ``environment.json`` (what
  the run's bits depend on: versions, device, CPU capability, threads; one record per start or resume,
  docs/reproducibility.md) and the Weights & Biases run (``wandb/``). The Trainer's ``default_root_dir`` is that directory.
* An atomic ``last.ckpt`` every ``checkpoint_every`` rounds (10)
  (:class:`lfed.lightning.checkpoint.RoundCheckpoint` through :class:`lfed.lightning.checkpoint.AtomicCheckpointIO`; a
  ``ModelCheckpoint`` of your own in ``trainer.callbacks`` replaces it). ``--ckpt_path last`` resumes
  the latest run of the same configuration, in its own directory.
* ``lfed validate|test --ckpt_path X`` needs no config: the model and data settings come from the
  checkpoint.
* Validation counts rounds (``val_check_interval`` rounds, no per-epoch check, no sanity check), the
  progress bar counts rounds, and the end of ``fit`` prints the evaluations as a table.
* Weights & Biases logging, online when the user is logged in, offline otherwise; ``WANDB_MODE=disabled``
  turns W&B off (the metrics CSV is still written). The loggers' run config (W&B's config, a
  ``CSVLogger``'s ``hparams.yaml``) holds the run's settings under their config names
  (``model.seed``, ``data.seed``, ``seed_everything``, :func:`lfed.lightning.reporting.flat_settings`), in
  place of Lightning's merge of the module's and the datamodule's hyperparameters
  (``trainer.enable_autolog_hparams`` is off), which refuses a run whose ``model.seed`` and
  ``data.seed`` differ.
* One way to set the server optimizer, ``--model.server_optimizer``: Lightning's ``--optimizer`` and
  ``--lr_scheduler`` are refused with a message naming it.
* Short class names of lfed's models (``--model.net MLP``) mean :mod:`lfed.models.zoo`' classes, and
  ``--help`` lists at most a few of the hundreds of torch subclasses a type accepts.
* A mistake in the configuration is one line, ``lfed fit: error: <argument>: <what is allowed>``,
  and exit status 2 (:func:`main`): the parser's errors, and a ``ValueError``, ``TypeError`` or
  ``FileNotFoundError`` (what lfed's checks raise) from building the model, data and trainer or
  from setting up the run before its first round (data loading, ``setup``, ``on_fit_start``,
  checkpoint checks). An error once the first round has started, or any other exception, keeps
  its traceback; ``LFED_DEBUG=1`` shows the traceback of every error. :func:`run_cli` (the
  Python API) raises every exception as it is.
"""

from __future__ import annotations

import difflib
import json
import netrc
import os
import re
import sys
from argparse import ArgumentError
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import DefaultHelpFormatter
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lfed.checks import HookError
from lfed.core.registry import NAMES, component_class, entry, names, settings_label
from lfed.core.settings import retired, upgrade_args
from lfed.lightning.checkpoint import RoundCheckpoint, install_atomic_io, read_checkpoint
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.lightning.reporting import (
    MetricsCSV,
    RoundProgressBar,
    RoundTable,
    config_id,
    flat_settings,
    latest_checkpoint,
    run_directory,
    run_name,
    silence_library_noise,
)
from lfed.models import zoo as lfed_models

SUBCOMMANDS = ("fit", "validate", "test")

#: Where the run's settings are stored in a checkpoint (plain values, readable with ``weights_only``).
CONFIG_KEY = "lfed_config"
#: Where the id of the run's W&B run is stored in a checkpoint: a resume continues that W&B run (``resume="allow"``).
WANDB_ID_KEY = "lfed_wandb_run_id"

#: Environment variable through which DDP worker processes find their rank 0's run directory.
RUN_DIR_ENV = "LFED_RUN_DIR"

#: Environment variable that makes ``lfed`` show the traceback of a configuration error.
DEBUG_ENV = "LFED_DEBUG"

#: What a mistake in the configuration raises before the run's first round (lfed's checks).
CONFIG_ERRORS = (ValueError, TypeError, FileNotFoundError, MisconfigurationException)


def wandb_logged_in() -> bool:
    """Whether a W&B API key is configured (environment or ``~/.netrc``), without prompting."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
        return os.path.exists(path) and netrc.netrc(path).authenticators("api.wandb.ai") is not None
    except (netrc.NetrcParseError, OSError):
        return False


def default_logger() -> dict | bool:
    """The default logger config: W&B, offline unless logged in; none when ``WANDB_MODE=disabled``.

    The W&B files go to the run directory (``save_dir`` is filled in per run). With
    ``WANDB_MODE=disabled`` there is no W&B logger at all (so no offline run directory either);
    the metrics CSV is written in both cases.
    """
    if os.environ.get("WANDB_MODE", "").strip().lower() == "disabled":
        return {"class_path": "lfed.lightning.reporting.MetricsCSV", "init_args": {"dirpath": None}}
    return {
        "class_path": "lfed.lightning.reporting.QuietWandbLogger",
        "init_args": {"project": "lfed", "save_dir": None, "offline": not wandb_logged_in()},
    }


# --------------------------------------------------------------------------- help and names


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
            return  # counted in the group's description (LfedCLI.add_arguments_to_parser)
        full = getattr(action, "extra_help", None)
        if callable(full) and not getattr(full, "lfed_short", False):

            dest = getattr(action, "dest", "")

            def short(full=full, dest=dest) -> str:
                return shorten_subclass_list(full(), dest=dest)

            short.lfed_short = True  # type: ignore[attr-defined]
            action.extra_help = short
        super().add_argument(action)


def lfed_model_names() -> dict[str, str]:
    """Short name -> class path of every ``nn.Module`` in :mod:`lfed.models.zoo`."""
    from torch import nn

    out = {}
    for name in dir(lfed_models):
        obj = getattr(lfed_models, name)
        if isinstance(obj, type) and issubclass(obj, nn.Module) and obj.__module__ == lfed_models.__name__:
            out[name] = f"lfed.models.{obj.__qualname__}"  # the zoo's public path (lfed.models exports it)
    return out


def resolve_short_names(args: list[str]) -> list[str]:
    """``--model.net MLP`` (or ``=MLP``) -> ``--model.net lfed.models.zoo.MLP`` for lfed's models.

    jsonargparse resolves a bare class name among every imported subclass of ``nn.Module`` and
    finds ``torchvision.ops.MLP`` first; lfed's models come first here.
    """
    names = lfed_model_names()
    out = list(args)
    for i, a in enumerate(out):
        if a == "--model.net" and i + 1 < len(out) and out[i + 1] in names:
            out[i + 1] = names[out[i + 1]]
        elif a.startswith("--model.net=") and a.split("=", 1)[1] in names:
            out[i] = "--model.net=" + names[a.split("=", 1)[1]]
    return out


#: Lightning's own optimizer arguments, refused: the server optimizer is ``--model.server_optimizer``.
REFUSED = {
    "optimizer": "--optimizer would replace the server optimizer without a word; set it with "
    "--model.server_optimizer (e.g. --model.server_optimizer torch.optim.SGD --model.server_optimizer.lr 1.0, "
    "or lfed.server.optimizers.FedAdam)",
    "lr_scheduler": "--lr_scheduler is not supported: lfed steps its server optimizer itself once per round; set the "
    "server optimizer with --model.server_optimizer",
}


def _refused_in_args(args: list[str]) -> str | None:
    for a in args:
        for key, message in REFUSED.items():
            flag = f"--{key}"
            if a == flag or a.startswith((flag + ".", flag + "=", flag + "+")):
                return message
    return None


def _class_paths(node: Any, where: str):
    """``(setting, class path)`` of every ``class_path`` in a parsed config value."""
    if isinstance(node, dict):
        path = node.get("class_path")
        if isinstance(path, str):
            yield where, path
        for key, value in node.items():
            yield from _class_paths(value, f"{where}.{key}" if where else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _class_paths(value, f"{where}[{i}]")


def unimportable_class_path(args: list[str]) -> str | None:
    """One line for the first ``class_path`` (in a ``--config`` file or a ``--key value`` argument) whose module does not
    import or lacks the class, naming the setting; None when all import. The parser would otherwise report it as
    "expected one of ..." with the import error at the very end."""
    import importlib
    from pathlib import Path

    import yaml

    found: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        key, eq, value = args[i].partition("=")
        if key.startswith("--") and not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value, i = args[i + 1], i + 1
        i += 1
        if not key.startswith("--") or not value:
            continue
        if key == "--config" and Path(value).is_file():
            try:
                found += [(f"{value}: {w}", c) for w, c in _class_paths(yaml.safe_load(Path(value).read_text()), "")]
            except yaml.YAMLError:
                continue  # the parser says what is wrong with the file
        elif key.endswith(".class_path"):
            found.append((key[2:], value))
        elif value.lstrip().startswith("{"):
            try:
                found += list(_class_paths(yaml.safe_load(value), key[2:]))
            except yaml.YAMLError:
                continue
    for where, path in found:
        module, _, name = path.rpartition(".")
        if not module:
            continue
        try:
            imported = importlib.import_module(module)
        except ImportError as err:
            return (f"{where}: class_path {path}: cannot import {module} ({err}); if it is your own file, put its folder "
                    "on PYTHONPATH (PYTHONPATH=. lfed fit ...)")
        if not hasattr(imported, name):
            return f"{where}: class_path {path}: {module} has no {name}"
    return None


# --------------------------------------------------------------------------- configuration errors


class ConfigError(Exception):
    """A mistake in a run's configuration, found before its first round; its message is one line.

    :class:`LfedCLI` raises it with ``config_errors=True`` (the ``lfed`` console script), with
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
    return f"{key}: expected {expected}, got {given.group(1).strip()}{tail}"


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


# --------------------------------------------------------------------------- the CLI


class RunConfig(Callback):
    """The run's ``model``, ``data`` and ``seed_everything`` settings: in every checkpoint and in the loggers.

    ``lfed validate|test --ckpt_path X`` rebuilds the model and data from them (no config needed).
    Once the run's checks have passed (the start of training or evaluation) every logger gets them as
    hyperparameters under their config names
    (``model.seed``, ``data.seed``: :func:`lfed.lightning.reporting.flat_settings`).
    """

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings

    def _log(self, trainer: Trainer, *args: Any) -> None:
        """The settings to every logger, once, when the run's checks have passed (a refused run starts no W&B run)."""
        if getattr(self, "_logged", False):
            return
        self._logged = True
        params = flat_settings(self.settings)
        for logger in trainer.loggers:
            logger.log_hyperparams(params)

    on_validation_start = on_test_start = on_predict_start = _log

    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        """The settings to the loggers, and what this stretch of the run's bits depend on to ``environment.json``."""
        self._log(trainer)
        if trainer.is_global_zero and trainer.default_root_dir:
            record_environment(Path(trainer.default_root_dir) / "environment.json", trainer.global_step,
                               trainer.strategy.root_device)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        checkpoint[CONFIG_KEY] = self.settings
        for logger in trainer.loggers:  # the W&B run this checkpoint continues, when one was started
            run = getattr(logger, "_experiment", None)
            if "Wandb" in type(logger).__name__ and isinstance(getattr(run, "id", None), str):
                checkpoint[WANDB_ID_KEY] = run.id


def record_environment(path: Path, round: int, device: Any = None) -> None:
    """Add this process's environment (:func:`lfed.state.environment.environment`), from ``round`` on, to the run's
    ``environment.json``: a list with one record per start or resume, so each stretch of the run says what its
    bits depend on (docs/reproducibility.md)."""
    from lfed.state.environment import environment

    records = []
    if path.is_file():
        try:
            records = json.loads(path.read_text())
        except (OSError, ValueError):
            records = []
    records = [r for r in records if isinstance(r, dict) and r.get("from_round", 0) < round]  # a rerun replaces
    records.append({"from_round": round, **environment(device)})
    path.write_text(json.dumps(records, indent=1) + "\n")


def _plain(value: Any) -> Any:
    """A JSON-able copy of a parsed config value (Namespaces -> dicts, paths -> str)."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    return json.loads(json.dumps(value, default=str))


def settings_of(cfg) -> dict[str, Any]:
    """A run's ``model``, ``data`` and ``seed_everything`` settings as plain values (its identity: the config id)."""
    return {"model": _plain(cfg.get("model")), "data": _plain(cfg.get("data")), "seed_everything": _plain(cfg.get("seed_everything"))}


class LfedCLI(LightningCLI):
    """LightningCLI with round-based defaults, per-run directories and a config check.

    Lightning's ``--optimizer``/``--lr_scheduler`` are off (``auto_configure_optimizers=False``)
    and refused; the help lists subclasses briefly (:class:`LfedHelpFormatter`).

    Args:
        config_errors: Raise a mistake in the configuration as a :class:`ConfigError` with a
            one-line message: the parser's errors (the parser then raises instead of printing
            its usage and exiting), and a ``ValueError``, ``TypeError`` or ``FileNotFoundError``
            raised before the run's first step (:data:`CONFIG_ERRORS`, :class:`FirstStep`).
            Other exceptions, and any after the first step, are raised as they are.
    """

    def __init__(
        self,
        *args: Any,
        auto_configure_optimizers: bool = False,
        parser_kwargs: dict | None = None,
        config_errors: bool = False,
        **kwargs: Any,
    ) -> None:
        short: dict[str, Any] = {"formatter_class": LfedHelpFormatter}
        if config_errors:
            short["exit_on_error"] = False
        parser_kwargs = {**short, "prog": "lfed", "description": "lfed: federated learning on PyTorch Lightning (lfed --help lists the commands)",
                         **{s: dict(short) for s in SUBCOMMANDS}, **(parser_kwargs or {})}
        self.first_step = FirstStep()
        try:
            super().__init__(*args, auto_configure_optimizers=auto_configure_optimizers, parser_kwargs=parser_kwargs, **kwargs)
        except ArgumentError as err:
            if not config_errors:
                raise
            args = kwargs.get("args") if kwargs.get("args") is not None else sys.argv[1:]
            raise ConfigError(self._key_message(str(err), list(args)) or one_line(str(err))) from err
        except yaml.YAMLError as err:  # a --config file that is not YAML (a tab, an unclosed bracket)
            if not config_errors:
                raise
            raise ConfigError(_yaml_message(kwargs.get("args") if kwargs.get("args") is not None else sys.argv[1:], err)) from err
        except CONFIG_ERRORS as err:
            if not self.first_step.started:  # a refusal during set-up: the run never was
                self._discard_run_dir()
            if not config_errors or (self.first_step.started and not isinstance(err, HookError)):
                raise
            raise ConfigError(self._nested_message(str(err)) or one_line(str(err))) from err

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Lightning's, without ``predict`` (a federated run has no predict step; ``lfed grid`` is :mod:`lfed.entry`'s)."""
        return {k: v for k, v in LightningCLI.subcommands().items() if k in SUBCOMMANDS}

    def _key_message(self, text: str, args: list[str]) -> str | None:
        """One line for a key the parser does not know (a typo on the command line or in a ``--config`` file: the file
        and the closest setting named), or a component's setting given without its class
        (``--model.objective.mu 0.5`` on the default objective: the classes that have it named); None for others."""
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
        known = self._known_keys(args)
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

    def _known_keys(self, args: list[str]) -> list[str]:
        """Every setting the parser of this command knows (``model.training.client_lr``, ``trainer.max_steps``, ...)."""
        parser = getattr(self, "parser", None)
        sub = getattr(parser, "_subcommands_action", None)
        name = next((a for a in args if a in SUBCOMMANDS), None)
        if sub is not None and name in getattr(sub, "_name_parser_map", {}):
            parser = sub._name_parser_map[name]
        if parser is None:
            return []
        return sorted({a.dest for a in parser._actions if isinstance(a.dest, str) and "." in a.dest})

    def _nested_message(self, text: str) -> str | None:
        """lfed's own message of a component's setting under a ``class_path`` first, as one line with its argument path.

        jsonargparse reports a ``ValueError`` of a component's ``__init__`` (``delta: must be ... in (0, 1), got 1.5``)
        inside its "Does not validate against any of the Union subtypes" text, without the key; this finds the
        component's key in the config by its class path: ``model.combination.init_args.delta: must be ...``.
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
            settings = self._settings(self._subconfig())
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

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--checkpoint_every",
            type=int,
            default=10,
            help="Rounds between checkpoints (an atomic last.ckpt in <run directory>/checkpoints); "
            "0 turns lfed's default checkpoint off. Ignored when trainer.callbacks has a ModelCheckpoint.",
        )
        for key in REFUSED:  # so that a config file's `optimizer:` is refused too, not merely unknown
            parser.add_argument(f"--{key}", type=Any, default=None, help="Not supported: use --model.server_optimizer.")
        group = getattr(parser, "groups", {}).get("trainer")
        if group is not None and not LfedHelpFormatter.full:  # --help lists the Trainer settings a run uses most
            hidden = sum(1 for a in group._group_actions if a.dest.startswith("trainer.") and a.dest not in TRAINER_SHOWN)
            group.description = (f"Lightning's Trainer: the settings a federated run uses most (one training step is one "
                                 f"round). {hidden} more are Lightning's own: --help-all lists them all.")
        parser.set_defaults(
            {
                "trainer.max_steps": 100,
                "trainer.val_check_interval": 10,
                "trainer.check_val_every_n_epoch": None,
                "trainer.num_sanity_val_steps": 0,
                "trainer.logger": default_logger(),
                "trainer.log_every_n_steps": 1,
                "trainer.enable_model_summary": False,
                "trainer.enable_autolog_hparams": False,  # RunConfig logs the settings under their own names
            }
        )

    def parse_arguments(self, parser, args) -> None:
        """Parse ``args`` with lfed's short model names, refusing Lightning's optimizer arguments."""
        if not isinstance(args, (dict,)) and not hasattr(args, "as_dict"):
            args = list(sys.argv[1:] if args is None else args)
            refused = _refused_in_args(args) or unimportable_class_path(args)
            if refused:
                parser.error(refused)
            try:
                _, old = upgrade_args(args)  # lfed 0.3's flat keys: refused in one line naming each new spelling
            except ValueError as err:
                parser.error(str(err))
            if old:
                parser.error(retired(old))
            args = resolve_short_names(args)
            self.given_args = args
            self.config = parser.parse_args(args)  # Lightning's parse_arguments, without its warning about sys.argv
        else:
            super().parse_arguments(parser, args)
        cfg = self.config.get(self.config.get("subcommand")) if self.config.get("subcommand") else self.config
        if cfg is not None:
            for key, message in REFUSED.items():
                if cfg.get(key) is not None:
                    parser.error(f"{key}: {message}")

    def _parse_ckpt_path(self) -> None:
        """Nothing: lfed reads ``--ckpt_path`` itself in :meth:`before_instantiate_classes`.

        Lightning's CLI calls this private method right after parsing to replace the model
        arguments of the config with the hyperparameters stored in a ``--ckpt_path`` file. lfed
        does not want that: for ``fit`` the config defines the run and the checkpoint only its
        state (a checkpoint of another run is refused with the differences listed,
        :func:`lfed.lightning.checkpoint.verify_fingerprint`); for ``validate``/``test`` the settings
        come from the checkpoint's own record of the run, model network included, and an
        unreadable file is reported as not an lfed checkpoint. There is no public hook that
        runs before Lightning's; tests/lightning/test_first_hour_cli.py fails if Lightning stops calling
        this method.
        """

    # ----------------------------------------------------------------- run directory, checkpoint
    def _subconfig(self):
        return self.config[self.subcommand] if self.subcommand else self.config

    def _settings(self, cfg) -> dict[str, Any]:
        return settings_of(cfg)

    def before_instantiate_classes(self) -> None:
        """Read ``--ckpt_path`` (settings for validate/test, ``last``), choose the run directory."""
        silence_library_noise()
        cfg = self._subconfig()
        ckpt = cfg.get("ckpt_path")
        root = Path(cfg.get("trainer", {}).get("default_root_dir") or os.getcwd())
        settings = self._settings(cfg)
        evaluating = self.subcommand in ("validate", "test")
        if evaluating and ckpt is None:
            raise ValueError(f"ckpt_path: lfed {self.subcommand} scores a trained model; give --ckpt_path <file.ckpt> "
                             "(or last: the latest checkpoint of this configuration)")
        _check_trainer_flags(cfg.get("trainer", {}))
        if self.subcommand == "fit":
            _check_an_end(cfg.get("trainer", {}))
        given = settings
        if ckpt is not None and ckpt != "last" and evaluating:
            settings = self._settings_from_checkpoint(str(ckpt))
            self._check_config_fits_checkpoint(str(ckpt), given, settings)
        config_dir = root / "runs" / run_name(settings_label(settings["model"] or {}), settings["data"].get("dataset"), config_id(settings))
        run_dir = None
        if ckpt == "last":
            found = latest_checkpoint(config_dir)
            if found is None and self.subcommand == "fit":
                self._refuse_a_sibling_checkpoint(config_dir, settings)
            if found is None:
                rank_zero_warn(f"ckpt_path: 'last' found no checkpoint of this configuration under {config_dir}; starting a new run")
                cfg["ckpt_path"] = None
            else:
                rank_zero_info(f"lfed: resuming {found}")
                cfg["ckpt_path"] = str(found)
                if self.subcommand == "fit":
                    run_dir = found.parent.parent
            if evaluating and found is None:
                raise ValueError(f"ckpt_path: 'last' found no checkpoint of this configuration under {config_dir}; "
                                 f"lfed {self.subcommand} scores a trained model: give its --ckpt_path <file.ckpt>")
            if evaluating and found is not None:
                settings = self._settings_from_checkpoint(str(found))
        elif ckpt is not None and self.subcommand == "fit":
            read_checkpoint(ckpt)  # a file that is not an lfed checkpoint fails here, before any round
            path = Path(ckpt).resolve()
            if path.parent.name == "checkpoints" and path.parent.parent.parent == config_dir.resolve():
                run_dir = path.parent.parent  # continue in the run's own directory
        cfg = self._subconfig()  # reading a checkpoint's settings replaced self.config
        self._created_run_dir = None
        if evaluating:
            import warnings

            self._seed_as_the_run(cfg)
            # an evaluation restores the weights only: the training callbacks' state Lightning asks for is not needed
            warnings.filterwarnings("ignore", message=r"Be aware that when using `ckpt_path`, callbacks used to create")
            checkpoint = Path(str(cfg.get("ckpt_path")))
            if checkpoint.parent.name == "checkpoints" and checkpoint.parent.parent.is_dir():
                # a checkpoint of an lfed run: its evaluation is written into that run (<run>/validate/), not a new one
                run_dir = checkpoint.parent.parent / self.subcommand
                if not run_dir.is_dir():
                    run_dir.mkdir()
                    self._created_run_dir = run_dir
        inherited = os.environ.get(RUN_DIR_ENV)
        if run_dir is None and inherited and os.environ.get("LOCAL_RANK", "0") != "0":
            run_dir = Path(inherited)  # a DDP worker: rank 0 chose the directory
        if run_dir is None:
            try:
                run_dir = self._created_run_dir = run_directory(config_dir)
            except OSError as err:  # a read-only working folder, a file where a folder goes
                raise ValueError(f"trainer.default_root_dir: cannot create the run's folder under {root} "
                                 f"({err.strerror or err}); run lfed from a folder you can write to, or give "
                                 "--trainer.default_root_dir <a writable folder>") from None
        os.environ[RUN_DIR_ENV] = str(run_dir)
        self.run_dir = run_dir
        self.run_settings = settings
        cfg["trainer"]["default_root_dir"] = str(run_dir)
        logger = cfg["trainer"].get("logger")
        for lg in logger if isinstance(logger, list) else [logger]:
            init = lg.get("init_args") if hasattr(lg, "get") else None
            if init is None:
                continue
            if "Wandb" in str(lg.get("class_path")) and init.get("save_dir") is None:
                init["save_dir"] = str(run_dir)
            if "Wandb" in str(lg.get("class_path")) and self.subcommand == "fit" and cfg.get("ckpt_path") and init.get("id") is None:
                wandb_id = self._wandb_id(str(cfg["ckpt_path"]))
                if wandb_id is not None:  # a resume continues its W&B run, not a new one per resume (issue 51 item 12)
                    init["id"], init["resume"] = wandb_id, "allow"
            if str(lg.get("class_path")).endswith("MetricsCSV") and init.get("dirpath") is None:
                init["dirpath"] = str(run_dir)

    def _set_seed(self) -> None:
        """Lightning's, except for ``validate``/``test`` without a seed of their own: they take the run's own seed from
        its checkpoint once it is read (:meth:`_seed_as_the_run`), instead of Lightning's "No seed found" and a seed
        of its choosing."""
        self._seed_deferred = self.subcommand in ("validate", "test") and self._get(self.config, "seed_everything") is True
        if not self._seed_deferred:
            super()._set_seed()

    def _seed_as_the_run(self, cfg) -> None:
        """Seed an evaluation as its run was seeded (the checkpoint's ``seed_everything``; 0 when it has none), when the
        command gave no seed of its own (then :meth:`_set_seed` already seeded with it)."""
        from lightning.fabric.utilities.seed import seed_everything

        if not getattr(self, "_seed_deferred", False):
            return
        seed = cfg.get("seed_everything")
        cfg["seed_everything"] = seed_everything(0 if isinstance(seed, bool) or seed is None else int(seed), workers=True)

    @staticmethod
    def _wandb_id(ckpt: str) -> str | None:
        """The W&B run id a checkpoint records (None: none, or not readable here; the fingerprint check says why)."""
        try:
            value = read_checkpoint(ckpt).get(WANDB_ID_KEY)
        except Exception:  # noqa: BLE001 - the checkpoint's own check reports a bad file, with its reason
            return None
        return value if isinstance(value, str) else None

    def before_fit(self) -> None:
        """Build the data before the Trainer starts anything (a W&B run, its files): a dataset that is not there, more
        clients than examples, a partition that cannot be made are one line with nothing left behind (issue 51 item 9).
        The Trainer's ``setup`` reuses what was built (:meth:`lfed.data.federated.FederatedDataset.build` is
        idempotent)."""
        build = getattr(self.datamodule, "build", None)
        if callable(build):
            build()

    before_validate = before_test = before_fit

    def _refuse_a_sibling_checkpoint(self, config_dir: Path, settings: dict[str, Any]) -> None:
        """``--ckpt_path last`` with a changed setting (``--model.training.client_lr 0.1``, "resume with a lower lr")
        finds no checkpoint of the new configuration; when a run of the same method on the same data has one, starting
        a fresh run would silently not be what was asked: refused, naming the checkpoint, the settings that differ and
        both ways on (issue 51 item 2). With no such run, ``last`` starts a new one (the idiom "resume if there is
        anything to resume")."""
        prefix = config_dir.name.rsplit("-", 1)[0] + "-"
        others = [p for p in config_dir.parent.glob(f"{glob_escape(prefix)}*/version_*/checkpoints/last.ckpt")
                  if p.parent.parent.parent != config_dir and p.parent.parent.parent.name.rsplit("-", 1)[0] + "-" == prefix]
        if not others:
            return
        latest = max(others, key=lambda p: p.stat().st_mtime)
        try:
            theirs = read_checkpoint(str(latest)).get(CONFIG_KEY) or {}
        except Exception:  # noqa: BLE001 - an unreadable neighbour: its differences are unknown, the refusal stands
            theirs = {}
        mine, saved = flat_settings(settings), flat_settings(theirs)
        differ = [k for k in sorted(set(mine) | set(saved)) if k != "data.data_dir" and mine.get(k) != saved.get(k)]
        shown = "; ".join(f"{k}: {saved.get(k)!r} there, {mine.get(k)!r} here" for k in differ[:3])
        more = f"; ... {len(differ)} settings in all" if len(differ) > 3 else ""
        raise ValueError(f"ckpt_path: 'last' found no checkpoint of this configuration, but {latest} is a run of the same "
                         f"method and data with other settings ({shown or 'settings unreadable'}{more}); to continue it "
                         f"with these settings give --ckpt_path {latest}, to start a new run drop --ckpt_path")

    def _check_config_fits_checkpoint(self, ckpt: str, given: dict[str, Any], saved: dict[str, Any]) -> None:
        """``lfed validate|test --config A --ckpt_path <run of B>``: refused, naming the settings that differ.

        Only settings the command gave (``--config``, ``--model.*``, ``--data.*``, ``--seed_everything``) are
        compared; without them the checkpoint's own settings are used. ``data.data_dir`` may differ (where the
        data is on this machine).
        """
        flags = [a for a in getattr(self, "given_args", []) or [] if isinstance(a, str) and a.startswith("--")]
        if not any(a.split("=", 1)[0] == "--config" or (a.startswith(("--model", "--data", "--seed_everything"))
                                                         and not a.startswith("--data.data_dir")) for a in flags):
            return
        mine, theirs = flat_settings(given), flat_settings(saved)
        differ = [k for k in sorted(set(mine) | set(theirs))
                  if k != "data.data_dir" and mine.get(k) != theirs.get(k)]
        if differ:
            shown = "; ".join(f"{k}: checkpoint {theirs.get(k)!r}, config {mine.get(k)!r}" for k in differ[:4])
            more = f"; ... {len(differ)} settings in all" if len(differ) > 4 else ""
            raise ValueError(f"ckpt_path: {ckpt} was written by another configuration than this command's ({shown}{more}); "
                             "drop --config (the checkpoint holds its own settings) or give the run's own")

    def instantiate_classes(self) -> None:
        """Lightning's, but a run that fails to start leaves no empty run directory behind."""
        try:
            super().instantiate_classes()
        except BaseException:
            created = getattr(self, "_created_run_dir", None)
            if created is not None and created.is_dir() and not any(created.iterdir()):
                self._discard_run_dir()
            raise

    def _discard_run_dir(self) -> None:
        """Remove the run directory this command made (its ``config.yaml``, an offline W&B run), and its
        configuration's directory when that is left empty: a run refused before its first step leaves nothing."""
        import shutil

        created = getattr(self, "_created_run_dir", None)
        if created is None or not created.is_dir() or os.environ.get("LOCAL_RANK", "0") != "0":
            return
        for logger in (getattr(getattr(self, "trainer", None), "loggers", None) or []):
            finish = getattr(getattr(logger, "_experiment", None), "finish", None)
            if callable(finish):  # a W&B run that was started: closed (its footer unprinted) before its files go
                import contextlib
                import io

                try:
                    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                        finish(exit_code=1)
                except Exception:  # noqa: BLE001 - the refusal is what the user must see
                    pass
        shutil.rmtree(created, ignore_errors=True)
        for parent in (created.parent, created.parent.parent):  # runs/<configuration>, then runs/ when left empty
            if parent.name and parent.is_dir() and not any(parent.iterdir()) and parent != Path(os.getcwd()):
                parent.rmdir()
        self._created_run_dir = None

    def _settings_from_checkpoint(self, ckpt: str) -> dict[str, Any]:
        """Apply the checkpoint's model and data settings to the config (validate/test); return them."""
        saved = read_checkpoint(ckpt).get(CONFIG_KEY)
        cfg = self._subconfig()
        if not saved:
            rank_zero_warn(
                f"ckpt_path: {ckpt} holds no record of its run's settings (not saved by `lfed fit`): "
                "the model and data settings of this command's config are used"
            )
            return self._settings(cfg)
        saved = {k: v for k, v in saved.items() if v is not None}
        data_dir = cfg.get("data", {}).get("data_dir") if cfg.get("data") is not None else None
        update = {k: saved[k] for k in ("model", "data") if k in saved}
        if data_dir is not None and "data" in update:
            update["data"] = {**update["data"], "data_dir": data_dir}  # where the data is on this machine
        new = self.parser.parse_object({self.subcommand: update}, self.config)
        self.config = new
        cfg = self._subconfig()
        if "seed_everything" in saved:
            cfg["seed_everything"] = saved["seed_everything"]
        return self._settings(cfg)

    def instantiate_trainer(self, **kwargs) -> Trainer:
        """The Trainer, with lfed's checkpoint, progress bar, round table, metrics CSV and atomic IO."""
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        every = config.get("checkpoint_every", 10)
        if every is not None and every < 0:
            raise ValueError(f"checkpoint_every: must be >= 0 rounds (0 turns it off), got {every}")
        trainer_config = config.get("trainer", {})
        callbacks = trainer_config.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
        run_dir = getattr(self, "run_dir", None) or Path(trainer_config.get("default_root_dir") or os.getcwd())
        if (
            every
            and self.subcommand in ("fit", None)
            and trainer_config.get("enable_checkpointing") is not False
            and not any(isinstance(c, ModelCheckpoint) for c in callbacks)
        ):
            callbacks.append(RoundCheckpoint(dirpath=os.path.join(str(run_dir), "checkpoints"), every_n_train_steps=every))
        if trainer_config.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in callbacks):
            callbacks.append(RoundProgressBar())
        if not any(isinstance(c, RoundTable) for c in callbacks):
            callbacks.append(RoundTable())
        callbacks.append(RunConfig(getattr(self, "run_settings", None) or self._settings(self._subconfig())))
        callbacks.append(self.first_step)
        kwargs.setdefault("callbacks", callbacks)
        logger = trainer_config.get("logger")
        loggers = [] if logger in (None, False) else list(logger) if isinstance(logger, list) else [logger]
        wants_log = logger is not False
        if wants_log and not any(isinstance(lg, MetricsCSV) for lg in loggers) and all(isinstance(lg, Logger) for lg in loggers):
            kwargs.setdefault("logger", [*loggers, MetricsCSV(run_dir)])
        trainer = super().instantiate_trainer(**kwargs)
        install_atomic_io(trainer.strategy)
        return trainer


def _check_an_end(trainer: Any) -> None:
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


def _yaml_message(args: list[str], err: Exception) -> str:
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
    mark = getattr(err, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or one_line(str(err))
    hint = " (YAML indents with spaces, never tabs)" if "\\t" in problem or "\t" in problem else ""
    return f"{where}: not valid YAML{at}: {problem}{hint}"


#: Lightning Trainer flags that cannot apply to a federated round, and why (lfed trains the clients itself: one
#: training step is one round of many clients' local steps, which Lightning's automatic optimization never sees).
NOT_FOR_ROUNDS = {
    "gradient_clip_val": "Lightning clips the gradient of one backward pass, and a round is many clients' local "
    "steps inside lfed's engine; drop it (to bound what a client sends: DP-FedAvg's clip, docs/privacy.md)",
    "accumulate_grad_batches": "one training step is one federated round, and rounds do not accumulate; drop it "
    "(a client's mini-batch is model.training.batch_size)",
}


def _check_trainer_flags(trainer: Any) -> None:
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


def run_cli(args: list[str] | None = None) -> LfedCLI:
    """Run ``lfed`` with ``args`` (``sys.argv`` when None) and return the CLI object (tests, notebooks)."""
    silence_library_noise()
    return LfedCLI(FederatedModule, FederatedDataModule, save_config_kwargs={"overwrite": True}, args=args)


def _prog(args: list[str]) -> str:
    """``lfed fit`` (the subcommand of ``args``), or ``lfed`` without one."""
    sub = next((a for a in args if a in SUBCOMMANDS), None)
    return f"lfed {sub}" if sub else "lfed"


def main() -> None:
    """``lfed fit|validate|test`` (the ``lfed`` command, :func:`lfed.entry.main`, sends ``lfed grid`` to :mod:`lfed.lightning.grid`).

    A mistake in the configuration (:class:`ConfigError`) is printed as one line,
    ``lfed fit: error: <message>``, on stderr, and the exit status is 2; with ``LFED_DEBUG=1``
    every error shows its traceback (the parser's too: ``JSONARGPARSE_DEBUG``).
    """
    if "--help-all" in sys.argv[2:]:  # every Lightning Trainer setting, not only the ones a federated run uses most
        LfedHelpFormatter.full = True
        sys.argv = [a if a != "--help-all" else "--help" for a in sys.argv]
    if os.environ.get(DEBUG_ENV, "").strip() not in ("", "0"):
        os.environ.setdefault("JSONARGPARSE_DEBUG", "true")  # the parser raises instead of printing its usage
        run_cli()
        return
    silence_library_noise()
    try:
        LfedCLI(FederatedModule, FederatedDataModule, save_config_kwargs={"overwrite": True}, config_errors=True)
    except ConfigError as err:
        print(f"{_prog(sys.argv[1:])}: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except FloatingPointError as err:  # a run that diverged: its message names the round, the clients and the fix
        print(f"{_prog(sys.argv[1:])}: stopped: {err} ({DEBUG_ENV}=1 shows the traceback)", file=sys.stderr, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C before round 0 (after it, Lightning stops the run itself, exit 1)
        print(f"{_prog(sys.argv[1:])}: interrupted before the first round; no run was kept", file=sys.stderr, flush=True)
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
