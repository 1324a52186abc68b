"""Settings in groups, one spelling each (issue 41): the groups check their own values, 0.3's flat keys are
rewritten to the new form with one message each (Python, config files, the command line), and a run built
without Lightning (``build_run`` + ``fit_run``) equals the same run under a Trainer bit for bit."""

from __future__ import annotations

import os

import pytest
import torch
import yaml
from conftest import CROSS_MACHINE, REPO, assert_within, flat_weights, run_rounds

from lfed.core.algorithm import LocalTraining
from lfed.core.fit import fit_run
from lfed.core.settings import Engine, Evaluation, build_run, upgrade, upgrade_args
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.models.zoo import MLP
from lfed.participation.stragglers import Stragglers


def digits(**kw):
    return FederatedDataModule(dataset="digits", num_clients=10, partition="dirichlet", rho=0.5, seed=0, **kw)


def net():
    torch.manual_seed(0)
    return MLP(in_features=64, hidden=[16], num_classes=10)


# ------------------------------------------------------------------------------------------ the groups


@pytest.mark.parametrize("make, match", [
    (lambda: Engine(backend="fast"), r"engine\.backend"),
    (lambda: Engine(client_state="cloud"), r"engine\.client_state"),
    (lambda: Engine(chunk_size=0), r"engine\.chunk_size"),
    (lambda: Engine(client_state_dir="/tmp/x"), r"client_state_dir: only used with client_state='disk'"),
    (lambda: Evaluation(personal_chunk=0), r"evaluation\.personal_chunk"),
    (lambda: LocalTraining(client_lr=0.0), r"client_lr"),
    (lambda: LocalTraining(batch_size=0), r"batch_size"),
    (lambda: Stragglers(p_inactive=0.7, p_incomplete=0.5), r"p_inactive \+ p_incomplete"),
])
def test_each_group_refuses_a_bad_value_naming_it(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_groups_are_the_modules_arguments_and_its_checkpoint_hyperparameters_are_plain():
    m = FederatedModule(net(), training=LocalTraining(client_lr=0.2, local_steps=3), engine=Engine(backend="loop"),
                        stragglers=Stragglers(p_inactive=0.1), evaluation=Evaluation(personal_chunk=8))
    run = m.runs[0]
    assert run.training_plan == LocalTraining(client_lr=0.2, local_steps=3) and run.backend == "loop"
    assert run.components.participation.stragglers.p_inactive == 0.1 and run.personal_chunk == 8
    assert m.hparams["training"] == {"client_lr": 0.2, "batch_size": 10, "local_epochs": 1, "local_steps": 3}
    assert m.hparams["engine"]["backend"] == "loop" and "client_lr" not in m.hparams


def test_the_modules_signature_is_the_settings_list_names_types_and_defaults():
    """RunSettings is the one list of a run's settings; FederatedModule spells it out for the CLI's parser. A setting
    added (or retyped, or given another default) in one and not the other fails here."""
    import dataclasses
    import inspect

    from lfed.core.settings import RunSettings

    params = [p for p in inspect.signature(FederatedModule.__init__).parameters.values()
              if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    fields = dataclasses.fields(RunSettings)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        assert p.default == default and type(p.default) is type(default), p.name
        assert p.annotation == f.type, p.name  # both as written (postponed annotations): the same words


def test_run_settings_build_the_run_and_their_hyperparameters_are_the_checkpoints():
    """RunSettings(...) puts each setting in its one form (a group from None or a dict, a role from its class_path)
    and builds the run FederatedModule runs; its hparams() are the plain dict a checkpoint keeps (unchanged since 0.5:
    old checkpoints' hyperparameters stay valid)."""
    import dataclasses

    from lfed.client.objectives import Prox
    from lfed.core.settings import RunSettings

    s = RunSettings(algorithm="fedprox", objective={"class_path": "lfed.client.objectives.Prox", "init_args": {"mu": 0.3}},
                    training={"client_lr": 0.2}, engine=None, evaluation={"personal_chunk": 8})
    assert isinstance(s.objective, Prox) and s.objective.mu == 0.3
    assert s.training == LocalTraining(client_lr=0.2) and s.engine == Engine() and s.evaluation == Evaluation(personal_chunk=8)
    run = s.build()
    assert run.components.objective is s.objective and run.training_plan == s.training and run.personal_chunk == 8
    assert run.engine_settings is s.engine and run.evaluation_settings is s.evaluation and run.explicit == {"objective"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 1
    assert FederatedModule().hparams == RunSettings().hparams() == {
        "net": None, "algorithm": "fedavg", "objective": None, "weighting": None, "partial_work": None,
        "combination": None, "channel": None, "sampler": None, "fraction": None, "server_optimizer": None,
        "training": {"client_lr": 0.05, "batch_size": 10, "local_epochs": 1, "local_steps": None},
        "stragglers": {"p_inactive": 0.0, "p_incomplete": 0.0},
        "engine": {"backend": "auto", "chunk_size": None, "client_state": "device", "client_state_dir": None},
        "evaluation": {"personal_clients": None, "client_sample": 10000, "personal_chunk": 256,
                       "round_local_accuracy": True, "accuracy_targets": None},
        "loss": None, "seed": 0, "asynchronous": None, "attack": None}
    with pytest.raises(ValueError, match=r"^training: unknown settings \['lr'\]; known: "):
        RunSettings(training={"lr": 0.1})
    with pytest.raises(TypeError, match=r"^unknown settings \['colour'\]$"):
        build_run(colour="red")


def test_federated_run_takes_the_groups_and_refuses_a_bad_one_naming_it():
    """FederatedRun(engine=..., evaluation=...): the groups as RunSettings holds them (or None, or a dict of their
    fields); the run reads their values under its old names (run.backend, run.client_sample, ...)."""
    from lfed.core import registry as algorithms
    from lfed.core.run import FederatedRun

    def run(**groups):
        return FederatedRun(algorithms.build(algorithms.resolve("fedavg")), LocalTraining(), torch.optim.SGD, **groups)

    r = run(engine=Engine(backend="loop", chunk_size=4, client_state="host"),
            evaluation={"client_sample": None, "personal_clients": 3, "accuracy_targets": [0.5]})
    assert (r.backend, r.chunk_size, r.store.placement) == ("loop", 4, "host")
    assert (r.client_sample, r.personal_clients, r.personal_chunk, r.round_local_accuracy) == (None, 3, 256, True)
    assert r.accuracy_targets == [0.5] and r.evaluation_settings == Evaluation(client_sample=None, personal_clients=3,
                                                                              accuracy_targets=[0.5])
    plain = run()
    assert plain.engine_settings == Engine() and plain.evaluation_settings == Evaluation() and plain.client_sample == 10_000
    with pytest.raises(ValueError, match=r"^evaluation.client_sample: need an integer >= 1 or None \(every client\), got 0$"):
        run(evaluation={"client_sample": 0})
    with pytest.raises(ValueError, match=r"^evaluation.round_local_accuracy: must be true or false, got 'yes'$"):
        run(evaluation={"round_local_accuracy": "yes"})
    with pytest.raises(ValueError, match=r"^evaluation.accuracy_targets\[0\] must be an accuracy in \[0, 1\]"):
        run(evaluation={"accuracy_targets": [90]})
    with pytest.raises(ValueError, match=r"^engine: unknown settings \['chunk'\]"):
        run(engine={"chunk": 4})
    with pytest.raises(TypeError, match=r"^evaluation: an Evaluation, a dict of its settings or None, got Engine$"):
        run(evaluation=Engine())


# ------------------------------------------------------------------------------ 0.3's keys, by hand


def test_upgrade_moves_each_kind_of_old_key_to_its_one_new_place():
    new, said = upgrade({"algorithm": "igfl", "attention_temperature": 0.5, "client_lr": 0.1, "p_inactive": 0.2,
                         "compression": 0.25, "backend": "loop", "personal_clients": 5})
    assert new == {"algorithm": "igfl", "channel": 0.25, "training": {"client_lr": 0.1},
                   "stragglers": {"p_inactive": 0.2}, "engine": {"backend": "loop"}, "evaluation": {"personal_clients": 5},
                   "combination": {"class_path": "lfed.server.combination.IGFLAttention",
                                   "init_args": {"query": "global", "temperature": 0.5}}}  # the preset's query kept
    assert len(said) == 6 and all(" is deprecated" in m for m in said)
    assert "model.client_lr is deprecated: it is model.training.client_lr now" in said


def test_a_method_setting_joins_its_component_given_by_class_path_and_is_dropped_where_unused():
    new, _ = upgrade({"objective": {"class_path": "lfed.client.objectives.Prox", "init_args": {}}, "mu": 0.3})
    assert new == {"objective": {"class_path": "lfed.client.objectives.Prox", "init_args": {"mu": 0.3}}}
    new, said = upgrade({"algorithm": "fedavg", "mu": 0.3, "sampler_alpha": 0.5})
    assert new == {"algorithm": "fedavg"}
    assert all("did nothing here" in m for m in said) and len(said) == 2


def test_a_key_given_both_ways_with_two_values_is_refused():
    with pytest.raises(ValueError, match="model.client_lr: given with model.training.client_lr"):
        upgrade({"client_lr": 0.1, "training": {"client_lr": 0.2}})
    with pytest.raises(ValueError, match="model.aggregation: given with model.combination"):
        upgrade({"aggregation": "mean", "combination": "global"})


def test_old_python_keywords_are_refused_in_one_line_and_their_upgrade_builds_the_same_run():
    old = dict(algorithm="fedprox", mu=0.5, client_lr=0.2, aggregation="global", attention_temperature=0.5,
               backend="loop", p_inactive=0.1)
    with pytest.raises(ValueError) as refused:
        FederatedModule(net(), **old)
    line = str(refused.value)
    assert "\n" not in line and line.count("removed in 0.5") == 6 and "scripts/upgrade_configs.py" in line
    assert "mu: lfed 0.3's spelling, removed in 0.5; it is objective: {class_path: lfed.client.objectives.Prox" in line
    from lfed.client.objectives import Prox
    from lfed.server.combination import IGFLAttention

    upgraded, _ = upgrade(old, prefix="")  # what scripts/upgrade_configs.py writes
    a = FederatedModule(net(), **upgraded).runs[0]
    b = FederatedModule(net(), algorithm="fedprox", objective=Prox(mu=0.5), training=LocalTraining(client_lr=0.2),
                        combination=IGFLAttention("global", temperature=0.5), engine=Engine(backend="loop"),
                        stragglers=Stragglers(p_inactive=0.1)).runs[0]
    assert (a.components.objective.mu, a.components.combination.temperature, a.components.combination.query) == (0.5, 0.5, "global")
    assert a.training_plan == b.training_plan and a.backend == b.backend == "loop"
    assert repr(a.composition) == repr(b.composition)


def test_the_command_line_and_a_config_file_in_the_old_spelling_are_rewritten(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("model:\n  algorithm: efl\n  efl_lambda: 0.3\n  client_lr: 0.1\n  compression: false\n")
    args, said = upgrade_args(["fit", "--config", str(old), "--model.batch_size", "5", "--model.aggregation=mean",
                               "--model.fisher_samples=8"])
    assert args[:2] == ["fit", "--config"] and yaml.safe_load(args[2])["model"] == {
        "algorithm": "efl", "channel": False, "training": {"client_lr": 0.1},
        "objective": {"class_path": "lfed.client.objectives.EFL", "init_args": {"lam": 0.3}}}
    assert args[3:7] == ["--model.training.batch_size", "5", "--model.combination=mean",
                         '--model.objective={"class_path": "lfed.client.objectives.EFL", "init_args": {"lam": 0.3, "fisher_samples": 8}}']
    assert len(said) == 6 and said[0].startswith(f"{old}: model.compression is deprecated")


def test_lfed_fit_refuses_a_config_of_0_3_in_one_line_and_runs_it_once_upgraded(tmp_path, capsys):
    import subprocess
    import sys

    from conftest import REPO

    from lfed.lightning.cli import run_cli

    old = tmp_path / "old.yaml"
    old.write_text("model:\n  algorithm: fedprox\n  mu: 0.2\n  client_lr: 0.1\n  local_epochs: 2\n"
                   "data:\n  dataset: digits\n  num_clients: 10\n")
    with pytest.raises(SystemExit) as stop:
        run_cli(["fit", "--config", str(old), "--print_config"])
    assert stop.value.code == 2
    _, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if "removed in 0.5" in ln]
    assert len(lines) == 1 and lines[0].count("removed in 0.5") == 3 and "model.training.client_lr" in lines[0]
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "upgrade_configs.py"), str(old)], capture_output=True,
                          text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    with pytest.raises(SystemExit) as stop:
        run_cli(["fit", "--config", str(old), "--print_config"])
    assert stop.value.code in (0, None)
    out, err = capsys.readouterr()
    printed = yaml.safe_load(out)["model"]
    assert printed["training"]["client_lr"] == 0.1 and printed["training"]["local_epochs"] == 2
    assert printed["objective"]["class_path"].endswith("Prox") and printed["objective"]["init_args"]["mu"] == 0.2
    assert "removed in 0.5" not in err


# ------------------------------------------------------------------------------ a run without Lightning


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "fedadam"])
def test_build_run_and_fit_run_equal_the_module_under_a_trainer_bit_for_bit(algorithm, one_thread):
    training = LocalTraining(client_lr=0.1, batch_size=8, local_epochs=1)
    module = FederatedModule(net(), algorithm=algorithm, fraction=0.3, training=training, seed=3)
    run_rounds(module, digits(), 4, precision="32-true")
    run = build_run(net=net(), algorithm=algorithm, fraction=0.3, training=training, seed=3)
    history = fit_run(run, digits(), 4)
    assert len(history) == 4 and "test/acc" in history[-1] and "train/loss" in history[0]
    assert torch.equal(run.layout.module_vector(run.net), flat_weights(module))


