"""benchmarks/harness.py on a fake machine: a clock that moves only when told, a load that falls as it sleeps.

No real time is measured: every figure below is what the fake clock was moved by, so each assertion is exact.
"""

from __future__ import annotations

import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import harness  # noqa: E402


class Machine:
    """A clock (seconds since 0), a 1-minute load read from ``loads`` (the last one stays), and a sleep that moves
    the clock; ``work(s)`` is a call that takes ``s`` seconds."""

    def __init__(self, loads=(0.5,)) -> None:
        self.now = 0.0
        self.loads = list(loads)
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def load(self) -> float:
        return self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def work(self, s: float, result=None):
        def call():
            self.now += s
            return result

        return call


@pytest.fixture
def machine(monkeypatch):
    m = Machine()
    monkeypatch.setattr(harness, "clock", m.clock)
    monkeypatch.setattr(harness, "loadavg", m.load)
    monkeypatch.setattr(harness, "sleep", m.sleep)
    monkeypatch.delenv("QUIET_LOAD", raising=False)
    monkeypatch.delenv("QUIET_WAIT", raising=False)
    return m


def test_wait_quiet_sleeps_until_the_load_falls_below_the_limit(machine):
    machine.loads = [2.0, 1.5, 1.0, 0.7, 0.3]
    load, waited = harness.wait_quiet(poll=5.0)
    assert load == 0.7 and waited == 15.0 and machine.slept == [5.0, 5.0, 5.0]  # 1.0 is not below 1.0


def test_wait_quiet_gives_up_after_max_wait_and_returns_the_high_load(machine):
    machine.loads = [3.0]
    assert harness.wait_quiet(max_wait=12, poll=5.0) == (3.0, 15.0)


def test_quiet_wait_zero_in_the_environment_never_waits(machine, monkeypatch):
    monkeypatch.setenv("QUIET_WAIT", "0")
    machine.loads = [4.0]
    assert harness.wait_quiet() == (4.0, 0.0) and machine.slept == []
    monkeypatch.setenv("QUIET_LOAD", "5")  # the limit from the environment too
    monkeypatch.setenv("QUIET_WAIT", "600")
    assert harness.wait_quiet() == (4.0, 0.0)


def test_interleave_alternates_the_variants_after_their_warm_up_and_keeps_each_runs_load(machine):
    calls = []

    def variant(name, seconds):
        def call():
            calls.append(name)
            machine.now += seconds
            return name.lower()

        return call

    machine.loads = [0.9, 0.8, 0.7, 0.6]
    seen = []
    runs = harness.interleave({"A": variant("A", 1.0), "B": variant("B", 3.0)}, repeats=2, warmup=1,
                              log=lambda *a: seen.append(a))
    assert calls == ["A", "B", "A", "B", "A", "B"]  # the warm-up of each, then A B A B
    assert runs["A"].samples == [1.0, 1.0] and runs["B"].samples == [3.0, 3.0]
    assert runs["A"].loads == [0.9, 0.7] and runs["B"].loads == [0.8, 0.6]
    assert runs["A"].results == ["a", "a"]
    assert seen == [("A", 0, 1.0, 0.9, "a"), ("B", 0, 3.0, 0.8, "b"), ("A", 1, 1.0, 0.7, "a"), ("B", 1, 3.0, 0.6, "b")]


def test_interleave_waits_for_a_quiet_machine_before_every_timed_run_not_inside_it(machine):
    machine.loads = [1.5, 0.5, 1.2, 0.4]
    runs = harness.interleave({"A": machine.work(2.0), "B": machine.work(4.0)}, repeats=1)
    assert runs["A"].samples == [2.0] and runs["B"].samples == [4.0]  # the waits are not in the figures
    assert runs["A"].loads == [0.5] and runs["B"].loads == [0.4]
    assert runs["A"].waits == [5.0] and runs["B"].waits == [5.0] and machine.slept == [5.0, 5.0]
    machine.loads = [3.0]
    runs = harness.interleave({"A": machine.work(1.0)}, repeats=2, quiet=False)  # no waiting: the load is only read
    assert runs["A"].loads == [3.0, 3.0] and machine.slept == [5.0, 5.0]


@pytest.mark.parametrize(("order", "expected"), [
    ("same", ["A", "B", "C", "A", "B", "C", "A", "B", "C"]),
    ("flip", ["A", "B", "C", "C", "B", "A", "A", "B", "C"]),
    ("rotate", ["A", "B", "C", "B", "C", "A", "C", "A", "B"]),
])
def test_the_orders_of_interleaving(machine, order, expected):
    calls = []
    harness.interleave({n: (lambda n=n: calls.append(n)) for n in "ABC"}, repeats=3, order=order)
    assert calls == expected


