"""Robust rules and attacks in whole runs: refused before round 0 in one line where they cannot run, logged per round,
a grid of attack × rule trained as one group equal to each run alone (the poisoned labels kept apart)."""

from __future__ import annotations

import pytest
import torch
from conftest import REPO, run_rounds
from test_group import F64, assert_members_equal_alone

from lfed.lightning.cli import LfedCLI
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.models.zoo import MLP
from lfed.robust.attacks import ALIE

pytestmark = pytest.mark.usefixtures("one_thread")  # bit for bit needs one intra-op thread
CONFIG = str(REPO / "configs" / "robust_digits.yaml")


def _digits(num_clients=20):
    return FederatedDataModule(dataset="digits", num_clients=num_clients, partition="iid", seed=0)


def _module(**kwargs):
    args = dict(net=MLP(64, [16], 10), fraction=0.5, training=dict(client_lr=0.05, batch_size=10, local_steps=2), seed=0)
    return FederatedModule(**{**args, **kwargs})


@pytest.mark.parametrize("settings,message", [
    (dict(combination="krum", fraction=0.25, attack=ALIE(fraction=0.2)),  # K = 5, f = 1 -> 2f + 3 = 5 runs; f = 2 does not
     None),
    (dict(combination="krum", fraction=0.25, attack=ALIE(per_round=2)),
     "combination: krum needs K > 2f + 2 (at least 7 updates with f = 2), but a planned cohort of 5 clients"),
    (dict(combination={"class_path": "lfed.robust.rules.Bulyan", "init_args": {"f": 1}}, fraction=0.25),
     "combination: bulyan needs K ≥ 4f + 3 (at least 7 updates with f = 1), but a planned cohort of 5 clients"),
    (dict(attack="label_flip", combination="median"), None),
])
def test_a_rule_whose_requirement_the_cohort_misses_is_refused_before_round_0_in_one_line(settings, message):
    m = _module(**settings)
    if message is None:
        run_rounds(m, _digits(), 1, precision="32-true")
        return
    with pytest.raises(ValueError) as info:
        run_rounds(m, _digits(), 1, precision="32-true")
    assert str(info.value).startswith(message) and "\n" not in str(info.value), str(info.value)
    assert m.runs[0].rounds_done == 0


def test_an_attack_that_has_no_byzantine_client_warns_that_it_does_nothing():
    with pytest.warns(UserWarning, match="attack='alie' has no Byzantine clients"):
        run_rounds(_module(attack="alie"), _digits(), 1, precision="32-true")


def test_the_robust_config_logs_what_each_round_kept_and_how_many_byzantine_rows(tmp_path):
    cli = LfedCLI(FederatedModule, FederatedDataModule, run=False, save_config_callback=None, args=[
        "--config", CONFIG, "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.logger=false",
        "--trainer.enable_progress_bar=false", "--checkpoint_every=0", f"--trainer.default_root_dir={tmp_path}",
        "--model.combination=lfed.robust.rules.Krum", "--model.combination.f=4"])
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    m = cli.trainer.callback_metrics
    byz = cli.model.runs[0].components.attack.byzantine_clients(20, 0)
    assert float(m["byzantine/counting"]) == int(byz.sum()) == 4  # every client each round (fraction 1.0)
    assert float(m["robust/kept"]) == 1 and float(m["robust/byzantine_kept"]) in (0.0, 1.0)
    assert cli.model.runs[0].label == "fedavg+Krum+ALIE"


def test_an_attack_by_rule_grid_trained_as_one_group_equals_each_run_alone(tmp_path):
    """Runs whose clients train on the same labels share one engine call; label flipping's poisoned labels train
    apart: 2 calls per round for 6 runs."""
    attacks = ["none", {"class_path": "lfed.robust.attacks.ALIE", "init_args": {"fraction": 0.2}},
               {"class_path": "lfed.robust.attacks.LabelFlip", "init_args": {"fraction": 0.2}}]
    rules = [{"class_path": "lfed.robust.rules.Krum", "init_args": {"f": 4}}, "median"]
    assert_members_equal_alone([CONFIG], {"model.attack": attacks, "model.combination": rules},
                               ["--trainer.max_steps=3", "--trainer.val_check_interval=3", *F64], tmp_path,
                               merged_calls_per_round=2)