def test_fit_run_goes_on_where_it_stopped_and_checks_its_arguments(one_thread):
    whole = build_run(net=net(), training=LocalTraining(client_lr=0.1), seed=1)
    fit_run(whole, digits(), 3)
    parts = build_run(net=net(), training=LocalTraining(client_lr=0.1), seed=1)
    fit_run(parts, digits(), 2, evaluate_every=1)
    assert len(fit_run(parts, digits(), 1)) == 1 and parts.rounds_done == 3
    assert torch.equal(whole.layout.module_vector(whole.net), parts.layout.module_vector(parts.net))
    with pytest.raises(ValueError, match="rounds"):
        fit_run(parts, digits(), 0)
    with pytest.raises(ValueError, match="evaluate_every"):
        fit_run(parts, digits(), 1, evaluate_every=0)


def test_fit_run_in_pieces_within_its_horizon_is_one_call_and_past_it_is_refused_where_it_matters(one_thread):
    """AdaFL's growing fraction is a schedule over the whole run: fit_run(2, total_rounds=4) + fit_run(2) samples
    the cohorts of fit_run(4) (1, 2, 3, 4 clients of 10: 0.1 -> 0.4 in 4 stages) and ends on the same weights; 0.4
    squeezed the schedule into each call (1, 3, 3, 4). Going past the horizon is refused for it (named), and
    extends it for a run with a constant fraction."""
    from lfed.participation.sampling import StepwiseFraction

    def run():
        return build_run(net=net(), algorithm="adafl", fraction=StepwiseFraction(0.1, 0.4, 4), seed=2,
                         training=LocalTraining(client_lr=0.1, batch_size=8, local_steps=2))

    whole = run()
    sizes_whole = [h["round/clients"] for h in fit_run(whole, digits(), 4)]
    parts = run()
    history = fit_run(parts, digits(), 2, total_rounds=4) + fit_run(parts, digits(), 2)
    sizes_parts = [h["round/clients"] for h in history]
    assert sizes_whole == sizes_parts == [1, 2, 3, 4]
    assert torch.equal(whole.layout.module_vector(whole.net), parts.layout.module_vector(parts.net))
    with pytest.raises(ValueError, match="past the 4 rounds the run was set for \\(the fraction schedule depends"):
        fit_run(parts, digits(), 1)
    with pytest.raises(ValueError, match="total_rounds: the run's horizon was fixed at 4"):
        fit_run(parts, digits(), 1, total_rounds=5)
    with pytest.raises(ValueError, match="rounds: 3 rounds would go past total_rounds = 2"):
        fit_run(run(), digits(), 3, total_rounds=2)
    constant = build_run(net=net(), training=LocalTraining(client_lr=0.1), seed=1)
    fit_run(constant, digits(), 1)
    assert len(fit_run(constant, digits(), 2)) == 2 and constant.rounds_done == 3  # nothing depends on the horizon
    from lfed.participation.sampling import ExplicitFraction  # a schedule by round, not by the run's length: extends too

    explicit = build_run(net=net(), fraction=ExplicitFraction([(0, 0.2), (2, 0.4)]), seed=1,
                         training=LocalTraining(client_lr=0.1))
    fit_run(explicit, digits(), 1)
    assert [h["round/clients"] for h in fit_run(explicit, digits(), 2)] == [2, 4]