def test_an_unknown_order_is_refused_before_any_work(machine):
    calls = []
    with pytest.raises(ValueError, match="order"):
        harness.interleave({"A": lambda: calls.append(1)}, repeats=1, warmup=1, order="random")
    assert calls == []


def test_a_variant_that_times_itself_gives_its_own_figure(machine):
    steady = iter([0.25, 0.5, 0.125])
    t = harness.measure(lambda: {"steady": next(steady)}, repeats=3, figure=lambda r: r["steady"])
    assert t.samples == [0.25, 0.5, 0.125]
    assert t.median == 0.25 and t.min == 0.125 and t.max == 0.5


def test_sync_runs_before_and_after_each_timed_call(machine):
    events = []

    def call():
        events.append("call")
        machine.now += 1.0

    t = harness.measure(call, repeats=2, sync=lambda: events.append("sync"))
    assert events == ["sync", "call", "sync"] * 2 and t.samples == [1.0, 1.0]


def test_timing_reports_medians_the_runs_and_the_load_range():
    t = harness.Timing()
    for s, load in [(0.3, 0.91), (0.1, 0.52), (0.2, 0.75)]:
        t.add(s, load)
    assert (t.median, t.min, t.max) == (0.2, 0.1, 0.3)
    assert t.runs() == "0.300 @ 0.91, 0.100 @ 0.52, 0.200 @ 0.75"
    assert t.load_range() == "0.52-0.91"
    assert harness.load_range([0.5, 0.501]) == "0.50" and harness.load_range([]) == "-"


def test_stopwatch_measures_with_the_harness_clock(machine):
    with harness.stopwatch() as sw:
        machine.now += 2.5
        assert sw.elapsed() == 2.5
        machine.now += 1.0
    assert sw.seconds == 3.5


def test_table_rows_format_floats_ints_and_text():
    assert harness.row(["MLP", 0.12345, 199210, None, True]) == "| MLP | 0.123 | 199,210 | - | True |"
    assert harness.table(["a", "b"], [[1.0, "x"]], digits=2) == "| a | b |\n|---|---|\n| 1.00 | x |"


def test_a_command_runs_and_its_result_line_is_read():
    out = harness.python(["-c", "import json; print('noise'); print('RESULT ' + json.dumps({'s': 1.5}))"])()
    assert harness.result_line(out) == {"s": 1.5}
    with pytest.raises(RuntimeError, match="exit 3"):
        harness.python(["-c", "import sys; sys.exit(3)"])()
    with pytest.raises(RuntimeError, match="no RESULT line"):
        harness.result_line("nothing here")


def test_print_result_is_what_result_line_reads(capsys):
    harness.print_result({"round_s": [0.1, 0.2]})
    assert harness.result_line(capsys.readouterr().out) == {"round_s": [0.1, 0.2]}


def test_the_shared_flags():
    p = harness.parser("A benchmark.\n\nMore.", repeats=3, out=None, out_flags=("--out", "--json"))
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args([])
    assert (a.repeats, a.quick, a.out, a.rounds) == (3, False, None, 5)
    a = p.parse_args(["--repeats", "1", "--quick", "--json", "x.json"])
    assert (a.repeats, a.quick, a.out) == (1, True, "x.json")  # --json is --out's other spelling
    assert harness.parser("x", out="table.md").parse_args([]).out == "table.md"
    bare = harness.parser("x").parse_args([])
    assert vars(bare) == {"quick": False}  # no --repeats or --out unless asked for


def test_the_step_clock_times_each_training_step_and_stops_at_its_cap(machine):
    pytest.importorskip("lightning")

    class Trainer:
        should_stop = False

    trainer = Trainer()
    c = harness.step_clock(cap_s=10.0, skip=1)
    for seconds in (9.0, 2.0, 3.0, 6.0):
        c.on_train_batch_start(trainer, None, None, 0)
        machine.now += seconds
        c.on_train_batch_end(trainer, None, None, None, 0)
        assert trainer.should_stop == (seconds == 6.0)  # 2 + 3 + 6 > 10 after 3 timed steps; the first is not counted
    assert c.seconds == [9.0, 2.0, 3.0, 6.0] and c.steady() == 3.0
    c.on_validation_start(trainer, None)
    machine.now += 1.5
    c.on_validation_end(trainer, None)
    assert c.evals == [1.5] and c.seconds == [9.0, 2.0, 3.0, 6.0]  # an evaluation is not a step
