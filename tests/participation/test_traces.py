"""Availability and device speed from traces (issue 65; docs/traces.md): FedScale's trace files read and checked
(lfed.participation.traces), the clock's availability and durations from them (lfed.participation.clock), and a
synchronous run's cohorts drawn only among the clients online at its simulated time
(lfed.participation.availability.AvailableSampler), checked by hand on a tiny trace."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from torch import nn

from lfed.core.algorithm import LocalTraining
from lfed.core.fit import fit_run
from lfed.core.settings import build_run
from lfed.lightning.datamodule import FederatedDataModule
from lfed.participation.availability import AvailableSampler
from lfed.participation.clock import SimulatedClock, model_bits
from lfed.participation.traces import AvailabilityTrace, DeviceCapacity

F64 = torch.float64
D, CLASSES = 6, 3

#: The tiny trace, period 100 s: who is online when can be read off by eye. Nobody is online in [50, 60).
INTERVALS = {0: [(0, 30)], 1: [(10, 50), (70, 90)], 2: [(60, 100)], 3: [(0, 15), (60, 80)], 4: [(85, 95)]}
PERIOD = 100.0


def _write_trace(path, intervals=INTERVALS, period=PERIOD, keys=str):
    trace = {keys(c): {"active": [a for a, _ in iv], "inactive": [b for _, b in iv], "finish_time": period,
                       "duration": 1, "model": "ignored"} for c, iv in intervals.items()}
    if str(path).endswith(".json"):
        path.write_text(json.dumps(trace))
    else:
        path.write_bytes(pickle.dumps(trace))
    return str(path)


def _online_by_hand(t: float) -> set[int]:
    r = t % PERIOD
    return {c for c, iv in INTERVALS.items() if any(a <= r < b for a, b in iv)}


# ----------------------------------------------------------------------------- the files


def test_the_trace_says_who_is_online_and_when_the_next_interval_opens_by_hand(tmp_path):
    trace = AvailabilityTrace(_write_trace(tmp_path / "behave.json"))
    everyone = torch.arange(5)
    assert trace.ids == ["0", "1", "2", "3", "4"] and trace.num_clients == 5
    # t = 0: 0 and 3 online; 1 opens at 10, 2 at 60, 4 at 85
    assert trace.next_available(everyone, 0.0).tolist() == [0.0, 10.0, 60.0, 0.0, 85.0]
    # t = 50 (nobody online: 1 closed at 50, half-open): 0 reopens at 100, 1 at 70, 2 and 3 at 60, 4 at 85
    assert trace.next_available(everyone, 50.0).tolist() == [100.0, 70.0, 60.0, 60.0, 85.0]
    # t = 285 is 85 in the third period: 1, 2, 4 online; 0 and 3 open at 300 (0 in the next period)
    assert trace.next_available(everyone, 285.0).tolist() == [300.0, 285.0, 285.0, 300.0, 285.0]
    for t in [0.0, 5.0, 15.0, 29.0, 30.0, 49.0, 50.0, 59.5, 60.0, 79.0, 80.0, 85.0, 94.0, 99.0, 110.0, 1234.0]:
        assert set(torch.nonzero(trace.online(everyone, t)).flatten().tolist()) == _online_by_hand(t), t
    # lfed's clients 5..9 read the trace's 0..4 again (k mod M)
    assert trace.next_available(torch.arange(5, 10), 0.0).tolist() == [0.0, 10.0, 60.0, 0.0, 85.0]


def test_a_pickle_and_its_json_are_the_same_trace_and_ids_sort_as_numbers(tmp_path):
    as_json = AvailabilityTrace(_write_trace(tmp_path / "behave.json"))
    as_pickle = AvailabilityTrace(_write_trace(tmp_path / "client_behave_trace", keys=int))  # FedScale's: int keys, no suffix
    for name in ("starts", "ends", "offsets", "finish"):
        assert torch.equal(getattr(as_json, name), getattr(as_pickle, name)), name
    assert as_pickle.ids == [0, 1, 2, 3, 4]
    many = {str(i): {"active": [float(i)], "inactive": [i + 1.0], "finish_time": 20.0} for i in (10, 9, 2, 1)}
    (tmp_path / "ids.json").write_text(json.dumps(many))
    trace = AvailabilityTrace(tmp_path / "ids.json")
    assert trace.ids == ["1", "2", "9", "10"]  # as numbers, not as strings ("10" < "2")
    assert trace.next_available(torch.arange(4), 0.0).tolist() == [1.0, 2.0, 9.0, 10.0]


def test_device_durations_are_computation_times_examples_plus_the_model_both_ways_by_hand(tmp_path):
    (tmp_path / "device.json").write_text(json.dumps({"a": {"computation": 20.0, "communication": 500.0},
                                                      "b": {"computation": 5.0, "communication": 2000.0}}))
    clock = SimulatedClock("device", device_capacity=str(tmp_path / "device.json"))
    bits = model_bits(1000, torch.float32)
    assert bits == 32000.0
    # clients 0, 1, 2 (2 reads "a" again); 4 steps of batch 10 (client 1 has only 6 examples: 6 a step)
    d = clock.durations(torch.tensor([0, 1, 2]), torch.tensor([4, 4, 2]), 0, 0, 3,
                        num_examples=torch.tensor([50, 6, 50]), batch_size=10, bits=bits)
    want = [3 * 40 * 20.0 / 1000 + 2 * 32.0 / 500.0, 3 * 24 * 5.0 / 1000 + 2 * 32.0 / 2000.0,
            3 * 20 * 20.0 / 1000 + 2 * 32.0 / 500.0]
    assert d.tolist() == pytest.approx(want, rel=1e-15)
    full = clock.durations(torch.tensor([0]), torch.tensor([3]), 0, 0, 3, num_examples=torch.tensor([50]),
                           batch_size=None, bits=bits)  # full batch: n_k a step
    assert full.tolist() == pytest.approx([3 * 150 * 20.0 / 1000 + 2 * 32.0 / 500.0], rel=1e-15)
    with pytest.raises(ValueError, match="durations need num_examples and bits"):
        clock.durations(torch.tensor([0]), torch.tensor([3]), 0, 0, 3)


def _entry(**fields):
    return {"active": [0.0], "inactive": [5.0], "finish_time": 10.0, **fields}


@pytest.mark.parametrize("content, match", [
    ("[1, 2]", r"a trace is a non-empty dict \{client id: fields\}, got list"),
    ("{}", r"got dict \(empty\)"),
    ("{not json", r"not a JSON or pickle trace file \(JSONDecodeError"),
    (json.dumps({"7": {"active": [0.0], "finish_time": 10.0}}), r"client '7': missing field 'inactive'"),
    (json.dumps({"7": _entry(finish_time=0)}), r"client '7': finish_time .* must be > 0, got 0"),
    (json.dumps({"7": _entry(active=[0.0, 6.0], inactive=[5.0])}), r"client '7': active and inactive must have one "
                                                                    "entry per interval, got 2 and 1"),
    (json.dumps({"7": _entry(active=[4.0, 2.0], inactive=[5.0, 3.0])}), r"client '7': active\[1\] = 2 comes before "
                                                                         r"inactive\[0\] = 5: intervals must be sorted"),
    (json.dumps({"7": _entry(active=[4.0], inactive=[3.0])}), r"client '7': inactive\[0\] = 3 comes before active\[0\] = 4"),
    (json.dumps({"7": _entry(active=["soon"])}), r"client '7': active\[0\] must be a number, got 'soon'"),
    (json.dumps({"7": _entry(active=[12.0], inactive=[15.0])}), r"client '7': never online in its period \[0, 10\)"),
    (json.dumps({"7": _entry(inactive=5.0)}), r"client '7': inactive must be a list of numbers, got float"),
])
def test_a_bad_availability_trace_is_refused_in_one_line_naming_the_file_and_field(tmp_path, content, match):
    path = tmp_path / "behave.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=f"trace: {path}") as err:
        AvailabilityTrace(path)
    assert "\n" not in str(err.value)
    assert err.match(match)


@pytest.mark.parametrize("content, match", [
    ({"3": {"computation": 10.0}}, r"client '3': missing field 'communication'"),
    ({"3": {"computation": 10.0, "communication": 0}}, r"communication \(kilobits per second\) must be > 0, got 0"),
    ({"3": {"computation": -1, "communication": 10}}, r"computation \(milliseconds per example\) must be >= 0, got -1"),
    ({"3": {"computation": float("nan"), "communication": 10}}, r"computation must be finite, got nan"),
])
def test_a_bad_device_trace_is_refused_in_one_line(tmp_path, content, match):
    path = tmp_path / "device.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=f"device_capacity: {path}: .*{match}") as err:
        DeviceCapacity(path)
    assert "\n" not in str(err.value)


class _Payload:
    def __reduce__(self):
        return (print, ("executed",))


def test_a_pickle_that_holds_code_is_refused_not_run(tmp_path, capsys):
    path = tmp_path / "behave.pkl"
    path.write_bytes(pickle.dumps({"1": _Payload()}))
    with pytest.raises(ValueError, match=r"trace: .*behave.pkl holds a Python object \(builtins.print\); lfed reads a "
                                         "pickle of plain dicts, lists and numbers"):
        AvailabilityTrace(path)
    assert "executed" not in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"trace: '.*none.json' is not a file"):
        AvailabilityTrace(tmp_path / "none.json")


def test_the_clock_refuses_a_trace_with_periodic_windows_and_device_without_its_file(tmp_path):
    with pytest.raises(ValueError, match="trace: availability comes from the trace .* not both"):
        SimulatedClock(trace="t.json", availability_period=10.0)
    with pytest.raises(ValueError, match="device_capacity: give it exactly when distribution='device'"):
        SimulatedClock("device")
    with pytest.raises(ValueError, match="device_capacity: give it exactly when distribution='device'"):
        SimulatedClock("constant", device_capacity="d.json")
    clock = SimulatedClock("constant")
    assert "trace" not in clock.hparams()  # a run made before traces keeps its fingerprint
    assert SimulatedClock("constant", trace=_write_trace(tmp_path / "b.json")).windows


# ----------------------------------------------------------------------------- a synchronous run on the trace


def _datamodule(num_clients=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(80, D, generator=g, dtype=F64)
    y = torch.randint(0, CLASSES, (80,), generator=g)
    return FederatedDataModule.from_tensors(x, y, x[:10], y[:10], num_clients=num_clients, partition="iid")


def _net():
    torch.manual_seed(0)
    return nn.Linear(D, CLASSES).double()


def _recording(sampler):
    """Each round's (round, simulated time at its draw, cohort), read from the sampler's own draws."""
    drawn = []
    sample = sampler.sample

    def recorded(round, k, generator):
        ids, p = sample(round, k, generator)
        drawn.append((round, sampler.now, ids.tolist()))
        return ids, p

    sampler.sample = recorded
    return drawn


def _trace_run(tmp_path, fraction, time_per_step=12.5, seed=0):
    clock = SimulatedClock("constant", time_per_step=time_per_step, trace=_write_trace(tmp_path / "behave.json"))
    sampler = AvailableSampler(clock)
    run = build_run(net=_net(), sampler=sampler, fraction=fraction, seed=seed,
                    training=LocalTraining(client_lr=0.1, batch_size=8, local_steps=2))
    return run, sampler, _recording(sampler)


def test_each_round_draws_only_the_clients_online_at_its_time_by_hand(tmp_path):
    """K = 3 of 5 clients, every round 25 simulated s (2 steps x 12.5): at 0 only 0 and 3 are online (all taken, said
    once); at 25, 0 and 1; at 50 nobody, so the server waits until 60, when 2 and 3 come online; at 85, 1, 2, 4; at
    110 (10 in the period), 0, 1, 3."""
    run, sampler, drawn = _trace_run(tmp_path, fraction=0.6)
    with pytest.warns(UserWarning, match="sampler: round 0: 2 of the 5 clients are online at simulated time 0, fewer "
                                         "than the cohort of 3: the round takes all 2"):
        history = fit_run(run, _datamodule(), 5)
    assert drawn == [(0, 0.0, [0, 3]), (1, 25.0, [0, 1]), (2, 60.0, [2, 3]), (3, 85.0, [1, 2, 4]),
                     (4, 110.0, [0, 1, 3])]
    assert [h["clock/time"] for h in history] == [25.0, 50.0, 85.0, 110.0, 135.0]
    assert [h["clock/wait"] for h in history] == [0.0, 0.0, 10.0, 0.0, 0.0]
    assert [h["round/available"] for h in history] == [2.0, 2.0, 2.0, 3.0, 3.0]
    assert [h["round/clients"] for h in history] == [2.0, 2.0, 2.0, 3.0, 3.0]
    assert all(h["clock/round_duration"] == 25.0 for h in history)
    from lfed.engine.ranks import Ranks

    evaluated, _ = run.evaluate(Ranks(), lambda t: t)
    assert "test/acc" in evaluated and evaluated["clock/time"] == 135.0  # an evaluation carries the simulated time


def test_a_smaller_cohort_is_drawn_uniformly_among_the_online_clients_only(tmp_path):
    """K = 2: every cohort is two of the clients online at its time (read off the trace by hand), and over seeds
    every pair of the online clients is drawn."""
    pairs: dict[int, set] = {3: set(), 4: set()}
    for seed in range(16):
        run, sampler, drawn = _trace_run(tmp_path, fraction=0.4, seed=seed)
        fit_run(run, _datamodule(), 5)
        assert [t for _, t, _ in drawn] == [0.0, 25.0, 60.0, 85.0, 110.0]
        for r, t, ids in drawn:
            assert len(ids) == 2 and set(ids) <= _online_by_hand(t) and ids == sorted(ids), (seed, r, t, ids)
            if r in pairs:
                pairs[r].add(tuple(ids))
    assert pairs[3] == {(1, 2), (1, 4), (2, 4)} and pairs[4] == {(0, 1), (0, 3), (1, 3)}


def test_the_round_lasts_as_long_as_its_slowest_client_on_the_device_trace(tmp_path):
    """distribution: device: each round's duration is its slowest member's 3 x examples x ms / 1000 + 2 x the model's
    bits / 1000 / kbps, by hand; the next round starts then."""
    speeds = {str(c): {"computation": 4.0 + 3 * c, "communication": 100.0 * (c + 1)} for c in range(5)}
    (tmp_path / "device.json").write_text(json.dumps(speeds))
    clock = SimulatedClock("device", device_capacity=str(tmp_path / "device.json"))  # always online
    sampler = AvailableSampler(clock)
    drawn = _recording(sampler)
    run = build_run(net=_net(), sampler=sampler, fraction=0.4, seed=1,
                    training=LocalTraining(client_lr=0.1, batch_size=8, local_steps=2))
    history = fit_run(run, _datamodule(), 3)
    bits = (D * CLASSES + CLASSES) * 64  # float64
    sizes = run.data.host("client_sizes").tolist()
    t = 0.0
    for (_, start, ids), h in zip(drawn, history):
        assert start == t
        d = max(3 * 2 * min(8, sizes[c]) * speeds[str(c)]["computation"] / 1000
                + 2 * bits / 1000 / speeds[str(c)]["communication"] for c in ids)
        assert h["clock/round_duration"] == pytest.approx(d, rel=1e-14)
        t = t + h["clock/round_duration"]
        assert h["clock/time"] == t


def test_periodic_windows_on_the_synchronous_schedule_read_the_runs_seed(tmp_path):
    """availability_period: the phases of the asynchronous schedule's windows, drawn from the run's seed (which the
    sampler learns before round 0): every cohort is online at its time."""
    from lfed.rng import round_generator

    seed = 4
    clock = SimulatedClock("constant", time_per_step=3.0, availability_period=20.0, availability_fraction=0.3)
    sampler = AvailableSampler(clock)
    drawn = _recording(sampler)
    run = build_run(net=_net(), sampler=sampler, fraction=0.4, seed=seed,
                    training=LocalTraining(client_lr=0.1, batch_size=8, local_steps=2))
    fit_run(run, _datamodule(), 6)
    phases = 20.0 * torch.rand(5, generator=round_generator(seed, 0, "clock_window"), dtype=F64)
    for _, t, ids in drawn:
        for c in ids:
            r = (t - phases[c].item()) % 20.0  # in its window (a window just opened may read as 20 - 1e-15)
            assert r < 0.3 * 20.0 or r > 20.0 - 1e-9, (t, c, r)
    assert len({t for _, t, _ in drawn}) == 6


def test_fit_run_in_two_calls_equals_one_and_the_time_is_in_the_state_dict(tmp_path):
    whole, _, drawn_whole = _trace_run(tmp_path, fraction=0.4, seed=3)
    fit_run(whole, _datamodule(), 6)
    parts, sampler, drawn_parts = _trace_run(tmp_path, fraction=0.4, seed=3)
    fit_run(parts, _datamodule(), 2)
    assert sampler.state_dict()["clock._extra_state"] == {"now": 50.0}
    fit_run(parts, _datamodule(), 4)
    assert drawn_parts == drawn_whole
    assert torch.equal(whole.layout.module_vector(whole.net), parts.layout.module_vector(parts.net))


def test_a_bad_trace_stops_a_run_before_round_0_in_one_line(tmp_path):
    path = tmp_path / "behave.json"
    path.write_text(json.dumps({"1": _entry(inactive=[5.0, 6.0])}))
    run = build_run(net=_net(), sampler=AvailableSampler(SimulatedClock("constant", trace=str(path))), fraction=0.4,
                    training=LocalTraining(client_lr=0.1, batch_size=8, local_steps=2))
    with pytest.raises(ValueError, match=r"^trace: .*behave.json: client '1': active and inactive must have one entry "
                                         r"per interval, got 1 and 2$"):
        fit_run(run, _datamodule(), 1)


def test_the_shipped_synthetic_trace_is_its_scripts_output_and_reads():
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("make_synthetic_trace", REPO / "scripts" / "make_synthetic_trace.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    behave, device = script.make()
    assert (REPO / "configs" / "traces" / "synthetic_behave.json").read_text() == script.dumps(behave)
    assert (REPO / "configs" / "traces" / "synthetic_device.json").read_text() == script.dumps(device)
    trace = AvailabilityTrace(REPO / "configs" / "traces" / "synthetic_behave.json")
    device = DeviceCapacity(REPO / "configs" / "traces" / "synthetic_device.json")
    assert trace.num_clients == device.num_clients >= 24
    online = trace.online(torch.arange(trace.num_clients), 0.0)
    assert 0 < int(online.sum()) < trace.num_clients  # some clients online at 0, not all


# ----------------------------------------------------------------------------- stopped and resumed under lfed fit


#: a trace for digits' 10 clients: 6 trace clients (lfed's 6..9 read 0..3 again), period 100 s; rounds of 10-45 s
def _digits_trace(tmp_path):
    intervals = {0: [(0, 30)], 1: [(10, 50), (70, 90)], 2: [(25, 85)], 3: [(0, 15), (50, 80)], 4: [(35, 100)], 5: [(60, 95)]}
    trace = {str(c): {"active": [a for a, _ in iv], "inactive": [b for _, b in iv], "finish_time": 100.0}
             for c, iv in intervals.items()}
    speeds = {str(c): {"computation": 100.0 + 80 * c, "communication": 300.0 + 250 * c} for c in range(6)}
    (tmp_path / "behave.json").write_text(json.dumps(trace))
    (tmp_path / "device.json").write_text(json.dumps(speeds))
    return {"class_path": "lfed.participation.availability.AvailableSampler", "init_args": {"clock": {
        "class_path": "lfed.participation.clock.SimulatedClock",
        "init_args": {"distribution": "device", "trace": str(tmp_path / "behave.json"),
                      "device_capacity": str(tmp_path / "device.json")}}}}


@pytest.mark.bitlevel
def test_a_synchronous_trace_run_resumed_from_a_middle_checkpoint_is_bit_identical(tmp_path):
    """FedAvg on digits, 3 of 10 clients a round drawn among those online on the trace, rounds as long as their slowest
    client on the device trace: stopped at round 3, resumed from its checkpoint, it ends as the uninterrupted run
    (weights, optimizer, evaluations, and the simulated time)."""
    from test_checkpoint import assert_same_state, fit, load, run_state, write_config

    sampler = _digits_trace(tmp_path)
    keep_all = {"callbacks": [{"class_path": "lfed.lightning.checkpoint.RoundCheckpoint",
                               "init_args": {"dirpath": str(tmp_path / "ckpts"), "every_n_train_steps": 3, "save_top_k": -1}}]}
    config = write_config(tmp_path / "cfg.yaml", "fedavg", trainer=keep_all, sampler=sampler)

    def state(cli):
        out = run_state(cli)
        out["now"] = cli.model.runs[0].components.sampler.now
        return out

    want = state(fit(config))
    middle = load(tmp_path / "ckpts" / "epoch=0-step=3.ckpt")
    [key] = [k for k in middle["state_dict"] if k.endswith("sampler.clock._extra_state")]
    assert 0 < middle["state_dict"][key]["now"] < want["now"]
    got = state(fit(config, "--ckpt_path", str(tmp_path / "ckpts" / "epoch=0-step=3.ckpt")))
    assert got["now"] == want["now"] and want["global_step"] == 6
    assert_same_state(got, want)


@pytest.mark.parametrize("num_clients", [3, 5, 13, 25])
def test_the_online_set_read_from_the_trace_rows_is_the_clients_one_by_one(tmp_path, num_clients):
    """Client k follows row k mod M: the online set made from the M rows (O(M) a round, lfed.participation.availability.
    Online) is the set of the N clients each asked one by one (lfed 0.6's first reading, O(N)), in the same ascending
    order, so the same draws pick the same clients; also when nobody is online and the server waits, and N < M."""
    from lfed.participation.availability import Online

    clock = SimulatedClock("constant", trace=_write_trace(tmp_path / "behave.json"))
    sampler = AvailableSampler(clock)
    sampler.num_clients, sampler.seed = num_clients, 0
    everyone = torch.arange(num_clients)
    for now in [0.0, 7.5, 25.0, 50.0, 55.0, 60.0, 85.0, 99.0, 110.0, 233.0]:
        clock.now = now
        opens = clock.next_available(everyone, now, 0, num_clients)
        t = float(opens.min())
        want = torch.nonzero(opens == t).flatten()  # every client asked
        online, got_t = sampler.online()
        assert isinstance(online, Online) and got_t == t and online.size == want.numel()
        assert torch.equal(online.select(torch.arange(online.size)), want)
        p = online.distribution()
        assert p.shape == (num_clients,) and torch.equal(p.nonzero().flatten(), want)
        assert torch.allclose(p[want], torch.full((want.numel(),), 1.0 / want.numel(), dtype=torch.float64))
        assert set(want.tolist()) == {k for k in range(num_clients) if k % 5 in _online_by_hand(t)}  # by hand