# ------------------------------------------------------------------------------ checkpoints of lfed 0.3 and 0.4
#
# Each old checkpoint's first rounds were computed on the machine that wrote it, so what a resume here can equal bit
# for bit is only what this machine computes from the same state (docs/reproducibility.md): the restored arrays, and
# a resume of the same state saved by this lfed. Its continuation is compared with the one recorded with the fixture
# (continuation.pt, on the machine its "environment" names) to the contract's cross-machine tolerance
# (conftest.CROSS_MACHINE). LFED_RECORD_CONTINUATIONS=1 records the continuations anew instead of comparing with them
# (after a change of the maths, said in CHANGELOG.md).

FIXTURES = REPO / "tests" / "fixtures"
RECORD_CONTINUATIONS = os.environ.get("LFED_RECORD_CONTINUATIONS") == "1"


def _fit(tmp_path, config, steps: int, name: str, *extra: str):
    from lfed.lightning.cli import run_cli

    return run_cli(["fit", "--config", str(config), f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={steps}",
                    "--checkpoint_every=0", f"--trainer.default_root_dir={tmp_path / name}", *extra])


def _same(got, want, key) -> None:
    """Bit for bit: tensors by torch.equal (dtype and shape too), other values by ==."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want), key
    else:
        assert got == want, key


def _close(got, want, key, dtype) -> None:
    """To the cross-machine tolerance of a run in ``dtype``: a float tensor or number within CROSS_MACHINE[dtype] of
    ``want`` relative to the largest magnitude of ``want`` (the tensor's scale; a float64 tensor of a float32 run, as
    AdaFL's scores, holds float32's precision), everything else (integers, strings, shapes) exactly."""
    if isinstance(want, torch.Tensor) and want.is_floating_point():
        assert_within(got, want, dtype, key)
    elif isinstance(want, float):
        assert isinstance(got, float) and abs(got - want) <= CROSS_MACHINE[dtype] * max(abs(want), 1e-30), (key, got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), key
        for k in want:
            _close(got[k], want[k], f"{key}.{k}", dtype)
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), key
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"{key}[{i}]", dtype)
    else:
        _same(got, want, key)


def _old_checkpoint_holds(tmp_path, fixture: str, config, steps: int) -> None:
    """The four claims of an old checkpoint (the block comment above), each asserted in turn."""
    import shutil
    import warnings

    from test_checkpoint import assert_same_state, run_state

    from lfed.state.environment import EnvironmentWarning, environment

    ckpt = tmp_path / "last.ckpt"
    shutil.copy(FIXTURES / fixture / "last.ckpt", ckpt)  # a resume may write next to it
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    start = saved["global_step"]
    # 1. it loads, says which lfed wrote it (one line), and restores the arrays stored in it exactly
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = _fit(tmp_path, config, start, "restored", "--ckpt_path", str(ckpt))
    said = [str(w.message) for w in caught if issubclass(w.category, EnvironmentWarning)]
    assert len(said) == 1 and "written by lfed 0.4 or earlier (it records no environment)" in said[0], said
    assert restored.trainer.global_step == start
    state = restored.model.state_dict()
    assert state.keys() == saved["state_dict"].keys()
    for key, value in saved["state_dict"].items():
        _same(state[key], value, key)
    for key, value in saved["optimizer_states"][0]["runs"][0]["state"].items():
        _same(restored.trainer.optimizers[0].state_dict()["runs"][0]["state"][key], value, f"optimizer {key}")
    # 2. resumed, it continues bit for bit as the same state saved by this lfed on this machine does
    resaved = tmp_path / "resaved.ckpt"
    restored.trainer.save_checkpoint(resaved)
    old = run_state(_fit(tmp_path, config, steps, "old", "--ckpt_path", str(ckpt)))
    new = run_state(_fit(tmp_path, config, steps, "new", "--ckpt_path", str(resaved)))
    assert old["global_step"] == new["global_step"] == steps
    assert_same_state(old, new)
    # 3. its continuation equals the one recorded with the fixture (another machine, maybe) to the tolerance
    recorded = FIXTURES / fixture / "continuation.pt"
    if RECORD_CONTINUATIONS:
        torch.save({"state": old, "steps": steps, "environment": environment()}, recorded)
    want = torch.load(recorded, map_location="cpu", weights_only=True)
    assert want["steps"] == steps and old.keys() == want["state"].keys()
    for key in want["state"]:
        _close(old[key], want["state"][key], key, torch.float32)


@pytest.mark.bitlevel
def test_a_checkpoint_written_by_lfed_0_3_loads_and_continues_as_recorded_once_its_config_is_upgraded(tmp_path):
    """tests/fixtures/checkpoint_0_3: SCAFFOLD on digits after 2 rounds, written by lfed 0.3 (ac52bc0) from its config
    in 0.3's flat spelling, float32. 0.5 refuses that spelling on the command line (exit 2, one line naming each new
    key); scripts/upgrade_configs.py rewrites the config, and the checkpoint then holds the four claims of
    :func:`_old_checkpoint_holds` for a third round, the client controls included."""
    import shutil
    import subprocess
    import sys

    from lfed.lightning.cli import run_cli

    config = tmp_path / "config.yaml"
    shutil.copy(FIXTURES / "checkpoint_0_3" / "config.yaml", config)
    with pytest.raises(SystemExit) as refused:
        run_cli(["fit", "--config", str(config), "--trainer.max_steps=3"])
    assert refused.value.code == 2
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "upgrade_configs.py"), str(config)], capture_output=True,
                          text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "client_lr" in config.read_text() and "training:" in config.read_text()
    _old_checkpoint_holds(tmp_path, "checkpoint_0_3", config, 3)


@pytest.mark.bitlevel
@pytest.mark.parametrize("fixture", ["checkpoint_0_4_fedbuff", "checkpoint_0_4_adafl"])
def test_a_checkpoint_written_by_lfed_0_4_loads_and_continues_as_recorded(tmp_path, fixture, capsys):
    """tests/fixtures/checkpoint_0_4_*: written by lfed 0.4 (2bff11a) from configs with 0.4's class paths
    (``lfed.models.MLP``, ``lfed.asynchronous.FedBuff``, ``lfed.clock.SimulatedClock``, ``lfed.sampling.AttentionSampler``,
    moved in 0.5, removed in 0.6), float32: FedBuff with clients in flight after 4 server steps, AdaFL's attention
    sampler after 4 rounds. 0.6 refuses the config (exit 2, one line naming the new class path) until
    scripts/upgrade_configs.py rewrites it; the checkpoint, whose fingerprint and settings record the 0.4 paths, is read
    as it is (lfed.current_path). Resumed to 6, each holds the four claims of :func:`_old_checkpoint_holds`: the
    checkpoint's keys, its event queue and sampler state, and its old paths hold."""
    import shutil
    import subprocess
    import sys

    from lfed.lightning.cli import run_cli

    old, new = {"checkpoint_0_4_fedbuff": ("lfed.asynchronous.FedBuff", "lfed.core.asynchronous.FedBuff"),
                "checkpoint_0_4_adafl": ("lfed.sampling.AttentionSampler", "lfed.participation.sampling.AttentionSampler")}[fixture]
    config = tmp_path / "config.yaml"
    shutil.copy(FIXTURES / fixture / "config.yaml", config)
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        run_cli(["fit", "--config", str(config), "--trainer.max_steps=6"])
    assert refused.value.code == 2
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and said[0].endswith(f"class_path {old}: lfed 0.4's module path, removed in 0.6; it is {new} now "
                                              "(python scripts/upgrade_configs.py FILE.yaml rewrites a config)"), said
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "upgrade_configs.py"), str(config)], capture_output=True,
                          text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert f"class_path: {new}" in config.read_text() and old not in config.read_text()
    _old_checkpoint_holds(tmp_path, fixture, config, 6)


