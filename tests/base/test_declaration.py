"""The component contract of 0.6 (issue 64): one declaration object in place of 0.5's flags, one ``check`` hook in place
of ``prepare_run`` / ``check_start`` / ``composition_warnings``; a component written for 0.5 still runs, with one
``FutureWarning`` per class naming the new spelling."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import flat_weights, run_rounds
from test_objectives import toy_data, toy_module

from lfed.base.component import Component, CompositionContext, check_components
from lfed.base.declaration import Declaration, Needs, Releases, Supports, declaration
from lfed.client.objectives import ClientRule, Scaffold
from lfed.core import registry
from lfed.core.algorithm import Algorithm
from lfed.core.asynchronous import FedBuff, asynchronous_refusal, declared_refusal
from lfed.participation.participation import Participation
from lfed.participation.sampling import UniformSampler
from lfed.server.channel import Dense
from lfed.server.combination import Mean, ServerCombination
from lfed.server.weighting import SizeWeights


def future_warnings(record) -> list[str]:
    """lfed's warnings of 0.5's spellings among ``record`` (not Lightning's own)."""
    return [str(w.message) for w in record if issubclass(w.category, FutureWarning) and "lfed 0.5's" in str(w.message)]


# ------------------------------------------------------------------------------- the declaration itself
def test_a_declaration_is_frozen_and_refuses_a_wrong_part_naming_it():
    d = Declaration(releases=Releases(values="one clause"), needs=Needs(start_loss=True))
    assert d.releases.values == ("one clause",) and d.needs.start_loss and not d.needs.history
    with pytest.raises(AttributeError):
        d.needs = Needs()  # type: ignore[misc]
    for bad, message in ((lambda: Declaration(needs=True), r"^Declaration.needs: a Needs\(...\)"),
                         (lambda: Needs(history=1), r"^Needs.history: true or false"),
                         (lambda: Releases(values=(1,)), r"^Releases.values: a tuple of strings"),
                         (lambda: Releases(dp_shares=(0.0,)), r"^Releases.dp_shares: noise multipliers > 0"),
                         (lambda: Releases(metric_policy="some"), r"^Releases.metric_policy: one of"),
                         (lambda: Supports(asynchronous=1), r"^Supports.asynchronous: True, a reason"),
                         (lambda: Supports(exact="yes"), r"^Supports.exact: true, false or None")):
        with pytest.raises(ValueError, match=message):
            bad()

    class Wrong(Component):
        declares = {"needs": "history"}

    with pytest.raises(ValueError, match=r"^Wrong.declares: a lfed.base.declaration.Declaration"):
        declaration(Wrong())


def test_what_the_built_ins_declare_is_read_through_one_accessor():
    assert declaration(Component()) == Declaration()
    assert declaration(Scaffold()).releases.values and declaration(Scaffold()).releases.dp_shares == ()
    dp_scaffold = declaration(Scaffold(control_clip=1.0, control_noise=2.0))  # a property: depends on the settings
    assert dp_scaffold.releases.values == () and dp_scaffold.releases.dp_shares == (2.0,)
    from lfed.server.combination import IGFLAttention

    assert declaration(IGFLAttention("time")).needs.history and not declaration(IGFLAttention("self")).needs.history


def test_a_declared_need_is_what_the_round_reads():
    class Reads(Mean):
        declares = Declaration(needs=Needs(history=True))

    alg = Algorithm(objective=ClientRule(), weighting=SizeWeights(), combination=Reads(), channel=Dense(),
                    sampler=UniformSampler(), participation=Participation(1.0))
    assert alg.history is not None  # made because a component declares Needs(history=True)
    alg = Algorithm(objective=ClientRule(), weighting=SizeWeights(), combination=Mean(), channel=Dense(),
                    sampler=UniformSampler(), participation=Participation(1.0))
    assert alg.history is None


START_LOSS_NEW = Declaration(needs=Needs(start_loss=True))


class LossWeightedNew(ServerCombination):
    declares = START_LOSS_NEW

    def combine(self, updates, weights, cohort):
        F = cohort.start_loss[cohort.counting].to(updates.dtype)
        return (F[:, None] * updates[cohort.counting]).sum(0) / F.sum(), None


class LossWeightedOld(ServerCombination):
    needs_start_loss = True  # lfed 0.5's flag

    def combine(self, updates, weights, cohort):
        F = cohort.start_loss[cohort.counting].to(updates.dtype)
        return (F[:, None] * updates[cohort.counting]).sum(0) / F.sum(), None


def test_the_new_and_the_old_spelling_of_a_need_train_alike_and_only_the_old_one_warns():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        new = toy_module("plain", "vmap", combination=LossWeightedNew())
        run_rounds(new, toy_data(), rounds=2)
    assert future_warnings(record) == []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        old = toy_module("plain", "vmap", combination=LossWeightedOld())
        run_rounds(old, toy_data(), rounds=2)
        assert declaration(LossWeightedOld()).needs == START_LOSS_NEW.needs  # read into the same declaration
    said = future_warnings(record)
    assert said == ["LossWeightedOld.needs_start_loss: lfed 0.5's flag, deprecated in 0.6: declare it as "
                    "declares = Declaration(needs=Needs(start_loss=True)) (docs/extending.md)"]  # once, for the class
    assert torch.equal(flat_weights(new), flat_weights(old))


def test_every_old_flag_is_read_into_its_part_of_the_declaration():
    class Old(Component):
        uses_history = True
        personalized = True
        releases = ("what it sends",)
        dp_shares = (3.0,)
        releases_every_round = True
        private_metrics = ("mine/*",)
        metric_policy = "drop"
        poisson = True
        equal_weights = True
        exact = True

    with pytest.warns(FutureWarning) as record:
        d = declaration(Old())
    assert d == Declaration(releases=Releases(values=("what it sends",), dp_shares=(3.0,), every_round=True,
                                              private_metrics=("mine/*",), metric_policy="drop"),
                            needs=Needs(history=True),
                            supports=Supports(personalized=True, poisson=True, equal_weights=True, exact=True))
    (message,) = [str(w.message) for w in record]
    for flag, new in (("uses_history", "Declaration(needs=Needs(history=True))"),
                      ("releases", "Declaration(releases=Releases(values=(...)))"),
                      ("metric_policy", "Declaration(releases=Releases(metric_policy='drop'))"),
                      ("exact", "Declaration(supports=Supports(exact=True))")):
        assert f"Old.{flag}: lfed 0.5's flag, deprecated in 0.6: declare it as declares = {new}" in message

    class Instance(Mean):  # a flag set on the instance (0.5's time attention did)
        def __init__(self):
            super().__init__()
            self.uses_history = True

    with pytest.warns(FutureWarning, match="Instance.uses_history"):
        assert declaration(Instance()).needs.history


# ------------------------------------------------------------------------------- the one check
def _context(**kw) -> CompositionContext:
    return CompositionContext(frozenset(), **kw)


def test_one_check_per_component_in_order_each_once_its_warnings_returned():
    seen = []

    class A(Component):
        def check(self, context):
            seen.append(("A", context.data))
            return ["a warns"]

    class B(Component):
        def check(self, context):
            seen.append(("B", context.data))
            return []

    a, b = A(), B()
    assert check_components([a, b, a], _context(data="the data")) == ["a warns"]
    assert seen == [("A", "the data"), ("B", "the data")]

    class Refuses(Component):
        def check(self, context):
            raise ValueError("mine: not with that")

    with pytest.raises(ValueError, match="^mine: not with that$"):
        check_components([Refuses(), a], _context())
    assert len(seen) == 2  # the first refusal stops the checks

    class Wrong(Component):
        def check(self, context):
            return "one string"

    with pytest.raises(ValueError, match=r"^Wrong.check: must return a list of warnings \(strings\)"):
        check_components([Wrong()], _context())


def test_the_old_hooks_still_run_in_0_5s_order_with_one_warning_per_class():
    calls = []

    class Old(Component):
        def check_start(self, data):
            calls.append(("check_start", data))

        def prepare_run(self, context):
            calls.append(("prepare_run", context.num_clients))

        def composition_warnings(self, context):
            calls.append(("composition_warnings", None))
            return ["old warns"]

    with pytest.warns(FutureWarning) as record:
        assert check_components([Old()], _context(data="d", num_clients=7)) == ["old warns"]
        assert check_components([Old()], _context(num_clients=3)) == ["old warns"]  # no data: no check_start
    assert calls == [("check_start", "d"), ("prepare_run", 7), ("composition_warnings", None),
                     ("prepare_run", 3), ("composition_warnings", None)]
    (message,) = [str(w.message) for w in record]
    assert message.startswith("Old.check_start: lfed 0.5's check hook, deprecated in 0.6: write check(self, context), "
                              "the data as context.data; Old.prepare_run: ")
    assert "Old.composition_warnings: lfed 0.5's check hook, deprecated in 0.6: write check(self, context), returning " \
           "the warnings" in message

    class OldRefuses(Component):
        def prepare_run(self, context):
            raise ValueError("old: refused")

    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="^old: refused$"):
        check_components([OldRefuses()], _context())


