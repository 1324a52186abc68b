"""What ``lfed fit|validate|test`` does to its command line before the parser reads it (:mod:`lfed.lightning.cli`).

* Short class names of lfed's models (``--model.net MLP``) mean :mod:`lfed.models.zoo`' classes
  (:func:`resolve_short_names`).
* Lightning's ``--optimizer`` and ``--lr_scheduler`` are refused with a message naming
  ``--model.server_optimizer`` (:data:`REFUSED`).
* A ``class_path`` whose module does not import is one line naming the setting (:func:`unimportable_class_path`).
"""

from __future__ import annotations

from typing import Any

from lfed import removed_path
from lfed.core.settings import UPGRADE_SCRIPT
from lfed.models import zoo as lfed_models

#: The commands of ``lfed`` that this CLI runs (``lfed grid`` and ``lfed audit`` are :mod:`lfed.entry`'s).
SUBCOMMANDS = ("fit", "validate", "test")


def lfed_model_names() -> dict[str, str]:
    """Short name -> class path of every ``nn.Module`` of the zoo (:mod:`lfed.models.zoo` and the families it imports:
    :mod:`lfed.models.convnets`, :mod:`lfed.models.language`)."""
    from torch import nn

    out = {}
    for name in dir(lfed_models):
        obj = getattr(lfed_models, name)
        if isinstance(obj, type) and issubclass(obj, nn.Module) and obj.__module__.startswith("lfed.models."):
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


def refused_in_args(args: list[str]) -> str | None:
    """The message of the first of Lightning's optimizer arguments (:data:`REFUSED`) in ``args``; None when none is."""
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
        if (new := removed_path(path)) is not None:  # lfed 0.4's module path (lfed.REMOVED): its new spelling
            return f"{where}: class_path {path}: lfed 0.4's module path, removed in 0.6; it is {new} now ({UPGRADE_SCRIPT})"
        try:
            imported = importlib.import_module(module)
        except ImportError as err:
            return (f"{where}: class_path {path}: cannot import {module} ({err}); if it is your own file, put its folder "
                    "on PYTHONPATH (PYTHONPATH=. lfed fit ...)")
        if not hasattr(imported, name):
            return f"{where}: class_path {path}: {module} has no {name}"
    return None