def test_a_checkpoint_of_lfed_0_4_is_scored_from_the_settings_it_recorded_with_0_4_paths(tmp_path):
    """tests/fixtures/checkpoint_0_4_fedbuff records its run's settings (``lfed_config``) with 0.4's class paths, removed
    in 0.6: read_checkpoint gives them as this lfed spells them (lfed.current_path, importing no old path), so
    ``lfed validate --ckpt_path`` with no config scores it from its own settings."""
    import shutil
    import sys

    from lfed.lightning.checkpoint import read_checkpoint
    from lfed.lightning.cli import run_cli

    ckpt = tmp_path / "last.ckpt"
    shutil.copy(FIXTURES / "checkpoint_0_4_fedbuff" / "last.ckpt", ckpt)
    recorded = torch.load(ckpt, map_location="cpu", weights_only=True)["lfed_config"]["model"]["asynchronous"]
    assert recorded["class_path"] == "lfed.asynchronous.FedBuff"
    assert recorded["init_args"]["clock"]["class_path"] == "lfed.clock.SimulatedClock"
    read = read_checkpoint(ckpt)["lfed_config"]["model"]["asynchronous"]
    assert read["class_path"] == "lfed.core.asynchronous.FedBuff"
    assert read["init_args"]["clock"]["class_path"] == "lfed.participation.clock.SimulatedClock"
    assert {k: v for k, v in read["init_args"].items() if k != "clock"} == {k: v for k, v in recorded["init_args"].items()
                                                                           if k != "clock"}
    cli = run_cli(["validate", "--ckpt_path", str(ckpt), "--trainer.logger=false", "--trainer.enable_progress_bar=false",
                   f"--trainer.default_root_dir={tmp_path / 'v'}"])
    assert type(cli.model.runs[0].schedule).__name__ == "FedBuff" and cli.datamodule.num_clients == 10
    assert 0 <= float(cli.trainer.callback_metrics["test/acc"]) <= 1
    assert not {"lfed.asynchronous", "lfed.clock"} & set(sys.modules)


def test_an_old_method_key_on_the_command_line_overrides_its_config_files_component(tmp_path):
    """A grid axis or sweep argument in 0.3's spelling after a config of 0.4 (the later setting wins, as always)."""
    cfg = tmp_path / "new.yaml"
    cfg.write_text("model:\n  algorithm: adafl\n  sampler:\n    class_path: lfed.participation.sampling.AttentionSampler\n"
                   "    init_args: {alpha: 0.9}\n")
    args, said = upgrade_args(["fit", "--config", str(cfg), "--model.sampler_alpha=0.5"])
    assert args[-1] == '--model.sampler={"class_path": "lfed.participation.sampling.AttentionSampler", "init_args": {"alpha": 0.5}}'
    assert len(said) == 1
    with pytest.raises(ValueError, match="given with model.sampler.init_args.alpha"):  # in one place: refused
        upgrade({"sampler": {"class_path": "lfed.participation.sampling.AttentionSampler", "init_args": {"alpha": 0.9}}, "sampler_alpha": 0.5})
