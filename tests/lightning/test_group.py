"""Many runs, one engine (lfed.lightning.group, lfed grid): every member equals the same run trained alone.

"Alone" is ``lfed fit``'s own path: the LightningCLI parser of :mod:`lfed.lightning.cli`, then
``Trainer.fit`` of the FederatedModule (float64 on the CPU). Bit for bit needs one intra-op
thread (several threads may split a batched product of many rows differently from one of few;
lfed.lightning.group's docstring), so these tests run with one.
"""

import functools

import pytest
import torch
from conftest import REPO
from lightning.pytorch import Callback

from lfed.engine import CohortTrainer, StepRule, batch_schedule
from lfed.lightning.cli import LfedCLI
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.grid import build_members, run_grid, train_group
from lfed.lightning.group import GroupMember, concat_rules, rule_signature, stack_schedules
from lfed.lightning.module import FederatedModule
from lfed.lightning.sweep import Sweep, load_sweep
from lfed.models.zoo import MLP

F64 = ["--trainer.precision=64-true", "--trainer.accelerator=cpu"]


pytestmark = pytest.mark.usefixtures("one_thread")  # bit for bit needs one intra-op thread


def config(name):
    return str(REPO / "configs" / name)


def alone(configs, point, overrides, tmp_path):
    """The run of ``point`` trained by itself, as ``lfed fit`` trains it; its final flat weights."""
    args = [a for c in configs for a in ("--config", c)] + [f"--{k}={v}" for k, v in point.items()] + overrides + [
        "--trainer.logger=false", "--trainer.enable_progress_bar=false", "--checkpoint_every=0",
        f"--trainer.default_root_dir={tmp_path}"]
    cli = LfedCLI(FederatedModule, FederatedDataModule, run=False, args=args, save_config_callback=None)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli.model.layout.module_vector(cli.model.net).detach(), cli.model


def grouped(configs, parameters, overrides, root=None, **kwargs):
    """The grid trained as one RunGroup under a plain Trainer (lfed.lightning.grid.train_group)."""
    members, trainer = build_members(configs, Sweep("t", parameters), overrides)
    group, _ = train_group(members, rounds=trainer["max_steps"], evaluate_every=trainer["val_check_interval"],
                           precision=trainer["precision"], default_root_dir=root, **kwargs)
    return group


def assert_members_equal_alone(configs, parameters, overrides, tmp_path, merged_calls_per_round=None):
    group = grouped(configs, parameters, overrides, tmp_path / "group")
    for m in group.members:
        assert m.status == "done", (m.name, m.error)
        w_alone, module = alone(configs, m.params, overrides, tmp_path)
        w = m.run.layout.module_vector(m.run.net).detach()
        assert w.dtype == torch.float64
        assert torch.equal(w, w_alone), (m.name, (w - w_alone).abs().max())
        assert m.run.eval_history == module.eval_history, m.name
        assert m.run.val_history == module.val_history, m.name
        assert m.run.comm.uploads == module.comm.uploads
        assert m.summary == module.final_summary, m.name
        for key in ("final/test_acc_last10pct", "final/val_acc_last10pct"):
            assert m.summary.get(key) == module.final_summary.get(key), (m.name, key)
    if merged_calls_per_round is not None:  # the rows really were trained together
        assert group.engine_calls == merged_calls_per_round * group.members[0].round
    return group


ROUNDS = ["--trainer.max_steps=4", "--trainer.val_check_interval=2", *F64]


@pytest.mark.bitlevel
@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_fedavg_lr_and_seed_grid_equals_each_run_alone(backend, tmp_path):
    assert_members_equal_alone([config("quickstart.yaml")], {"model.training.client_lr": [0.05, 0.1], "model.seed": [0, 1]},
                               [*ROUNDS, f"--model.engine.backend={backend}"], tmp_path, merged_calls_per_round=1)


def test_members_with_a_validation_split_report_it_as_the_run_alone(tmp_path):
    """With data.validation_fraction > 0 a member evaluates the server's validation split as lfed fit does
    (val/acc every evaluation, final/val_acc_last10pct) and the table carries it, to choose on."""
    group = assert_members_equal_alone([config("quickstart.yaml")], {"model.training.client_lr": [0.05, 0.3]},
                                       [*ROUNDS, "--data.validation_fraction=0.2"], tmp_path, merged_calls_per_round=1)
    for m in group.members:
        assert [r for r, _ in m.run.val_history] == [2, 4]
        assert 0.0 < m.summary["final/val_acc_last10pct"] <= 1.0
    rows = group.table_rows()
    assert [r["val_last10pct_acc"] for r in rows] == [m.summary["final/val_acc_last10pct"] for m in group.members]
    assert "val_last10pct_acc" not in grouped([config("quickstart.yaml")], {"model.training.client_lr": [0.05]}, ROUNDS,
                                              tmp_path / "g2").table_rows()[0]