def test_a_run_checks_each_component_once_before_round_0_through_validate_composition():
    from lfed.server.weighting import UniformWeights

    class Counted(Mean):
        declares = Declaration(supports=Supports(asynchronous=True))
        checks = 0

        def check(self, context):
            type(self).checks += 1
            assert context.data is not None and context.num_clients == 3
            return ["counted: checked"]

    m = toy_module("plain", "vmap", combination=Counted(), weighting=UniformWeights())
    with pytest.warns(registry.CompositionWarning, match="counted: checked"):
        run_rounds(m, toy_data(), rounds=2)
    assert Counted.checks == 1


# ------------------------------------------------------------------------------- asynchronous, old and new
def test_the_old_asynchronous_spellings_still_decide_with_a_warning():
    class Ready(Component):
        asynchronous_ready = True

    class ReadyChild(Ready):
        pass

    class Unready(Component):
        asynchronous_unready = "is mine and not ready"

    class Says(Component):
        def asynchronous_refusal(self, schedule):
            return f"not under {type(schedule).__name__}"

    schedule = FedBuff(concurrency=2, buffer=1)
    with pytest.warns(FutureWarning):
        assert asynchronous_refusal(Ready(), schedule) is None
        assert declaration(Ready()).supports.asynchronous is True
    with pytest.warns(FutureWarning):
        assert asynchronous_refusal(ReadyChild(), schedule) == "ReadyChild is not defined asynchronously yet"
    with pytest.warns(FutureWarning, match="Unready.asynchronous_unready"):
        assert asynchronous_refusal(Unready(), schedule) == "Unready is mine and not ready"
    with pytest.warns(FutureWarning, match="Says.asynchronous_refusal: lfed 0.5's check hook"):
        assert asynchronous_refusal(Says(), schedule) == "not under FedBuff"
    assert declared_refusal(Says()) == "Says is not defined asynchronously yet"


def test_no_built_in_component_spells_0_5s_flags_or_hooks():
    """Every component lfed ships declares through ``declares`` and checks through ``check`` (a flag left behind
    would be read with a warning, and one forgotten would be silently lost)."""
    import importlib
    import pkgutil

    import lfed
    from lfed.base.legacy import FLAGS, HOOKS

    found = []
    for info in pkgutil.walk_packages(lfed.__path__, "lfed."):
        if info.name.startswith("lfed.lightning") or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for cls in list(vars(module).values()):  # (not getattr: a package's lazy names are not its classes)
            if isinstance(cls, type) and cls.__module__ == module.__name__ and issubclass(cls, Component) \
                    and cls is not Component:
                found += [f"{cls.__module__}.{cls.__name__}.{n}" for n in (*FLAGS, *HOOKS) if n in cls.__dict__]
    assert found == []