def test_a_backdoor_run_logs_its_success_rate_at_each_evaluation_and_fltrust_runs_on_the_validation_split(tmp_path):
    cli = LfedCLI(FederatedModule, FederatedDataModule, run=False, save_config_callback=None, args=[
        "--config", CONFIG, "--trainer.max_steps=2", "--trainer.val_check_interval=1", "--trainer.logger=false",
        "--trainer.enable_progress_bar=false", "--checkpoint_every=0", f"--trainer.default_root_dir={tmp_path}",
        "--model.combination=lfed.robust.rules.FLTrust", "--model.combination.root_size=50",
        '--model.attack={"class_path": "lfed.robust.attacks.Backdoor", "init_args": {"fraction": 0.2, "boost": 5.0}}',
        "--data.validation_fraction=0.1"])
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    run = cli.model.runs[0]
    assert len(run.eval_history) == 2
    m = cli.trainer.callback_metrics
    assert 0.0 <= float(m["backdoor/attack_success"]) <= 1.0 and 0 <= float(m["robust/kept"]) <= 20
    assert run.label == "fedavg+FLTrust+Backdoor"


def test_the_repository_attack_by_rule_sweep_builds_each_of_its_values_with_the_attacks_f(tmp_path):
    """Its 60 points; every value of each parameter built once (the product would parse 60 runs)."""
    from lfed.lightning.grid import build_members
    from lfed.lightning.sweep import Sweep, load_sweep

    sweep = load_sweep(REPO / "sweeps" / "robust_attack_rule.yaml")
    assert len(sweep.points()) == 5 * 3 * 2 * 2
    values = {k: [p[k] for p in sweep.points()] for k in sweep.points()[0]}
    values = {k: list(dict.fromkeys(v)) for k, v in values.items()}
    first = {k: v[0] for k, v in values.items()}
    for key in ("model.combination", "model.attack.class_path", "model.attack.init_args.fraction"):
        fixed = [f"--{k}={v}" for k, v in first.items() if k != key and k != "model.attack.class_path"]
        grid = {key: values[key]} if key == "model.attack.class_path" else {"model.attack.class_path": [first[
            "model.attack.class_path"]], key: values[key]}
        members, _ = build_members([CONFIG], Sweep("s", grid), [*fixed, "--trainer.max_steps=1",
                                                                 f"--trainer.default_root_dir={tmp_path}"])
        assert len(members) == len(values[key])
        for m in members:
            point = {**first, **m.params}
            attack = m.run.components.attack
            assert type(attack).__name__ == point["model.attack.class_path"].rsplit(".", 1)[1]
            assert attack.fraction == point["model.attack.init_args.fraction"]
            assert m.run.components.combination.name == point["model.combination"]


@pytest.mark.parametrize("settings", [
    dict(algorithm="fedadam", combination="krum", attack=ALIE(fraction=0.2)),  # a server optimizer steps on the rule's Δ
    dict(combination="trimmed_mean", stragglers=dict(p_inactive=0.2), partial_work="drop",
         attack="sign_flip"),  # stragglers: the rule sees the counting updates only
    dict(algorithm="fedper", combination="median", attack=ALIE(per_round=1)),  # personalization: the shared part only
], ids=["fedadam-krum", "stragglers-trimmed-mean", "fedper-median"])
def test_a_rule_composes_with_server_optimizers_stragglers_and_a_shared_part(settings):
    settings = dict(settings)
    if settings.get("attack") == "sign_flip":
        settings["attack"] = {"class_path": "lfed.robust.attacks.SignFlip", "init_args": {"fraction": 0.2}}
    m = _module(**settings)
    before = [p.detach().clone() for p in m.runs[0].net.parameters()] if m.runs[0].net is not None else None
    run_rounds(m, _digits(), 2, precision="32-true")
    run = m.runs[0]
    assert run.rounds_done == 2 and run.last_round is not None and not run.last_round.skipped
    after = list(run.net.parameters())
    assert before is None or any(not torch.equal(a, b) for a, b in zip(after, before))
    assert all(torch.isfinite(p).all() for p in after)