def test_scaffold_grid_equals_each_run_alone(tmp_path):
    assert_members_equal_alone([config("scaffold_digits.yaml")], {"model.training.client_lr": [0.05, 0.1]}, ROUNDS, tmp_path,
                               merged_calls_per_round=1)


def test_igfl_grid_equals_each_run_alone(tmp_path):
    assert_members_equal_alone([config("igfl_c_digits.yaml")], {"model.training.client_lr": [0.03, 0.1], "model.fraction": [0.25, 0.4]},
                               ROUNDS, tmp_path, merged_calls_per_round=1)


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_efl_with_stragglers_and_compression_equals_each_run_alone(backend, tmp_path):
    assert_members_equal_alone([config("efl_compressed_digits.yaml")],
                               {"model.training.client_lr": [0.05, 0.1], "model.objective.init_args.lam": [0.1, 0.3]},
                               [*ROUNDS, f"--model.engine.backend={backend}"], tmp_path, merged_calls_per_round=1)


def test_adafl_grid_equals_each_run_alone(tmp_path):
    assert_members_equal_alone([config("adafl_digits.yaml")], {"model.sampler.init_args.alpha": [0.5, 0.9], "model.training.client_lr": [0.05, 0.1]},
                               ["--trainer.max_steps=6", "--trainer.val_check_interval=3", *F64], tmp_path,
                               merged_calls_per_round=1)


def test_members_that_mix_algorithms_equal_each_run_alone(tmp_path):
    """FedAvg's and FedAdam's servers over plain, SCAFFOLD, IGFL-C and FedProx (two μ) clients in one group: one call
    per kind of step rule.

    Per round: the plain rules (2 runs) in one call, SCAFFOLD and IGFL-C (a shift; IGFL-C's gradient scale becomes
    rows; 4 runs) in one, and FedProx once per μ (a float decay; 2 runs each): 4 calls.
    """
    prox = [{"class_path": "lfed.client.objectives.Prox", "init_args": {"mu": mu}} for mu in (0.01, 0.1)]
    assert_members_equal_alone(
        [config("quickstart.yaml")],
        {"model.algorithm": ["fedavg", "fedadam"], "model.objective": ["plain", "scaffold", "igfl", *prox]}, ROUNDS, tmp_path,
        merged_calls_per_round=4)


def sweep_file(tmp_path, parameters):
    p = tmp_path / "s.yaml"
    p.write_text("name: lr\nmethod: grid\nparameters:\n" + "".join(f"  {k}:\n    values: {v}\n" for k, v in parameters.items()))
    return str(p)


def test_a_grid_refuses_a_logger_of_ones_own_instead_of_dropping_it(tmp_path, monkeypatch):
    """Issue 66 item 7: ``--trainer.logger`` was dropped without a word (every point is parsed with a logger off)."""
    sweep = sweep_file(tmp_path, {"model.training.client_lr": [0.05, 0.1]})
    for logger in (["--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", "logs"],
                   ["--trainer.logger.save_dir=logs"]):
        with pytest.raises(ValueError, match=r"grid: --trainer\.logger(\.save_dir)?: a grid logs each run itself"):
            run_grid(["--config", config("quickstart.yaml"), "--sweep", sweep, "--root", str(tmp_path), *logger])
    assert not (tmp_path / "grids").exists()
    from lfed.lightning import grid

    class Past(Exception):
        pass

    def past_the_checks(path):  # --trainer.logger false (what the grid sets itself) is no logger of one's own
        raise Past(path)

    monkeypatch.setattr(grid, "load_sweep", past_the_checks)
    with pytest.raises(Past):
        run_grid(["--config", config("quickstart.yaml"), "--sweep", sweep, "--root", str(tmp_path), "--trainer.logger", "false"])


def test_a_diverging_member_stops_alone(tmp_path):
    group, directory = run_grid(["--config", config("quickstart.yaml"), "--sweep",
                                 sweep_file(tmp_path, {"model.training.client_lr": [0.05, 1e300]}), "--root", str(tmp_path), *ROUNDS])
    ok, bad = group.members
    assert bad.status == "diverged" and "NaN or Inf" in bad.error and bad.round < 4
    assert ok.status == "done" and ok.round == 4
    w_alone, _ = alone([config("quickstart.yaml")], ok.params, ROUNDS, tmp_path)
    assert torch.equal(ok.run.layout.module_vector(ok.run.net).detach(), w_alone)
    summary = (directory / bad.name / "summary.json").read_text()
    assert '"status": "diverged"' in summary
    assert "run/diverged" in (directory / bad.name / "metrics.csv").read_text()


