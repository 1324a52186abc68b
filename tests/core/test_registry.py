"""A round that does not know the features (issue 41): every role has a do-nothing default, and components read
what their neighbours declare, not their names.

No training here: the defaults themselves, DP-FedAvg's refusals of a user's own sampler, weighting and channel by
their declarations, and the round's and the run's sources free of feature names. The features' own tests
(tests/personal/test_sharing.py, test_personal_eval.py, test_privacy.py, test_round.py) run them bit for bit.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import lfed.core.round
import lfed.core.run
from lfed.base.component import CompositionContext
from lfed.base.declaration import Declaration, Supports, declaration
from lfed.client.objectives import ClientRule, Plain
from lfed.core import registry as algorithms
from lfed.core.algorithm import Algorithm
from lfed.participation.sampling import ClientSampler, PoissonSampler, UniformSampler
from lfed.personal.ditto import Ditto
from lfed.personal.sharing import SHARE_ALL, resolve_sharing
from lfed.privacy.dp_fedavg import DPFedAvg
from lfed.server.channel import Channel, Dense, TernaryTopK
from lfed.server.weighting import SizeWeights, UniformWeights


def test_share_all_is_the_identity():
    x, d, w_new, w_old = torch.randn(3, 5), torch.randn(5), torch.randn(5), torch.randn(5)
    assert SHARE_ALL.shared(x) is x and SHARE_ALL.expand_shared(d) is d
    assert SHARE_ALL.keep_local(w_new, w_old) is w_new
    assert SHARE_ALL.shared_sizes_of([2, 3]) == [2, 3]
    assert SHARE_ALL.state_size(5, local=True) == SHARE_ALL.state_size(5, local=False) == 5


def test_a_rule_without_a_local_part_shares_everything():
    alg = algorithms.build(algorithms.resolve("fedavg"))
    assert alg.sharing is SHARE_ALL  # before attach too
    assert resolve_sharing(Plain(), None, None) is SHARE_ALL and not hasattr(Plain(), "sharing")
    parts = {f.name: getattr(alg, f.name) for f in alg.__dataclass_fields__.values()}
    assert Algorithm(**{**parts, "sharing": None}).sharing is SHARE_ALL  # None, as before 0.4


def test_personal_models_are_none_by_default_and_the_personal_rows_of_a_personalized_rule():
    assert Plain().personal_models(torch.zeros(3), lambda c: None) == {}
    models = Ditto().personal_models(torch.zeros(3), lambda c: None)
    assert list(models) == ["personal"] and callable(models["personal"])


def test_the_check_refuses_a_rule_whose_personalized_and_personal_rows_disagree():
    class Vague(ClientRule):
        declares = Declaration(supports=Supports(personalized=True))

    class Mine(ClientRule):
        def personal_rows(self, clients, w, local):
            return w.expand(clients.numel(), -1)

    context = CompositionContext(frozenset())
    with pytest.raises(ValueError, match="objective: Vague says it is personalized"):
        Vague().check(context)
    with pytest.raises(ValueError, match="objective: Mine defines personal_rows but is not personalized, .*"
                                         r"declares = Declaration\(supports=Supports\(personalized=True\)\)"):
        Mine().check(context)
    assert Plain().check(context) == [] and Ditto().check(context) == []


def test_declarations_of_the_built_ins():
    def supports(c):
        return declaration(c).supports

    assert supports(PoissonSampler()).poisson and not supports(UniformSampler()).poisson
    assert supports(UniformWeights()).equal_weights and not supports(SizeWeights()).equal_weights
    assert supports(Dense()).exact and supports(Channel()).exact and not supports(TernaryTopK(0.5)).exact

    class Quantized(Dense):
        declares = Declaration()  # not Dense's: it compresses

        def upstream(self, updates, cohort, sizes):
            return updates.half().to(updates.dtype)

    class Inherited(Channel):  # Channel's declaration, computed from the methods it overrides
        def upstream(self, updates, cohort, sizes):
            return updates.half().to(updates.dtype)

    class Logged(Quantized):
        declares = Declaration(supports=Supports(exact=True))  # says so itself

    assert not supports(Quantized()).exact and not supports(Inherited()).exact and supports(Logged()).exact


def _dp_context(**roles) -> CompositionContext:
    roles = {"sampler": PoissonSampler(), "weighting": UniformWeights(), "channel": Dense(), **roles}
    return CompositionContext(frozenset(), components=roles)


def test_dp_reads_the_neighbours_declarations_not_their_names():
    class MyPoisson(ClientSampler):
        name = "mine"
        declares = Declaration(supports=Supports(poisson=True))

    class MyEqual(SizeWeights):
        name = "equal"
        declares = Declaration(supports=Supports(equal_weights=True))

    class MyQuantizer(Channel):
        name = "dense"  # the name of the identity, but it is not one

        def upstream(self, updates, cohort, sizes):
            return updates.half().to(updates.dtype)

    DPFedAvg().check(_dp_context(sampler=MyPoisson(), weighting=MyEqual()))
    with pytest.raises(ValueError, match="sampler: DP-FedAvg's accountant assumes Poisson sampling"):
        DPFedAvg().check(_dp_context(sampler=UniformSampler()))
    with pytest.raises(ValueError, match="weighting: DP-FedAvg weighs every counting client by 1/m"):
        DPFedAvg().check(_dp_context(weighting=SizeWeights()))
    with pytest.raises(ValueError, match="channel: DP-FedAvg clips each update before any compression"):
        DPFedAvg().check(_dp_context(channel=MyQuantizer()))


@pytest.mark.parametrize("module", [lfed.core.round, lfed.core.run])
def test_the_round_and_the_run_name_no_feature(module):
    code = "\n".join(line.split("#")[0] for line in inspect.getsource(module).splitlines())
    for feature in ("sharing is", ".personalized", "personal_rows is", '"dwfed"', "history.fill", "history.record"):
        assert feature not in code, f"{module.__name__} tests {feature!r}"


# --------------------------------------------------------------------------- one table of names (issue 50)


@pytest.mark.parametrize("role", sorted(algorithms.NAMES))
def test_every_name_builds_its_class_with_the_settings_it_implies(role):
    for name in algorithms.names(role):
        path, implied = algorithms.entry(role, name)
        component = algorithms.build_component(role, name)
        assert f"{type(component).__module__}.{type(component).__qualname__}" == path
        assert isinstance(component, algorithms.component_class(role, name))
        for key, value in implied.items():
            assert getattr(component, key) == value, (role, name, key)


def test_the_table_is_the_only_list_the_settings_and_help_read():
    import typing

    from lfed.lightning.cli_help import _LISTED
    from lfed.lightning.module import FederatedModule

    hints = typing.get_type_hints(FederatedModule.__init__)
    for role in algorithms.NAMES:
        literals = {a for arg in typing.get_args(hints[role]) if typing.get_origin(arg) is typing.Literal
                    for a in typing.get_args(arg)}
        assert literals == set(algorithms.names(role)), role
    modules = {algorithms.entry("objective", n)[0].rsplit(".", 1)[0] + "." for n in algorithms.names("objective")}
    assert set(_LISTED["model.objective"]) == modules  # FedDyn's and the personal rules' modules, from the table
    for preset in algorithms.PRESETS.values():  # presets are compositions over the table: names, not class paths
        for role, value in preset.items():
            if role in algorithms.NAMES and isinstance(value, str):
                assert value in algorithms.NAMES[role], (role, value)


def test_a_new_built_in_is_one_line_of_the_table(monkeypatch):
    monkeypatch.setitem(algorithms.NAMES["objective"], "prox_strong", ("lfed.client.objectives.Prox", {"mu": 0.5}))
    alg = algorithms.build(algorithms.resolve("fedavg", objective="prox_strong"))
    assert type(alg.objective).__name__ == "Prox" and alg.objective.mu == 0.5
    assert "prox_strong" in algorithms.names("objective")


def test_one_build_function_for_every_role_and_its_errors():
    given = UniformWeights("drop")
    assert algorithms.build_component("weighting", given) is given  # a component is used as it is
    assert algorithms.build_component("weighting", "size", partial_work="scale").partial_work == "scale"
    assert isinstance(algorithms.build_component("combination", "lfed.privacy.dp_fedavg.DPFedAvg"), DPFedAvg)
    for role, bad in [("objective", "scafold"), ("weighting", "sizes"), ("combination", "medoid"), ("attack", "backdoors"),
                      ("sampler", "random"), ("channel", "sparse")]:
        with pytest.raises(ValueError, match=rf"^{role}: '{bad}' is not one of \(") as info:
            algorithms.build_component(role, bad)
        assert all(name in str(info.value) for name in algorithms.names(role))
    with pytest.raises(ValueError, match="sampler: 'lfed.client.objectives.Prox' is not a ClientSampler"):
        algorithms.build_component("sampler", "lfed.client.objectives.Prox")
    assert algorithms.component_class("objective", "no.such.Rule") is None
    channel = algorithms.build(algorithms.resolve("fedavg", channel=0.25)).channel  # a number: EFL's ternary q
    assert isinstance(channel, TernaryTopK) and channel.sparsity == 0.25
    assert isinstance(algorithms.build(algorithms.resolve("fedavg", channel="dense")).channel, Dense)


def test_a_runs_name_says_its_asynchronous_schedule_and_its_adapter():
    """Issue 51 item 13: FedBuff and LoRA runs were named fedavg-digits-*; lfed's classes that no preset names are named."""
    assert algorithms.settings_label({"algorithm": "fedavg", "asynchronous": {"class_path": "lfed.core.asynchronous.FedBuff"}}) \
        == "fedavg+FedBuff"
    assert algorithms.settings_label({"net": {"class_path": "lfed.models.adapters.LoRA"}}) == "fedavg+LoRA"
    assert algorithms.settings_label({"net": {"class_path": "lfed.models.MLP"}, "objective": {"class_path": "lfed.client.Prox"},
                                      "algorithm": "fedprox"}) == "fedprox"  # the preset names lfed's own components
    assert algorithms.settings_label({"objective": {"class_path": "fednova.FedNova"}}) == "fedavg+FedNova"


