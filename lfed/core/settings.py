"""A run's settings in groups, one spelling each, and :func:`build_run`: the run without Lightning (issue 41).

The ``model:`` section of a config (the arguments of :class:`lfed.lightning.module.FederatedModule` and of
:func:`build_run`) says what to train with words the code and the checkpoint also use:

* the composition: ``algorithm`` (a preset) and the roles it fills, each a name or a component with its
  own settings (``objective: {class_path: lfed.client.Prox, init_args: {mu: 0.1}}``): ``objective``,
  ``weighting``, ``partial_work``, ``combination``, ``channel``, ``sampler``, ``fraction``, ``server_optimizer``;
* the groups: ``training`` (:class:`~lfed.core.algorithm.LocalTraining`: how clients train), ``stragglers``
  (:class:`~lfed.participation.stragglers.Stragglers`), ``engine`` (:class:`Engine`: how the cohort is computed and
  where client state lives) and ``evaluation`` (:class:`Evaluation`);
* ``net``, ``loss``, ``seed``, ``asynchronous`` and ``attack``.

:class:`RunSettings` is that list, said once: ``FederatedModule``'s signature is held to its fields by a test, and
``RunSettings(...).build()`` (or :func:`build_run`) makes the :class:`~lfed.core.run.FederatedRun`, which takes the
groups ``engine`` and ``evaluation`` as they are.

The flat keys of lfed 0.3 (``client_lr``, ``mu``, ``aggregation``, ...) worked until 0.5, as promised: now each is
refused before anything runs, in one line naming its grouped spelling (:func:`retired`); ``scripts/upgrade_configs.py``
rewrites a config, and :func:`upgrade` (what the script runs) still computes the new form.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from lfed.core import registry as algorithms
from lfed.core.algorithm import LocalTraining
from lfed.core.groups import Engine, Evaluation, as_group
from lfed.core.registry import ROLES
from lfed.participation.stragglers import Stragglers

if TYPE_CHECKING:  # the fields' types, as FederatedModule's signature spells them
    import torch
    from torch import nn

    from lfed.base.attack import Attack
    from lfed.client.objectives import ClientRule
    from lfed.core.asynchronous import Asynchronous
    from lfed.participation.sampling import ClientSampler, FractionSchedule
    from lfed.server.channel import Channel
    from lfed.server.combination import ServerCombination
    from lfed.server.weighting import AggregationWeights, PartialWork

__all__ = ["Engine", "Evaluation", "RunSettings", "SettingDeprecation", "build_run", "upgrade", "upgrade_args"]


class SettingDeprecation(FutureWarning):
    """A setting spelled as in lfed 0.3 (0.4 warned with it; 0.5 refuses the spelling: :func:`retired`)."""


#: Where to turn for a whole config.
UPGRADE_SCRIPT = "python scripts/upgrade_configs.py FILE.yaml rewrites a config"


def retired(messages: Iterable[str]) -> str:
    """One line refusing lfed 0.3's keys: each with its 0.5 spelling (:func:`upgrade`'s messages), and the script."""
    said = "; ".join(m.replace(" is deprecated: it is ", ": lfed 0.3's spelling, removed in 0.5; it is ")
                     .replace(" is deprecated and did nothing here", ": lfed 0.3's spelling, removed in 0.5; it did nothing here")
                     .replace("): dropped; it is now", "); it is now") for m in messages)
    return f"{said} ({UPGRADE_SCRIPT})"


#: 0.3's flat keys that moved into a group: ``key -> group``.
GROUPED = {
    "client_lr": "training", "batch_size": "training", "local_epochs": "training", "local_steps": "training",
    "p_inactive": "stragglers", "p_incomplete": "stragglers",
    "backend": "engine", "chunk_size": "engine", "client_state": "engine", "client_state_dir": "engine",
    "personal_clients": "evaluation", "personal_chunk": "evaluation", "round_local_accuracy": "evaluation",
    "accuracy_targets": "evaluation",
}
#: 0.3's words for two roles, now the code's and the checkpoint's: ``old -> new``.
RENAMED = {"aggregation": "combination", "compression": "channel"}
#: 0.3's flat method settings, now their component's own: ``key -> (role, names that build the component,
#: its class path, its argument)``.
METHOD = {
    "mu": ("objective", ("prox",), "lfed.client.objectives.Prox", "mu"),
    "efl_lambda": ("objective", ("efl",), "lfed.client.objectives.EFL", "lam"),
    "fisher_samples": ("objective", ("efl",), "lfed.client.objectives.EFL", "fisher_samples"),
    "attention_temperature": ("combination", ("self", "global", "time"), "lfed.server.combination.IGFLAttention",
                              "temperature"),
    "time_weights": ("combination", ("self", "global", "time"), "lfed.server.combination.IGFLAttention", "time_weights"),
    "sampler_alpha": ("sampler", ("attention",), "lfed.participation.sampling.AttentionSampler", "alpha"),
}
#: The component argument a name stands for (an attention query's name is its ``query``).
_NAME_ARGUMENT = {"lfed.server.combination.IGFLAttention": "query"}
DEPRECATED = frozenset(GROUPED) | frozenset(RENAMED) | frozenset(METHOD)


def _class_path(value: Any) -> str | None:
    if isinstance(value, dict) and isinstance(value.get("class_path"), str):
        return value["class_path"]
    if isinstance(value, str) and "." in value:
        return value
    if value is not None and not isinstance(value, (str, int, float, bool, dict, list, tuple)):
        return f"{type(value).__module__}.{type(value).__qualname__}"
    return None


def _same_class(path: str | None, wanted: str) -> bool:
    if path is None:
        return False
    if path == wanted or path.rsplit(".", 1)[-1] == wanted.rsplit(".", 1)[-1] and path.startswith("lfed."):
        return True
    from lfed.base.component import load_class

    try:
        module, name = wanted.rsplit(".", 1)
        return issubclass(load_class(path, object, "class"), getattr(__import__(module, fromlist=[name]), name))
    except (ValueError, ImportError, AttributeError):
        return False


def upgrade(model: dict[str, Any], prefix: str = "model.", context: dict[str, Any] | None = None,
            later: bool = False) -> tuple[dict[str, Any], list[str]]:
    """``model`` settings with 0.3's flat keys rewritten to the grouped form, and one message per key rewritten.

    A grouped key goes into its group (``client_lr`` -> ``training.client_lr``), a renamed role to its new word
    (``aggregation`` -> ``combination``), and a method setting onto its component: ``mu: 0.1`` with the objective
    ``prox`` (named, or the preset's) becomes ``objective: {class_path: lfed.client.objectives.Prox, init_args:
    {mu: 0.1}}``. A method setting whose component is not in the run did nothing in 0.3 and is dropped, and
    says so. A key given both ways is refused: which one wins would be a silent choice. ``context``: settings
    given elsewhere (an earlier config file) that tell ``algorithm`` and the roles when ``model`` does not;
    ``later``: ``model`` comes after ``context`` (a command-line argument after a config file) and so overrides
    its component's setting, as any later setting does.
    """
    context = context or {}
    out = dict(model)
    messages: list[str] = []
    for old, new in RENAMED.items():
        if old in out:
            if out.get(new) is not None and out[old] is not None:
                raise ValueError(f"{prefix}{old}: given with {prefix}{new}, its new name; give {new} only")
            value = out.pop(old)
            if value is not None or new not in out:
                out[new] = value
            messages.append(f"{prefix}{old} is deprecated: it is {prefix}{new} now")
    for key, group in GROUPED.items():
        if key not in out:
            continue
        value = out.pop(key)
        current = out.get(group)
        if current is None:
            current = {}
        elif not isinstance(current, dict):  # a group object (Python): its fields as a dict
            current = {f.name: getattr(current, f.name) for f in fields(current)}
        else:
            current = dict(current)
        if key in current and current[key] != value:
            raise ValueError(f"{prefix}{key}: given with {prefix}{group}.{key}, its new place; give {group}.{key} only")
        current[key] = value
        out[group] = current
        messages.append(f"{prefix}{key} is deprecated: it is {prefix}{group}.{key} now")
    for key, (role, names, path, argument) in METHOD.items():
        if key not in out:
            continue
        value = out.pop(key)
        choice = out.get(role, context.get(role))
        if choice is None:
            preset = algorithms.PRESETS.get(out.get("algorithm") or context.get("algorithm") or "fedavg", {})
            choice = preset.get(role, algorithms.BASE.get(role))
        short = path.rsplit(".", 1)[-1]
        new = f"{prefix}{role}: {{class_path: {path}, init_args: {{{argument}: {value!r}}}}}"
        if isinstance(choice, str) and choice in names:
            args = {_NAME_ARGUMENT[path]: choice} if path in _NAME_ARGUMENT else {}
            out[role] = {"class_path": path, "init_args": {**args, argument: value}}
        elif isinstance(choice, dict) and _same_class(_class_path(choice), path):
            init = dict(choice.get("init_args") or {})
            if argument in init and init[argument] != value and not (later and role not in model):
                raise ValueError(f"{prefix}{key}: given with {prefix}{role}.init_args.{argument}; give the latter only")
            out[role] = {**choice, "init_args": {**init, argument: value}}
        elif _same_class(_class_path(choice), path) and not isinstance(choice, (str, dict)):  # a built component
            raise ValueError(f"{prefix}{key}: set it on the {role} component you built ({short}({argument}=...))")
        else:
            from lfed.base.component import load_class

            load_class(path, object, key)(**{argument: value})  # a bad value is refused even where unused, as in 0.3
            messages.append(f"{prefix}{key} is deprecated and did nothing here (the {role} is not {short}): dropped; "
                            f"it is now a setting of {short}: {new}")
            continue
        messages.append(f"{prefix}{key} is deprecated: it is {new} now")
    return out, messages


def upgrade_args(args: list[str]) -> tuple[list[str], list[str]]:
    """A command line with 0.3's keys rewritten, and one message per key: in each ``--config`` file's ``model:``
    section (the file is then given as its upgraded text) and in ``--model.<key> value`` arguments
    (``--model.client_lr 0.1`` -> ``--model.training.client_lr 0.1``; ``--model.mu 0.1`` -> the objective as a
    component with its ``mu``, found from the preset and roles given before it)."""
    import json
    from pathlib import Path

    import yaml

    out: list[str] = []
    messages: list[str] = []
    seen: dict[str, Any] = {}  # algorithm and roles given so far (files, then arguments)
    i = 0
    while i < len(args):
        arg = args[i]
        key, eq, value = arg.partition("=")
        if key.startswith("--") and not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value, step = args[i + 1], 2
        else:
            step = 1
        if key == "--config" and value and Path(value).is_file():
            data = yaml.safe_load(Path(value).read_text())
            model = data.get("model") if isinstance(data, dict) else None
            if isinstance(model, dict):
                upgraded, said = upgrade(model, context=seen)
                seen.update({k: upgraded[k] for k in ("algorithm", *ROLES) if k in upgraded})
                if said:
                    messages += [f"{value}: {m}" for m in said]
                    out += ["--config", yaml.safe_dump({**data, "model": upgraded}, sort_keys=False)]
                    i += step
                    continue
            out += args[i:i + step]
            i += step
            continue
        name = key[len("--model."):] if key.startswith("--model.") else None
        head = name.split(".", 1)[0] if name else None
        if head in ("algorithm", *ROLES) and name == head:
            seen[head] = value
        if head in RENAMED:
            new = f"--model.{RENAMED[head]}{name[len(head):]}"
            messages.append(f"--model.{head} is deprecated: it is --model.{RENAMED[head]} now")
            if head == name:
                seen[RENAMED[head]] = value
            out += [new + eq + value] if step == 1 else [new, value]
        elif name in GROUPED:
            new = f"--model.{GROUPED[name]}.{name}"
            messages.append(f"--model.{name} is deprecated: it is {new} now")
            out += [new + eq + value] if step == 1 else [new, value]
        elif name in METHOD:
            try:
                number = yaml.safe_load(value)
            except yaml.YAMLError:
                number = value
            upgraded, said = upgrade({name: number}, context=seen, later=True)
            messages += [m.replace("model.", "--model.", 1) for m in said]
            role = METHOD[name][0]
            if role in upgraded:
                seen[role] = upgraded[role]
                out.append(f"--model.{role}={json.dumps(upgraded[role])}")
        else:
            out += args[i:i + step]
        i += step
    return out, messages


def _instantiate(value: Any, role: str) -> Any:
    """A ``{class_path, init_args}`` choice (from :func:`upgrade`) as its component, for Python callers."""
    if isinstance(value, dict) and "class_path" in value:
        from lfed.base.component import load_class

        return load_class(value["class_path"], object, role)(**(value.get("init_args") or {}))
    return value


@dataclass(frozen=True)
class RunSettings:
    """A run's settings, the one list of them: the ``model:`` section of a config, the keywords of :func:`build_run`
    and the arguments of :class:`~lfed.lightning.module.FederatedModule` (whose docstring, the CLI's help, says what
    each one means; a test holds its signature to these fields: names, types and defaults).

    Built, the settings are in their one form: each group a dataclass (given as None, a dict of some of its fields,
    or itself), a role given as ``{class_path, init_args}`` built. :meth:`of` takes them as keywords and refuses
    0.3's flat keys in one line naming each new spelling (:func:`retired`); :meth:`build` makes the run and
    :meth:`hparams` their plain values (a checkpoint's hyperparameters).
    """

    net: nn.Module | None = None
    algorithm: algorithms.AlgorithmName = "fedavg"
    objective: algorithms.ObjectiveName | ClientRule | None = None
    weighting: algorithms.WeightingName | AggregationWeights | None = None
    partial_work: PartialWork | None = None
    combination: algorithms.CombinationName | ServerCombination | None = None
    channel: float | bool | algorithms.ChannelName | Channel | None = None
    sampler: algorithms.SamplerName | ClientSampler | None = None
    fraction: float | FractionSchedule | None = None
    server_optimizer: Callable[[Iterable], torch.optim.Optimizer] | None = None
    training: LocalTraining = LocalTraining()
    stragglers: Stragglers = field(default_factory=Stragglers)  # not frozen: one each
    engine: Engine = Engine()
    evaluation: Evaluation = Evaluation()
    loss: nn.Module | None = None
    seed: int = 0
    asynchronous: Asynchronous | None = None
    attack: algorithms.AttackName | Attack | None = None

    def __post_init__(self) -> None:
        for name, cls in GROUPS.items():
            object.__setattr__(self, name, as_group(getattr(self, name), cls, name))
        for role in ROLES:
            object.__setattr__(self, role, _instantiate(getattr(self, role), role))

    @classmethod
    def of(cls, **kwargs: Any) -> RunSettings:
        """The settings given as keywords; 0.3's flat keys refused in one line naming each one's new spelling
        (:func:`retired`), any other unknown key by name."""
        names = {f.name: f for f in fields(cls)}
        deprecated = {k: v for k, v in kwargs.items() if k not in names}
        if deprecated:
            unknown = sorted(set(deprecated) - DEPRECATED)
            if unknown:
                raise TypeError(f"unknown settings {unknown}")
            given = {}
            for name in ("algorithm", *ROLES, *GROUPS):
                value = kwargs.get(name, _default(names[name]))
                if name in GROUPS and value == GROUPS[name]():  # a group at its defaults was not given
                    value = None
                if value is not None:
                    given[name] = value
            _, messages = upgrade({**given, **deprecated}, prefix="")
            raise ValueError(retired(messages))
        return cls(**kwargs)

    def build(self):
        """The :class:`~lfed.core.run.FederatedRun` of these settings: each role left None from the preset
        ``algorithm``. Train it with :func:`lfed.core.fit.fit_run` (no Trainer) or under a Lightning ``Trainer``
        (``FederatedModule`` builds it so)."""
        from lfed.core.run import FederatedRun

        roles = {k: getattr(self, k) for k in ROLES}
        cfg = algorithms.resolve(self.algorithm, **roles)
        components = algorithms.build(cfg, self.stragglers)
        components.asynchronous = self.asynchronous
        return FederatedRun(components, self.training, cfg["server_optimizer"], net=self.net, loss=self.loss,
                            seed=self.seed, engine=self.engine, evaluation=self.evaluation, algorithm=self.algorithm,
                            explicit=frozenset(k for k, v in roles.items() if v is not None))

    def hparams(self) -> dict[str, Any]:
        """These settings as a checkpoint's hyperparameters: groups as dicts; objects (a net, a component, a loss)
        left out: they are rebuilt from the config."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in GROUPS:
                out[f.name] = asdict(value)
            elif value is None or isinstance(value, (str, int, float, bool, dict, list, tuple)):
                out[f.name] = value
        return out


#: The settings' groups: a group's name -> its dataclass.
GROUPS: dict[str, type] = {"training": LocalTraining, "stragglers": Stragglers, "engine": Engine, "evaluation": Evaluation}


def _default(f: Field) -> Any:
    return f.default_factory() if f.default is MISSING else f.default


def build_run(**kwargs: Any):
    """The :class:`~lfed.core.run.FederatedRun` of these settings (:class:`RunSettings`' fields as keywords: the
    ``model:`` section of a config): ``RunSettings.of(**kwargs).build()``, what
    :class:`~lfed.lightning.module.FederatedModule` runs, built without Lightning."""
    return RunSettings.of(**kwargs).build()