@pytest.mark.bitlevel
def test_group_killed_mid_run_resumes_from_its_ckpt_exactly(tmp_path):
    """A grid killed in round 3 (after the checkpoint of round 2) resumes with --ckpt_path last to the
    uninterrupted grid's results, per member, bit for bit."""
    params = {"model.training.client_lr": [0.05, 0.1]}
    common = ["--config", config("scaffold_digits.yaml"), "--trainer.max_steps=5", "--trainer.val_check_interval=2",
              "--data.validation_fraction=0.2", "--checkpoint_every=2", "--trainer.enable_progress_bar=false", *F64]
    (tmp_path / "w").mkdir()
    whole, _ = run_grid([*common, "--sweep", sweep_file(tmp_path / "w", params), "--root", str(tmp_path / "w")])
    kill = tmp_path / "k"
    kill.mkdir()
    sweep = sweep_file(kill, params)
    with pytest.raises(RuntimeError, match="killed in round 3"):
        run_grid([*common, "--sweep", sweep, "--root", str(kill),
                  '--trainer.callbacks+={"class_path": "resume_helpers.RaiseInRound", "init_args": {"round": 3}}'])
    with pytest.raises(ValueError, match="--ckpt_path last"):  # the same grid again: refused unless resumed
        run_grid([*common, "--sweep", sweep, "--root", str(kill)])
    resumed, directory = run_grid([*common, "--sweep", sweep, "--root", str(kill), "--ckpt_path", "last"])
    for a, b in zip(whole.members, resumed.members):
        assert b.status == "done" and b.round == 5
        assert torch.equal(a.run.layout.module_vector(a.run.net), b.run.layout.module_vector(b.run.net))
        assert torch.equal(a.run.objective.state("control"), b.run.objective.state("control"))
        assert a.run.eval_history == b.run.eval_history
        assert a.run.val_history == b.run.val_history and len(b.run.val_history) == 3
        assert a.summary == b.summary
        assert a.run.comm.uploads == b.run.comm.uploads
        rounds = [line.split(",")[0] for line in (directory / b.name / "metrics.csv").read_text().splitlines()[1:]]
        assert rounds.count("4") >= 1  # the resumed rounds were logged to the member's own metrics.csv


def test_lfed_grid_command_writes_each_run_and_the_table(tmp_path, capsys):
    sweep = sweep_file(tmp_path, {"model.training.client_lr": [0.05, 0.1]})
    group, directory = run_grid(["--config", config("quickstart.yaml"), "--sweep", sweep, "--root", str(tmp_path),
                                 "--trainer.max_steps=3", "--trainer.val_check_interval=3"])
    captured = capsys.readouterr()
    out = captured.out
    assert "last10pct_acc" in out and "00-client_lr=0.05" in out and "01-client_lr=0.1" in out
    assert "Round" in out and "3/3" in out  # lfed fit's round bar
    assert "Validation DataLoader" not in out + captured.err
    assert (directory / "checkpoints" / "last.ckpt").is_file()
    for m in group.members:
        assert (directory / m.name / "metrics.csv").is_file()
        assert (directory / m.name / "summary.json").is_file()
    assert (directory / "summary.csv").read_text().count("\n") == 3
    group, _ = run_grid(["--config", config("quickstart.yaml"), "--sweep", sweep, "--root", str(tmp_path),
                         "--trainer.max_steps=3", "--trainer.val_check_interval=3", "--ckpt_path", "last"])
    assert all(m.status == "done" and m.round == 3 for m in group.members)


def test_lfed_grid_builds_one_run_per_point_and_no_lightning_module(tmp_path, monkeypatch):
    """The grid builds runs (lfed.build_run), each point once, and its one driver is the group: no FederatedModule."""
    import lfed.lightning.grid
    from lfed.lightning.module import FederatedModule

    built = []
    real = lfed.lightning.grid.build_run
    monkeypatch.setattr(lfed.lightning.grid, "build_run", lambda **s: built.append(s["training"].client_lr) or real(**s))

    @functools.wraps(FederatedModule.__init__)  # the parser still reads the settings from its signature
    def no_module(self, *args, **kwargs):
        raise AssertionError("lfed grid built a FederatedModule")

    monkeypatch.setattr(FederatedModule, "__init__", no_module)
    sweep = sweep_file(tmp_path, {"model.training.client_lr": [0.05, 0.1, 0.2]})
    group, _ = run_grid(["--config", config("quickstart.yaml"), "--sweep", sweep, "--root", str(tmp_path),
                         "--trainer.max_steps=1", "--trainer.enable_progress_bar=false"])
    assert built == [0.05, 0.1, 0.2]
    assert [m.run for m in group.members] == list(group.runs)


