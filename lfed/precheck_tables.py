"""What :mod:`lfed.precheck` knows of the settings, read from the sources with :mod:`ast` (issue 66): the signatures of
Lightning's ``Trainer``, :class:`~lfed.lightning.module.FederatedModule` and :class:`~lfed.data.federated.FederatedDataset`,
the fields of the settings' groups, and the registry's names, in a few milliseconds and without importing torch or
Lightning. ``tests/test_precheck.py`` holds these tables to the real parser's.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path
from typing import Any

__all__ = ["COMMANDS", "TOP_LEVEL", "Tables", "tables"]

#: The commands checked here (``lfed grid`` reads a sweep, ``lfed audit`` and ``lfed plot`` their own arguments).
COMMANDS = ("fit", "validate", "test")
#: The settings of every command that are not in a section: LightningCLI's and lfed's (``--checkpoint_every``); each
#: command has the arguments of its ``Trainer`` method besides (``ckpt_path``, ``weights_only``; ``verbose``).
TOP_LEVEL = ("checkpoint_every", "config", "data", "lr_scheduler", "model", "optimizer", "print_config",
             "seed_everything", "trainer")

_LFED = Path(__file__).resolve().parent


class Tables:
    """What :func:`precheck` knows, read from the sources (:func:`tables`).

    Attributes:
        top_level: ``{command: (setting, ...)}``: the settings outside the sections (:data:`TOP_LEVEL` and the
            command's ``Trainer`` method's arguments).
        sections: ``{"model"|"data"|"trainer": {setting: annotation source}}``, the signatures' parameters.
        groups: ``{"model.training": (field, ...)}``: the settings that are groups of settings (dataclasses).
        literals: ``{key: (names, optional)}``: settings whose value is one of some names (``optional``: or null).
        deprecated: lfed 0.3's model keys (the full command refuses them, naming each new key).
        datasets, partitions: ``data.dataset``'s and ``data.partition``'s names.
    """

    def __init__(self) -> None:
        self.top_level: dict[str, tuple[str, ...]] = {}
        self.sections: dict[str, dict[str, str]] = {}
        self.groups: dict[str, tuple[str, ...]] = {}
        self.literals: dict[str, tuple[tuple[str, ...], bool]] = {}
        self.deprecated: frozenset[str] = frozenset()
        self.datasets: tuple[str, ...] = ()
        self.partitions: tuple[str, ...] = ()

    def known(self) -> list[str]:
        """Every dotted setting (``model.training.client_lr``, ``trainer.max_steps``): the closest one is suggested."""
        out = [f"{s}.{k}" for s, keys in self.sections.items() for k in keys]
        out += [f"{g}.{f}" for g, names in self.groups.items() for f in names]
        return sorted(out)


# ----------------------------------------------------------------------------------------------- reading the sources
@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _class(path: Path, name: str) -> ast.ClassDef:
    for node in _tree(path).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise LookupError(f"{name} not in {path}")


def _find_class(name: str, first: str) -> tuple[Path, ast.ClassDef]:
    """lfed's class ``name``, looked for in ``first`` (relative to the package), then in every module of the package."""
    candidates = [_LFED / first, *sorted(_LFED.rglob("*.py"))]
    for path in candidates:
        if path.is_file() and f"class {name}" in path.read_text():
            try:
                return path, _class(path, name)
            except LookupError:
                continue
    raise LookupError(f"class {name} not found in lfed")


def _parameters(cls: ast.ClassDef) -> dict[str, str]:
    """``__init__``'s named parameters (not ``self``, ``*args``, ``**kwargs``) and their annotations' source."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            return {a.arg: ast.unparse(a.annotation) if a.annotation else "" for a in args if a.arg != "self"}
    raise LookupError(f"{cls.name} has no __init__")


def _fields(cls: ast.ClassDef) -> tuple[str, ...]:
    """A dataclass's fields (its annotated class attributes)."""
    if not any("dataclass" in ast.unparse(d) for d in cls.decorator_list):
        raise LookupError(f"{cls.name} is not a dataclass")
    return tuple(n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))


def _constant(path: Path, name: str) -> Any:
    """The literal value of a module-level ``name = ...`` (a dict's keys when its values are not literals)."""
    for node in _tree(path).body:
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            if isinstance(node.value, ast.Dict):
                return tuple(ast.literal_eval(k) for k in node.value.keys if k is not None)
            return ast.literal_eval(node.value)
    raise LookupError(f"{name} not in {path}")


def _literal_names(annotation: str) -> tuple[str, ...] | None:
    """``Literal["auto", "vmap"]`` (alone or with ``| None``) -> its names; None for another annotation."""
    m = re.fullmatch(r"Literal\[(.*)\](?: \| None)?", annotation)
    return tuple(ast.literal_eval(f"({m.group(1)},)")) if m else None


def _trainer() -> ast.ClassDef:
    """Lightning's ``Trainer``, read from its file without importing Lightning."""
    spec = importlib.util.find_spec("lightning")  # a top-level package: found, not imported
    if spec is None or spec.origin is None:
        raise LookupError("lightning is not installed")
    return _class(Path(spec.origin).parent / "pytorch" / "trainer" / "trainer.py", "Trainer")


def _method_parameters(cls: ast.ClassDef, name: str) -> tuple[str, ...]:
    """A ``Trainer`` method's arguments that LightningCLI makes a command's settings (not the model, the data module
    or the data loaders)."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            args = [*node.args.args, *node.args.kwonlyargs]
            return tuple(a.arg for a in args if a.arg not in ("self", "model", "datamodule") and "dataloaders" not in a.arg)
    raise LookupError(f"Trainer has no {name}")


@functools.cache
def tables() -> Tables:
    """What the pre-check knows, read from the sources (raises ``LookupError`` or ``SyntaxError`` when one moved)."""
    t = Tables()
    _, module = _find_class("FederatedModule", "lightning/module.py")
    _, data = _find_class("FederatedDataset", "data/federated.py")
    trainer = _trainer()
    t.sections = {"model": _parameters(module), "data": _parameters(data), "trainer": _parameters(trainer)}
    t.top_level = {command: (*TOP_LEVEL, *_method_parameters(trainer, command)) for command in COMMANDS}
    where = {"LocalTraining": "core/algorithm.py", "Stragglers": "participation/stragglers.py",
             "Engine": "core/groups.py", "Evaluation": "core/groups.py"}
    for key, annotation in t.sections["model"].items():
        if annotation in where:  # a group of settings: a dataclass whose fields are settings
            path, cls = _find_class(annotation, where[annotation])
            t.groups[f"model.{key}"] = _fields(cls)
            for node in cls.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names = _literal_names(ast.unparse(node.annotation))
                    if names is not None:
                        t.literals[f"model.{key}.{node.target.id}"] = (names, False)
    presets = _constant(_LFED / "core" / "registry.py", "PRESETS")
    if t.sections["model"].get("algorithm") == "algorithms.AlgorithmName":
        t.literals["model.algorithm"] = (presets, False)
    if t.sections["model"].get("partial_work") == "PartialWork | None":
        t.literals["model.partial_work"] = (_constant(_LFED / "server" / "weight_formulas.py", "PARTIAL_WORK"), True)
    settings = _LFED / "core" / "settings.py"
    t.deprecated = frozenset().union(*(_constant(settings, n) for n in ("GROUPED", "RENAMED", "METHOD")))
    t.datasets = _constant(_LFED / "data" / "datasets.py", "DATASETS")
    t.partitions = _constant(_LFED / "data" / "partition.py", "PARTITIONS")
    return t
