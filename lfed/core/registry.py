"""Named algorithms as compositions of lfed's pieces (docs/algorithms.md §0: presets).

A preset fills the :class:`~lfed.lightning.module.FederatedModule` arguments that a config leaves
unset (``None``); anything set explicitly wins, so ``algorithm: scaffold`` with
``sampler: attention`` is AdaFL sampling + SCAFFOLD with no new code. A choice is a name
(``objective: scaffold``) or a component object (``class_path``, or a dotted class path string
for the objective); :func:`build` turns the resolved choices into a :class:`~lfed.core.algorithm.Algorithm`.
A new algorithm in its own file is registered by one line in :data:`PRESETS` (``feddyn``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch


@dataclass(frozen=True)
class Role:
    """One setting that chooses a piece of the round (a ``model:`` key of a config).

    Attributes:
        name: The setting, and the :class:`~lfed.core.algorithm.Algorithm` field of a component role.
        base: The class path a component of this role subclasses (a ``class_path`` is checked against it); None for a
            setting of another role's component (``partial_work``: the weighting's; ``fraction``: the
            participation's) or a factory (``server_optimizer``).
        default: FedAvg's choice (a preset fills the rest: :data:`PRESETS`).
        docs: Where the role is defined.
    """

    name: str
    base: str | None
    default: Any
    docs: str


#: The roles, said once: :data:`ROLES`, :data:`BASES`, :data:`BASE`, the names' table :data:`NAMES` (keyed by the roles
#: that have a base), :class:`~lfed.core.algorithm.Algorithm`'s component fields and the role table of
#: docs/extending.md are this table (``tests/core/test_registry.py`` holds them to it).
ROLE_TABLE: tuple[Role, ...] = (
    Role("objective", "lfed.client.objectives.ClientRule", "plain", "docs/algorithms.md §2"),
    Role("weighting", "lfed.server.weighting.AggregationWeights", "size", "docs/algorithms.md §3"),
    Role("partial_work", None, "keep", "docs/algorithms.md §3 (the weighting's)"),
    Role("combination", "lfed.server.combination.ServerCombination", "mean", "docs/algorithms.md §4"),
    Role("channel", "lfed.server.channel.Channel", None, "docs/algorithms.md §7"),
    Role("sampler", "lfed.participation.sampling.ClientSampler", "uniform", "docs/algorithms.md §5"),
    Role("fraction", None, 0.1, "docs/algorithms.md §5 (the participation's)"),
    Role("server_optimizer", None, "sgd(lr=1.0)", "docs/algorithms.md §4.1"),
    Role("attack", "lfed.base.attack.Attack", "none", "docs/robustness.md §1"),
)

#: The model settings that choose a component (by name or ``class_path``).
ROLES = tuple(r.name for r in ROLE_TABLE)
#: The base class a role's component subclasses (a ``class_path`` is checked against it).
BASES: dict[str, str] = {r.name: r.base for r in ROLE_TABLE if r.base is not None}
#: Defaults of every composable choice (FedAvg); the server optimizer's is built by :func:`resolve`.
BASE: dict[str, Any] = {r.name: r.default for r in ROLE_TABLE if r.name != "server_optimizer"}

#: Every built-in name of every role, listed once: role -> name -> the component's class path (and the keyword
#: arguments the name implies). ``--help``, the settings' ``Literal`` types, :func:`build`, the presets and every
#: error message read this table; a new built-in method is its file plus one line here, a user's method is its file
#: and a ``class_path``. Class paths, not classes: the table imports nothing until a run is built.
NAMES: dict[str, dict[str, str | tuple[str, dict[str, Any]]]] = {
    "objective": {
        "plain": "lfed.client.objectives.Plain",
        "prox": "lfed.client.objectives.Prox",
        "scaffold": "lfed.client.objectives.Scaffold",
        "igfl": "lfed.client.objectives.IGFL",
        "efl": "lfed.client.objectives.EFL",
        "feddyn": "lfed.client.feddyn.FedDyn",
        "fedavg_ft": "lfed.personal.finetune.FedAvgFT",
        "ditto": "lfed.personal.ditto.Ditto",
        "fedper": "lfed.personal.fedper.FedPer",
        "fedrep": "lfed.personal.fedrep.FedRep",
        "fedbn": "lfed.personal.fedbn.FedBN",
        "apfl": "lfed.personal.apfl.APFL",
        "perfedavg": "lfed.personal.perfedavg.PerFedAvg",
        "fedrod": "lfed.personal.fedrod.FedRoD",
        "dp_sgd": "lfed.privacy.dp_sgd.DPSGD",
    },
    "weighting": {
        "size": "lfed.server.weighting.SizeWeights",
        "uniform": "lfed.server.weighting.UniformWeights",
        "dwfed": "lfed.server.weighting.DWFedWeights",
    },
    "combination": {
        "mean": "lfed.server.combination.Mean",
        "self": ("lfed.server.combination.IGFLAttention", {"query": "self"}),
        "global": ("lfed.server.combination.IGFLAttention", {"query": "global"}),
        "time": ("lfed.server.combination.IGFLAttention", {"query": "time"}),
        "dp_fedavg": "lfed.privacy.dp_fedavg.DPFedAvg",
        "secagg": "lfed.privacy.secagg.SecureAggregation",
        "distributed_dp": "lfed.privacy.distributed_dp.DistributedDP",
        "median": "lfed.robust.rules.median.CoordinateMedian",
        "trimmed_mean": "lfed.robust.rules.median.TrimmedMean",
        "krum": "lfed.robust.rules.krum.Krum",
        "multi_krum": "lfed.robust.rules.krum.MultiKrum",
        "bulyan": "lfed.robust.rules.bulyan.Bulyan",
        "geometric_median": "lfed.robust.rules.geometric_median.GeometricMedian",
        "centered_clipping": "lfed.robust.rules.centered_clipping.CenteredClipping",
        "norm_bound": "lfed.robust.rules.norm_bound.NormBound",
        "fltrust": "lfed.robust.rules.fltrust.FLTrust",
        "bucketing": "lfed.robust.rules.bucketing.Bucketing",
        "nnm": "lfed.robust.rules.nnm.NearestNeighborMixing",
    },
    "channel": {
        "dense": "lfed.server.channel.Dense",
        "ternary": "lfed.server.channel.TernaryTopK",
    },
    "sampler": {
        "uniform": "lfed.participation.sampling.UniformSampler",
        "attention": "lfed.participation.sampling.AttentionSampler",
        "poisson": "lfed.participation.sampling.PoissonSampler",
    },
    "attack": {
        "none": "lfed.base.attack.NoAttack",
        "label_flip": "lfed.robust.attacks.label_flip.LabelFlip",
        "backdoor": "lfed.robust.attacks.backdoor.Backdoor",
        "sign_flip": "lfed.robust.attacks.simple.SignFlip",
        "gaussian": "lfed.robust.attacks.simple.Gaussian",
        "scaling": "lfed.robust.attacks.simple.Scaling",
        "alie": "lfed.robust.attacks.alie.ALIE",
        "ipm": "lfed.robust.attacks.ipm.IPM",
        "min_max": "lfed.robust.attacks.minmax.MinMax",
        "min_sum": "lfed.robust.attacks.minmax.MinSum",
        "mimic": "lfed.robust.attacks.mimic.Mimic",
    },
}

def names(role: str) -> tuple[str, ...]:
    """The built-in names of ``role`` (for ``Literal`` types, ``--help`` and messages)."""
    return tuple(NAMES[role])


#: The built-in names as ``Literal`` types: configs and ``--help`` list and check them.
ObjectiveName = Literal[names("objective")]  # type: ignore[valid-type]
WeightingName = Literal[names("weighting")]  # type: ignore[valid-type]
CombinationName = Literal[names("combination")]  # type: ignore[valid-type]
ChannelName = Literal[names("channel")]  # type: ignore[valid-type]
SamplerName = Literal[names("sampler")]  # type: ignore[valid-type]
AttackName = Literal[names("attack")]  # type: ignore[valid-type]


def entry(role: str, name: str) -> tuple[str, dict[str, Any]]:
    """A built-in name's class path and the settings the name implies (``("lfed.server.combination.IGFLAttention",
    {"query": "global"})`` for ``combination: global``)."""
    entry = NAMES[role][name]
    return (entry, {}) if isinstance(entry, str) else entry


def _resolve(role: str, value: Any, strict: bool) -> tuple[type | None, dict[str, Any]]:
    """The class a ``role`` setting names (a component, a built-in name or a dotted class path) and the settings a name
    implies; an unknown name or an unimportable path raises (``strict``) or gives None."""
    from lfed.base.component import load_class

    base = load_class(BASES[role], object, role)
    if isinstance(value, base):
        return type(value), {}
    if isinstance(value, str) and value in NAMES[role]:
        path, implied = entry(role, value)
        return load_class(path, base, role), implied
    if isinstance(value, str) and "." in value:
        try:
            return load_class(value, base, role), {}
        except ValueError:
            if strict:
                raise
            return None, {}
    if strict:
        raise ValueError(f"{role}: {value!r} is not one of {names(role)}, nor a component's class path")
    return None, {}


def component_class(role: str, value: Any) -> type | None:
    """The class a ``role`` setting names: a built-in name, a dotted class path or a component; None if unknown."""
    return _resolve(role, value, strict=False)[0]


def build_component(role: str, value: Any, **settings: Any):
    """The one build function of every role: a component given is used as it is; a built-in name
    (:data:`NAMES`) or a dotted class path is built with its defaults (and ``settings``, the role's own, such as a
    weighting's ``partial_work``).

    Raises:
        ValueError: An unknown name, naming the role and its names.
    """
    cls, implied = _resolve(role, value, strict=True)
    return value if isinstance(value, cls) and not isinstance(value, str) else cls(**implied, **settings)


def _server(name: str, **kwargs: Any):
    """A server-optimizer factory by name, resolved lazily."""

    def factory(params):
        if name == "sgd":
            return torch.optim.SGD(params, **kwargs)
        from lfed.server import optimizers

        return getattr(optimizers, name)(params, **kwargs)

    factory.__qualname__ = f"{name}({', '.join(f'{k}={v}' for k, v in kwargs.items())})"
    return factory


def _stepwise(start: float, end: float, stages: int):
    from lfed.participation.sampling import StepwiseFraction

    return StepwiseFraction(start, end, stages)


PRESETS: dict[str, dict[str, Any]] = {
    # McMahan et al. 2017
    "fedavg": {},
    # Hsu et al. 2019; beta = 0.9 as in IGFL's tables
    "fedavgm": {"server_optimizer": _server("sgd", lr=1.0, momentum=0.9)},
    # Reddi et al. 2021, tau = 0.01 (IGFL's tables use 0.1 and 0.01)
    "fedadam": {"server_optimizer": _server("FedAdam", lr=0.01, tau=0.01)},
    "fedyogi": {"server_optimizer": _server("FedYogi", lr=0.01, tau=0.01)},
    "fedadagrad": {"server_optimizer": _server("FedAdagrad", lr=0.01, tau=0.01)},
    # Li et al. 2020: partial work counts as is
    "fedprox": {"objective": "prox", "partial_work": "keep"},
    # Karimireddy et al. 2020: uniform weights as the paper
    "scaffold": {"objective": "scaffold", "weighting": "uniform"},
    # Huang et al. (000): IGFL = IGFL-C + IGFL-S. 000 picks the attention query per setting:
    # time for cross-silo with every client each round (Table 1), global for cross-device
    # CIFAR-10 (Table 2), self for EMNIST-62 (Table 3); §5.4: time suits full participation,
    # global suits 10 classes. lfed's defaults are Table 2's setting (C = 0.1, 10 classes):
    # global. Pick another with `combination:` or igfl_s_self / igfl_s_time.
    "igfl": {"objective": "igfl", "combination": "global"},
    "igfl_c": {"objective": "igfl"},
    "igfl_s": {"combination": "global"},
    "igfl_s_self": {"combination": "self"},
    "igfl_s_global": {"combination": "global"},
    "igfl_s_time": {"combination": "time"},
    # Chen et al. (002)
    "dwfed": {"weighting": "dwfed"},
    # Chen, Chong, Quek (003): attention sampling, fraction 0.1 -> 0.5, size weights
    "adafl": {"sampler": "attention", "fraction": ("stepwise", 0.1, 0.5, 5)},
    "adafl_scaffold": {"sampler": "attention", "fraction": ("stepwise", 0.1, 0.5, 5), "objective": "scaffold"},
    "adafl_fedprox": {"sampler": "attention", "fraction": ("stepwise", 0.1, 0.5, 5), "objective": "prox"},
    # Ma et al. (004): Fisher-elastic objective, T/s weights for partial work, ternary compression
    # with residuals both ways. 004's text gives no sparsity q (its implementation details are in
    # a supplement we do not have): q = 0.1 is ours; `channel: false` switches it off.
    "efl": {"objective": "efl", "partial_work": "scale", "channel": 0.1},
    # Acar et al. 2021 (docs/algorithms.md §2 feddyn): one file, lfed/client/feddyn.py (client rule + server combination)
    "feddyn": {"objective": "feddyn"},
    # McMahan et al. 2018 (docs/algorithms.md §11): Poisson sampling, uniform weights, clip + noise + fixed denominator;
    # set its noise, clip and budget with combination: {class_path: lfed.privacy.DPFedAvg, init_args: {...}}
    "dp_fedavg": {"sampler": "poisson", "weighting": "uniform", "combination": "dp_fedavg"},
    # the same with Reddi et al.'s FedAdam server (DP-FedAdam: the server optimizer is post-processing)
    "dp_fedadam": {"sampler": "poisson", "weighting": "uniform", "combination": "dp_fedavg",
                   "server_optimizer": _server("FedAdam", lr=0.01, tau=0.01)},
    # docs/algorithms.md §13, personalized FL: one client rule per method (lfed/personal/), each with a personalized model per client
    "fedavg_ft": {"objective": "fedavg_ft"},
    "ditto": {"objective": "ditto"},
    "fedper": {"objective": "fedper"},
    "fedrep": {"objective": "fedrep"},
    "fedbn": {"objective": "fedbn"},
    "apfl": {"objective": "apfl"},
    "perfedavg": {"objective": "perfedavg"},
    "fedrod": {"objective": "fedrod"},
}

#: The preset names, as a ``Literal`` so configs and ``--help`` list and check them.
AlgorithmName = Literal[tuple(PRESETS)]  # type: ignore[valid-type]


def _check_preset_objective(algorithm: str, given: Any) -> None:
    """A preset that names an objective and an explicit objective of another class contradict each other: refused.

    (An explicit objective of the preset's class, or a subclass of it, sets the preset's objective's own settings:
    ``algorithm: ditto`` with ``objective: {class_path: Ditto, init_args: {lam: 0.1}}``.)
    """
    preset = PRESETS[algorithm].get("objective")
    if preset is None or given is None:
        return
    want, have = component_class("objective", preset), component_class("objective", given)
    if want is None or have is None or issubclass(have, want):
        return
    raise ValueError(f"objective: {have.__name__} contradicts algorithm={algorithm!r}, whose objective is {want.__name__}; "
                     f"set objective: null (--model.objective null) to train {algorithm}, or the algorithm of your objective")


def resolve(algorithm: str, **explicit: Any) -> dict[str, Any]:
    """Fill the arguments left ``None`` in ``explicit`` from preset ``algorithm``, then from :data:`BASE`."""
    if algorithm not in PRESETS:
        raise ValueError(f"algorithm: {algorithm!r} is not one of {sorted(PRESETS)}")
    unknown = sorted(set(explicit) - set(ROLES))
    if unknown:  # a group's setting or 0.3's word: lfed.core.settings.RunSettings.of turns those into roles and groups
        raise TypeError(f"resolve: {unknown} are not roles; the roles are {ROLES}")
    _check_preset_objective(algorithm, explicit.get("objective"))
    out = dict(BASE)
    out["server_optimizer"] = _server("sgd", lr=1.0)
    out.update(PRESETS[algorithm])
    for key, value in explicit.items():
        if value is not None:
            out[key] = value
    out["combination_explicit"] = explicit.get("combination") is not None
    out["preset_combination"] = PRESETS[algorithm].get("combination")
    if isinstance(out["fraction"], tuple) and out["fraction"][0] == "stepwise":
        out["fraction"] = _stepwise(*out["fraction"][1:])
    return out


def build(cfg: dict[str, Any], stragglers=None):
    """The :class:`~lfed.core.algorithm.Algorithm` of a resolved composition (:func:`resolve`'s output).

    Each entry of ``cfg`` is a name (its component with its own defaults) or a component object (used
    as it is: a method's settings are its component's, ``Prox(mu=0.1)``); ``stragglers`` a
    :class:`~lfed.participation.stragglers.Stragglers` (None: none). An objective that brings its own server combination
    (:meth:`~lfed.client.objectives.ClientRule.server_combination`) gets it unless the user set
    another, which is refused.
    """
    from lfed.core.algorithm import Algorithm
    from lfed.participation.participation import Participation
    from lfed.participation.stragglers import Stragglers
    from lfed.server.channel import Channel

    stragglers = stragglers if stragglers is not None else Stragglers()
    objective = build_component("objective", cfg["objective"])
    weighting = build_component("weighting", cfg["weighting"],
                                **({} if not isinstance(cfg["weighting"], str) else {"partial_work": cfg["partial_work"]}))
    comb = cfg["combination"]
    own = objective.server_combination()
    _check_dp_kept(cfg, objective, own)
    if own is not None:
        if cfg.get("combination_explicit") and comb is not own:
            raise ValueError(
                f"combination: objective {objective.name!r} brings its own server combination "
                f"({type(own).__name__}); leave combination unset"
            )
        combination = own
    else:
        combination = build_component("combination", comb)
    q = cfg["channel"]
    if q is None or q is False:
        channel = build_component("channel", "dense")
    elif isinstance(q, (str, Channel)):
        channel = build_component("channel", q)
    else:  # a number: EFL's sparsity q of the ternary channel
        channel = build_component("channel", "ternary", sparsity=q)
    sampler = build_component("sampler", cfg["sampler"])
    participation = Participation(cfg["fraction"], stragglers.p_inactive, stragglers.p_incomplete)
    attack = build_component("attack", cfg.get("attack") or "none")
    return Algorithm(objective, weighting, combination, channel, sampler, participation, attack=attack)


def _is_dp(choice: Any) -> bool:
    """Whether a combination choice (a component, or a class path) is DP-FedAvg or a subclass of it."""
    from lfed.base.component import load_class

    cls = component_class("combination", choice) if isinstance(choice, str) else type(choice)
    return cls is not None and issubclass(cls, load_class(NAMES["combination"]["dp_fedavg"], object, "combination"))


def _check_dp_kept(cfg: dict[str, Any], objective: Any, own: Any) -> None:
    """Refuse a composition in which DP-FedAvg, asked for, would be replaced by another server combination (an
    objective's own, FedDyn's; or an explicit combination over a DP preset's): the run would not be private."""
    from lfed.privacy.releases import refusal, releases_of

    if _is_dp(cfg["combination"]) and own is not None:
        what = next(iter(releases_of(objective)), f"{type(objective).__name__} brings its own server combination, which "
                                              "would replace DP-FedAvg")
        raise ValueError(refusal("objective", what))
    if cfg.get("combination_explicit") and _is_dp(cfg.get("preset_combination")) and not _is_dp(cfg["combination"]):
        comb = cfg["combination"]
        name = comb if isinstance(comb, str) else type(comb).__name__
        raise ValueError(f"combination: {name!r} would replace the preset's DP-FedAvg (no clipping, no noise: the run "
                         "would not be private); give combination: lfed.privacy.DPFedAvg (its class_path and "
                         "init_args), or a preset without DP")


def composition_label(algorithm: str, chosen: Mapping[str, str | None]) -> str:
    """The run's name for logs and run directories: the preset, then each component the preset does not choose.

    ``chosen``: ``{role: class path}`` of the run's components (``asynchronous`` and ``net`` too). A component is
    named, by its class, when the preset would put another class in its role (:func:`preset_classes`): a user's own
    (``fedavg+FedNova``), one of lfed's given over the preset's (``fedavg+Prox``: FedProx's rule under the
    ``fedavg`` preset; ``fedavg+DPSGD``), a robust rule and an attack (``fedavg+Krum+ALIE``), the asynchronous
    schedule (``fedavg+FedBuff``) and an adapter on a frozen base (``fedavg+LoRA``; another net is not named).
    """
    preset = preset_classes(algorithm) if algorithm in PRESETS else {}
    own = []
    for role, path in chosen.items():
        if not isinstance(path, str) or "." not in path or path.startswith("torch."):
            continue
        lfed_own = path.startswith("lfed.")
        if role == "net" and not path.startswith(NAMED_IN_LABELS):
            continue
        if lfed_own and role in ("participation", "history"):  # lfed's round machinery, no choice of the user's
            continue
        if role in preset and _short(path) == _short(preset[role]):  # the preset's own class (by any export path)
            continue
        if path == NO_ATTACK:
            continue
        own.append(_short(path))
    return "+".join([str(algorithm), *dict.fromkeys(own)])


#: The attack role's default: no Byzantine clients (never named).
NO_ATTACK = "lfed.base.attack.NoAttack"


def _short(path: str) -> str:
    return path.rsplit(".", 1)[-1]


@functools.cache
def preset_classes(algorithm: str) -> dict[str, str]:
    """``{role: class path}`` of the components preset ``algorithm`` builds when nothing else is set."""
    return {role: f"{type(c).__module__}.{type(c).__qualname__}" for role, c in build(resolve(algorithm)).roles().items()}


#: lfed's own classes that no preset names, so a run's name does: its asynchronous schedule (``fedavg+FedBuff``) and
#: an adapter on a frozen base (``fedavg+LoRA``).
NAMED_IN_LABELS = ("lfed.core.asynchronous.", "lfed.models.adapters.", "lfed.robust.")


def settings_label(model: dict[str, Any]) -> str:
    """:func:`composition_label` of a run's ``model`` settings (before anything is built): a role given as a
    ``class_path`` (or a dotted path string) or as a built-in name; imports nothing of the user's."""
    chosen: dict[str, str | None] = {}
    for role in (*ROLES, "asynchronous", "net"):
        value = model.get(role)
        if isinstance(value, dict) and isinstance(value.get("class_path"), str):
            chosen[role] = value["class_path"]
        elif isinstance(value, str) and "." in value:  # a dotted class path given as a string
            chosen[role] = value
        elif isinstance(value, str) and value in NAMES.get(role, {}):
            chosen[role] = entry(role, value)[0]
        elif role == "channel" and isinstance(value, (int, float)) and not isinstance(value, bool) and value:
            chosen[role] = entry("channel", "ternary")[0]  # a number: the ternary channel's sparsity
    return composition_label(model.get("algorithm") or "fedavg", chosen)


class CompositionWarning(UserWarning):
    """A composition of lfed's pieces that runs but does not do what its settings suggest."""


def validate_composition(algorithm, explicit: set[str] | frozenset[str] = frozenset(), *,
                         num_clients: int | None = None, total_rounds: int | None = None,
                         net_releases: tuple[str, ...] = (), run_key: str = "",
                         data_notes: frozenset = frozenset(), training: Any = None,
                         shared_params: int | None = None, data: Any = None, seed: int = 0) -> list[str]:
    """Every component's one check before round 0 (:meth:`lfed.base.component.Component.check`, each component once, in
    the order of the roles: the asynchronous schedule's first): the one place the run checks its composition.

    Every piece composes with every other (docs/algorithms.md §0), but some combinations silently do
    nothing or something else than their names say; each component knows its own (a component
    of the user's too), so no list here names them.

    Args:
        algorithm: The run's components (:class:`lfed.core.algorithm.Algorithm`).
        explicit: The roles the user set (a preset's own choices are not questioned).
        num_clients: ``N``, when known; ``total_rounds``: the run's rounds, when known (with both,
            the checks see every round's cohort size).
        net_releases: What the run releases of its net beyond the parameters (:meth:`lfed.core.run.FederatedRun.net_releases`).
        run_key, data_notes, training, shared_params, seed: :class:`lfed.base.component.CompositionContext`'s.
        data: The run's federated data on the device, for the components that check it (None: not checked).

    Returns:
        The warnings, one sentence each (the caller emits them as :class:`CompositionWarning`).
    """
    from lfed.base.component import CompositionContext, check_components
    from lfed.participation.sampling import cohort_size

    participation = algorithm.participation
    sizes = None
    if num_clients is not None and total_rounds is not None and total_rounds > 0:
        sizes = [cohort_size(participation.fraction(r, total_rounds), num_clients) for r in range(total_rounds)]
    roles = algorithm.roles()
    context = CompositionContext(frozenset(explicit), participation.stragglers.p_inactive,
                                 participation.stragglers.p_incomplete, num_clients, total_rounds, sizes, roles,
                                 tuple(net_releases), run_key, frozenset(data_notes), training, shared_params, data,
                                 seed)
    return check_components(roles.values(), context)  # before round 0: refuse what cannot run, derive settings, warn
