"""W&B grid sweep files (``sweeps/*.yaml``) read as a list of runs, for ``lfed grid``.

A sweep of ``method: grid`` lists parameters with ``values`` (or one ``value``); its runs are
the Cartesian product, in the order of the file (the first parameter varies slowest). Each
run is the command line the W&B agent would run: the sweep's ``command`` base configs (or the
user's ``--config``), then ``--<parameter>=<value>`` per parameter; a parameter named
``config`` adds a second ``--config=<file>`` (sweeps/README.md).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lfed.base.metric_gate import check_metric_name
from lfed.lightning.cli_errors import yaml_problem

__all__ = ["Sweep", "load_sweep", "member_name"]

#: Keys of a W&B sweep file that ``lfed grid`` reads or may ignore (anything else is refused).
KNOWN_KEYS = {"name", "program", "method", "metric", "parameters", "command", "description", "project", "entity",
              "early_terminate", "run_cap"}


@dataclass
class Sweep:
    """A grid sweep: its name, parameters and base config arguments.

    Attributes:
        name: The sweep's ``name`` (the file's stem when it has none).
        parameters: ``{key: [values]}`` in the file's order.
        base_args: The arguments between ``lfed fit`` and ``${args}`` in the sweep's ``command``.
    """

    name: str
    parameters: dict[str, list[Any]]
    base_args: list[str] = field(default_factory=list)

    def points(self) -> list[dict[str, Any]]:
        """Every run of the grid: ``{key: value}``, the first parameter varying slowest."""
        keys = list(self.parameters)
        return [dict(zip(keys, combo)) for combo in itertools.product(*(self.parameters[k] for k in keys))]

    @staticmethod
    def args_of(point: dict[str, Any]) -> list[str]:
        """``--key=value`` per parameter, as the W&B agent writes ``${args}`` (``config`` too)."""
        return [f"--{k}={v}" for k, v in point.items()]


def load_sweep(path: str | Path) -> Sweep:
    """Read a W&B sweep file of ``method: grid`` (clear errors for anything else).

    Raises:
        ValueError: If the file is not YAML (the line and column named), not a mapping, its method is not ``grid``, a parameter has
            no ``values``/``value`` (a distribution), has no values, or the file has keys a W&B
            sweep does not have.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"sweep: no file {path}")
    with open(path) as f:
        try:
            raw = yaml.safe_load(f)
        except yaml.YAMLError as err:  # one line, as for a --config file (not PyYAML's 50-line traceback)
            raise ValueError(f"sweep: {path}: not valid YAML{yaml_problem(err)}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"sweep: {path} is not a W&B sweep (a YAML mapping with method and parameters)")
    unknown = sorted(set(raw) - KNOWN_KEYS)
    if unknown:
        raise ValueError(f"sweep: {path} has keys {unknown} that a W&B sweep does not have; allowed: {sorted(KNOWN_KEYS)}")
    method = raw.get("method")
    if method != "grid":
        raise ValueError(f"sweep: method {method!r} in {path}; lfed grid runs grids only (method: grid): "
                         "random and bayes sweeps choose their next runs from results, so run them with `wandb agent`")
    if isinstance(raw.get("metric"), dict):  # what W&B ranks the runs by: a name the runs log
        check_metric_name(raw["metric"].get("name"), f"sweep: {path}: metric.name")
    params = raw.get("parameters")
    if not isinstance(params, dict) or not params:
        raise ValueError(f"sweep: {path} has no parameters (a mapping of name: {{values: [...]}})")
    parameters: dict[str, list[Any]] = {}
    for key, spec in params.items():
        if not isinstance(spec, dict) or not ({"values", "value"} & set(spec)):
            raise ValueError(f"sweep: parameter {key!r} in {path} has {spec!r}; a grid parameter needs `values: [...]` "
                             "or `value: x` (distributions such as min/max are for random and bayes sweeps)")
        values = list(spec["values"]) if "values" in spec else [spec["value"]]
        if not values:
            raise ValueError(f"sweep: parameter {key!r} in {path} has an empty list of values")
        if isinstance(spec.get("values"), dict) or any(isinstance(v, (dict, list)) for v in values):
            raise ValueError(f"sweep: parameter {key!r} in {path}: values must be plain (numbers, strings, booleans)")
        parameters[str(key)] = values
    base: list[str] = []
    command = raw.get("command")
    if command:
        words = [str(c) for c in command]
        if "fit" in words and "${args}" in words:
            base = words[words.index("fit") + 1 : words.index("${args}")]
    return Sweep(str(raw.get("name") or path.stem), parameters, base)


def member_name(index: int, point: dict[str, Any]) -> str:
    """A short directory-safe name of a grid point: ``03-client_lr=0.01-config=alg_igfl_c``."""
    parts = [f"{index:02d}"]
    for key, value in point.items():
        short = key.rsplit(".", 1)[-1]
        v = Path(str(value)).stem if key == "config" else str(value)
        parts.append(f"{short}={v}")
    name = "-".join(parts)
    return "".join(c if c.isalnum() or c in "-_=." else "_" for c in name)