def test_the_asynchronous_schedule_declares_the_setting_it_does_not_read():
    from lfed.core.asynchronous import FedBuff

    assert FedBuff(concurrency=4, buffer=2).unused == ("fraction",)


def test_the_roles_are_said_once_in_the_role_table():
    """ROLE_TABLE is the one list of roles: the settings' roles, the bases a class_path is checked against, FedAvg's
    defaults, the names' table, the Algorithm's component fields and docs/extending.md's role table are all it."""
    import dataclasses
    import re
    from pathlib import Path

    from lfed.base.component import load_class

    table = algorithms.ROLE_TABLE
    assert algorithms.ROLES == tuple(r.name for r in table)
    with_base = {r.name: r.base for r in table if r.base is not None}
    assert algorithms.BASES == with_base
    assert set(algorithms.NAMES) == set(with_base)  # a built-in name exists for each component role, and only those
    assert algorithms.BASE == {r.name: r.default for r in table if r.name != "server_optimizer"}
    assert set(with_base) <= {f.name for f in dataclasses.fields(Algorithm)}  # each component role is a field
    docs = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)`[^|]*\| `([\w.]+)` \|", docs.read_text(), re.M)}
    for role, base in with_base.items():  # the docs' row names the same class (by a shorter export path)
        assert role in rows, f"docs/extending.md's role table has no row for {role}"
        assert load_class(rows[role], object, role) is load_class(base, object, role), role