class SeesEveryMember(Callback):
    """A user's callback: records, after each round, every member's round record."""

    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append({run.name: run.last_round.round for run in pl_module.runs})


def test_a_callback_sees_every_members_rounds(tmp_path):
    seen = SeesEveryMember()
    grouped([config("quickstart.yaml")], {"model.training.client_lr": [0.05, 0.1, 0.2]}, ["--trainer.max_steps=3", *F64],
            tmp_path, callbacks=[seen])
    names = ["00-client_lr=0.05", "01-client_lr=0.1", "02-client_lr=0.2"]
    assert seen.seen == [dict.fromkeys(names, r) for r in range(3)]


# ----------------------------------------------------------------------------- bad input


def write(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


def test_a_sweep_that_is_not_a_grid_is_refused(tmp_path):
    with pytest.raises(ValueError, match="method 'random'.*grids only"):
        load_sweep(write(tmp_path, "method: random\nparameters:\n  model.training.client_lr:\n    values: [0.1]\n"))
    with pytest.raises(ValueError, match="'model.training.client_lr'.*values"):
        load_sweep(write(tmp_path, "method: grid\nparameters:\n  model.training.client_lr:\n    min: 0.1\n    max: 1\n"))
    with pytest.raises(ValueError, match="no parameters"):
        load_sweep(write(tmp_path, "method: grid\n"))
    with pytest.raises(ValueError, match="empty list"):
        load_sweep(write(tmp_path, "method: grid\nparameters:\n  model.training.client_lr:\n    values: []\n"))
    with pytest.raises(ValueError, match="keys \\['paramters'\\]"):
        load_sweep(write(tmp_path, "method: grid\nparamters: {}\nparameters:\n  a:\n    value: 1\n"))


def test_the_repository_sweeps_parse_as_grids():
    s = load_sweep(REPO / "sweeps" / "igfl_client_lr.yaml")
    assert len(s.points()) == 72 and s.base_args == ["--config", "configs/paper/igfl/cross_device_mnist.yaml"]
    assert s.points()[1] == {"config": "configs/paper/igfl/alg_fedavg.yaml", "model.training.client_lr": 0.003}


def test_an_unknown_parameter_is_refused_before_training():
    with pytest.raises(ValueError, match="do not parse"):
        build_members([config("quickstart.yaml")], Sweep("t", {"model.client_learning_rate": [0.1]}), [])


def test_members_with_different_models_are_refused(tmp_path):
    members, _ = build_members([config("quickstart.yaml")], Sweep("t", {"model.net.init_args.hidden": ["[200, 200]", "[100]"]}),
                               ["--trainer.max_steps=2"])
    with pytest.raises(ValueError, match="another model"):
        train_group(members, rounds=1, default_root_dir=tmp_path)


def test_members_with_different_datasets_are_refused(tmp_path):
    def member(name, seed):
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(60, 4, generator=g), torch.randint(0, 3, (60,), generator=g)
        dm = FederatedDataModule.from_tensors(x, y, x[:10], y[:10], num_clients=3, partition="iid")
        return GroupMember(name, FederatedModule(net=MLP(in_features=4, hidden=(), num_classes=3)), dm)

    with pytest.raises(ValueError, match="another dataset"):
        train_group([member("a", 0), member("b", 1)], rounds=1, default_root_dir=tmp_path)


def test_trainer_settings_must_agree():
    """The runs of a grid share one Trainer: a sweep of its settings (precision, rounds) is refused, naming them."""
    with pytest.raises(ValueError, match="trainer.precision.*share one Trainer"):
        build_members([config("quickstart.yaml")], Sweep("t", {"trainer.precision": ["32-true", "64-true"]}), [])
    with pytest.raises(ValueError, match="trainer.max_steps.*share one Trainer"):
        build_members([config("quickstart.yaml")], Sweep("t", {"trainer.max_steps": [2, 3]}), [])


# ----------------------------------------------------------------------------- engine rows of several runs


def test_rules_of_one_kind_concatenate_and_others_do_not():
    like = torch.zeros(3, dtype=torch.float64)
    a = StepRule(grad_scale=1.5, shift=torch.ones(2, 3, dtype=torch.float64))
    b = StepRule(shift=torch.full((3,), 2.0, dtype=torch.float64))  # a shared [P] shift
    assert rule_signature(a, like.dtype) == rule_signature(b, like.dtype)
    r = concat_rules([a, b], [2, 1], 3, like)
    assert torch.equal(r.grad_scale, torch.tensor([1.5, 1.5, 1.0], dtype=torch.float64))
    assert torch.equal(r.shift, torch.tensor([[1.0] * 3, [1.0] * 3, [2.0] * 3], dtype=torch.float64))
    assert rule_signature(StepRule(decay=0.1), like.dtype) != rule_signature(StepRule(decay=0.2), like.dtype)
    assert rule_signature(StepRule(), like.dtype) != rule_signature(a, like.dtype)
    with pytest.raises(ValueError, match="different kinds"):
        concat_rules([StepRule(), a], [1, 2], 3, like)


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_per_row_engine_arguments_give_each_row_its_alone_result(backend):
    """``w_start [K, P]``, ``lr [K]`` and a stacked schedule: rows of two cohorts as if trained apart."""
    torch.manual_seed(0)
    net = MLP(in_features=6, hidden=(5,), num_classes=3).double()
    X, Y = torch.randn(60, 6, dtype=torch.float64), torch.randint(0, 3, (60,))
    tr = CohortTrainer(net, backend=backend)
    P = tr.layout.num_params
    idx = [torch.randperm(60)[:24].view(3, 8), torch.randperm(60)[:14].view(2, 7)]
    n = [torch.tensor([8, 5, 7]), torch.tensor([7, 6])]
    steps = [torch.tensor([3, 2, 4]), torch.tensor([1, 2])]
    w0 = [tr.layout.module_vector(net), tr.layout.module_vector(net) + 0.1]
    rules = [StepRule(shift=torch.randn(3, P, dtype=torch.float64)), StepRule(grad_scale=2.0, shift=torch.randn(P, dtype=torch.float64))]
    lrs = [0.1, 0.03]
    gens = [lambda: torch.Generator().manual_seed(1), lambda: torch.Generator().manual_seed(2)]
    apart = [tr.train(w0[i], X, Y, idx[i], n[i], steps[i], rules[i], lrs[i], 3, gens[i]()) for i in range(2)]
    schedule = stack_schedules([batch_schedule(n[i], int(steps[i].max()), 3, gens[i]()) for i in range(2)])
    together = tr.train(
        torch.cat([w0[0].expand(3, P), w0[1].expand(2, P)]), X, Y,
        torch.cat([idx[0], torch.nn.functional.pad(idx[1], (0, 1))]), torch.cat(n), torch.cat(steps),
        concat_rules(rules, [3, 2], P, w0[0]), torch.tensor([0.1] * 3 + [0.03] * 2, dtype=torch.float64), 3, None,
        schedule=schedule,
    )
    assert torch.equal(together.weights, torch.cat([a.weights for a in apart]))
    assert torch.equal(together.loss, torch.cat([a.loss for a in apart]))
    with pytest.raises(ValueError, match="per-row learning rate"):
        tr.train(w0[0], X, Y, idx[0], n[0], steps[0], StepRule(), torch.tensor([0.1, 0.2]), 3, gens[0]())
    with pytest.raises(ValueError, match="w_start"):
        tr.train(torch.zeros(2, P, dtype=torch.float64), X, Y, idx[0], n[0], steps[0], StepRule(), 0.1, 3, gens[0]())


def test_the_lfed_entry_point_runs_grid_and_reports_bad_input_in_one_line(tmp_path, monkeypatch, capsys):
    import sys

    from lfed.entry import main

    sweep = write(tmp_path, "method: bayes\nparameters:\n  model.training.client_lr:\n    values: [0.1]\n")
    monkeypatch.setattr(sys, "argv", ["lfed", "grid", "--config", config("quickstart.yaml"), "--sweep", str(sweep)])
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 2
    assert "lfed grid: error: sweep: method 'bayes'" in capsys.readouterr().err


def test_a_grids_start_line_names_every_composition_it_runs(monkeypatch):
    """Issue 66 item 4: a grid over objectives said "2 runs of fedavg ... objective=plain" (the first run's); it names
    each composition once and each setting's values over the runs."""
    lines = []
    monkeypatch.setattr("lfed.lightning.driver.rank_zero_info", lambda message, *a, **k: lines.append(message))
    grouped([config("quickstart.yaml")], {"model.objective": ["plain", "prox"]}, ["--trainer.max_steps=1"])
    [line] = [m for m in lines if m.startswith("lfed: 2 runs of")]
    assert line.startswith("lfed: 2 runs of fedavg, fedavg+Prox on ") and "objective=plain|prox" in line, line
    assert "weighting=size," in line  # a setting all runs share: once
