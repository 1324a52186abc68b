"""Exact resume and fault tolerance of a federated run (lfed.lightning.checkpoint, the CLI defaults).

The kill tests start a real ``python -m lfed.lightning.cli fit`` subprocess on digits, make it block at a
known point (tests/resume_helpers.py prints a marker and waits), SIGKILL it from here, resume
from its ``last.ckpt`` in this process, and require the end state (global model, every
per-client buffer, server optimizer state, communication meter, evaluation history) to be
bit-identical (``torch.equal``) to an uninterrupted run's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO
from lightning.pytorch import Trainer
from resume_helpers import HOLD_MARK, RoundLog

from lfed.client.objectives import EFL, Prox
from lfed.core import registry as algorithms
from lfed.data.datasets import load_dataset
from lfed.lightning.checkpoint import AtomicCheckpointIO, ResumeWarning, RoundCheckpoint, install_atomic_io, verify_fingerprint
from lfed.lightning.cli import run_cli
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.participation.sampling import UniformSampler, cohort_size
from lfed.participation.stragglers import Stragglers
from lfed.rng import round_generator

TESTS = Path(__file__).resolve().parents[1]  # tests/ (resume_helpers.py)
ROUNDS = 6  # R; checkpoints every R/2 = 3 rounds; the kill lands in round 4 (0-based)

#: The algorithms whose kill-and-resume must be exact (EFL with stragglers and compression).
CASES = {
    "fedavg": {},
    "scaffold": {},
    "igfl": {},
    "efl": {"stragglers": {"p_inactive": 0.1, "p_incomplete": 0.4}, "channel": 0.3,
            "objective": {"class_path": "lfed.client.objectives.EFL", "init_args": {"fisher_samples": 8}}},
    "adafl": {},
    # BatchNorm's running statistics per client on the vmap backend (FedBN keeps them) and augmentation redrawn every
    # step from the round's seed: both must continue exactly
    "fedbn": {"net": {"class_path": "lfed.models.ResNet20", "init_args": {"in_channels": 1, "width": 4, "num_classes": 10}},
              "data": {"augment": "crop_flip"}},
}


def write_config(path: Path, algorithm: str, *, rounds: int = ROUNDS, every: int = ROUNDS // 2,
                 hidden: list[int] | None = None, data: dict | None = None, trainer: dict | None = None,
                 training: dict | None = None, **model) -> Path:
    """A tiny run: digits over 10 clients, an MLP 64-16-10, 3 local steps, evaluation every 3 rounds
    (``training`` is merged over client_lr 0.05, batch_size 10, 3 local steps)."""
    cfg = {
        "seed_everything": 0,
        "checkpoint_every": every,
        "trainer": {
            "max_steps": rounds, "val_check_interval": 3, "logger": False, "enable_progress_bar": False,
            "accelerator": "cpu", "devices": 1, "default_root_dir": str(path.parent / "run"), **(trainer or {}),
        },
        "model": {
            "algorithm": algorithm,
            "net": {"class_path": "lfed.models.zoo.MLP", "init_args": {"in_features": 64, "hidden": hidden or [16], "num_classes": 10}},
            "training": {"client_lr": 0.05, "batch_size": 10, "local_steps": 3, **(training or {})},
            **({} if algorithm.startswith("adafl") else {"fraction": 0.3}),  # AdaFL keeps its 0.1 -> 0.5 schedule
            **model,
        },
        "data": {"dataset": "digits", "num_clients": 10, "partition": "dirichlet", "rho": 0.5, **(data or {})},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def fit(config: Path, *args: str):
    return run_cli(["fit", "--config", str(config), *args])


def checkpoint_dir(default_root_dir: Path) -> Path:
    """``checkpoints/`` of the one run under ``default_root_dir`` (runs/<name>/version_<n>/, lfed.lightning.reporting)."""
    [run] = sorted(default_root_dir.glob("runs/*/version_*"))
    return run / "checkpoints"


def run_state(cli) -> dict:
    """Everything a run's continuation depends on, as comparable values."""
    module = cli.model
    state = {f"module.{k}": v for k, v in module.state_dict().items()}
    for i, opt in enumerate(cli.trainer.optimizers[0].state_dict()["runs"]):  # every run's server optimizer
        for pid, s in opt["state"].items():
            for k, v in s.items():
                state[f"optimizer{i}.{pid}.{k}"] = v
        state[f"optimizer{i}.param_groups"] = [{k: v for k, v in g.items() if k != "params"} for g in opt["param_groups"]]
    state["comm"] = module.comm.state_dict()
    state["eval_history"] = list(module.eval_history)
    state["global_step"] = cli.trainer.global_step
    return state


def assert_same_state(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[key], value), f"{key} differs after resume"
        else:
            assert got[key] == value, f"{key}: {got[key]!r} != {value!r}"


def start_lfed(config: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO)]))
    return subprocess.Popen(
        [sys.executable, "-m", "lfed.lightning.cli", "fit", "--config", str(config), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=config.parent,
    )


def kill_when_holding(proc: subprocess.Popen, timeout: float = 600) -> str:
    """Read the subprocess's output until it says it is holding, then SIGKILL it."""
    watchdog = threading.Timer(timeout, proc.kill)  # a hang fails the test instead of blocking CI
    watchdog.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(HOLD_MARK):
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        proc.wait()
        watchdog.cancel()
        proc.stdout.close()
    output = "".join(lines)
    assert lines and lines[-1].startswith(HOLD_MARK), f"the run never reached the hold point:\n{output}"
    assert proc.returncode == -signal.SIGKILL, output
    return output


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


# ----------------------------------------------------------------------------- exact resume after SIGKILL


#: The algorithm killed by a real SIGKILL (the richest state: Fisher sums, compression residuals, stragglers); the
#: others stop with an error at the same point in this process (what a kill leaves, the last checkpoint, is the same
#: whatever the algorithm; what each algorithm adds is its state, which the resume below compares entry by entry).
KILLED = "efl"


def _stopped_then_resumed(tmp_path: Path, algorithm: str, kill: bool) -> None:
    ref_dir, kill_dir = tmp_path / "ref", tmp_path / "killed"
    ref_dir.mkdir(), kill_dir.mkdir()
    reference = fit(write_config(ref_dir / "cfg.yaml", algorithm, **CASES[algorithm]))
    want = run_state(reference)
    assert want["global_step"] == ROUNDS and len(want["eval_history"]) == 2

    config = write_config(kill_dir / "cfg.yaml", algorithm, **CASES[algorithm])
    if kill:
        proc = start_lfed(config, "--trainer.callbacks+=resume_helpers.HoldInRound", "--trainer.callbacks.round=4")
        kill_when_holding(proc)
    else:
        with pytest.raises(RuntimeError, match="stopped in round 4"):
            fit(config, "--trainer.callbacks+=resume_helpers.RaiseMidRound", "--trainer.callbacks.round=4")
    last = checkpoint_dir(kill_dir / "run") / "last.ckpt"
    saved = load(last)
    assert saved["global_step"] == ROUNDS // 2  # round 3 ran but was lost with the process
    assert saved["lfed"]["runs"][0]["fingerprint"]["composition.algorithm"] == algorithm

    resumed = fit(config, "--ckpt_path", "last", "--trainer.callbacks+=resume_helpers.RoundLog")
    assert Path(resumed.trainer.ckpt_path) == last
    log = next(c for c in resumed.trainer.callbacks if isinstance(c, RoundLog))
    assert log.rounds == [3, 4, 5]  # it continued from the checkpoint, it did not start over
    assert_same_state(run_state(resumed), want)
    assert load(last)["global_step"] == ROUNDS


def test_sigkill_mid_run_then_resume_is_bit_identical(tmp_path):
    _stopped_then_resumed(tmp_path, KILLED, kill=True)


@pytest.mark.parametrize("algorithm", [a for a in CASES if a != KILLED])
def test_a_run_stopped_mid_round_then_resumed_is_bit_identical(tmp_path, algorithm):
    _stopped_then_resumed(tmp_path, algorithm, kill=False)


def test_sigkill_during_a_checkpoint_write_keeps_the_previous_checkpoint(tmp_path):
    ref_dir, kill_dir = tmp_path / "ref", tmp_path / "killed"
    ref_dir.mkdir(), kill_dir.mkdir()
    want = run_state(fit(write_config(ref_dir / "cfg.yaml", "scaffold", every=2)))

    config = write_config(kill_dir / "cfg.yaml", "scaffold", every=2)
    proc = start_lfed(config, "--trainer.plugins", "resume_helpers.HoldInCheckpointWrite", "--trainer.plugins.step", "4")
    out = kill_when_holding(proc)
    assert "in the checkpoint write of step 4" in out
    ckpt_dir = checkpoint_dir(kill_dir / "run")
    temps = sorted(ckpt_dir.glob(".last.ckpt.tmp-*"))
    assert [p.name for p in temps] == [f".last.ckpt.tmp-{proc.pid}"]  # the half-written file
    with pytest.raises(Exception):  # noqa: B017 - torch.load fails on a truncated file with one of several types
        load(temps[0])  # it is truncated ...
    assert load(ckpt_dir / "last.ckpt")["global_step"] == 2  # ... and last.ckpt is the previous good one

    resumed = fit(config, "--ckpt_path", "last")
    assert Path(resumed.trainer.ckpt_path) == ckpt_dir / "last.ckpt"
    assert_same_state(run_state(resumed), want)
    assert not list(ckpt_dir.glob(".last.ckpt.tmp-*"))  # the next good save removed the dead process's temp file


# ----------------------------------------------------------------------------- exact resume in process


@pytest.mark.bitlevel
@pytest.mark.parametrize(
    "algorithm, extra",
    [
        ("fedadam", {"engine": {"backend": "loop"}}),  # server optimizer state (m, v) and the loop backend
        ("igfl_s_time", {"engine": {"backend": "vmap"}, "sampler": "attention", "stragglers": {"p_inactive": 0.2}}),
        ("fedavg", {"engine": {"backend": "vmap"}, "net": {"class_path": "resume_helpers.DropoutMLP"}}),
        ("fedavg", {"engine": {"backend": "loop"}, "net": {"class_path": "resume_helpers.DropoutMLP"}}),
        ("fedavg", {"engine": {"backend": "vmap", "client_state": "host"}, "fraction": 0.5,  # a rule's state inside a
                    "combination": {"class_path": "lfed.robust.rules.Bucketing",  # pre-aggregator; an attack's data
                                    "init_args": {"rule": "centered_clipping", "bucket_size": 2}},
                    "attack": {"class_path": "lfed.robust.attacks.LabelFlip", "init_args": {"fraction": 0.2}}}),
        # a population made per client (data.lazy): each round's devices made again from their seeds on resume
        ("scaffold", {"net": {"class_path": "lfed.models.LogisticRegression", "init_args": {"in_features": 60, "num_classes": 10}},
                      "fraction": 0.005,
                      "data": {"dataset": "synthetic", "partition": "natural", "num_clients": 2000, "rho": 1.0,
                               "holdout_fraction": 0.0, "lazy": True, "test_devices": 5}}),
    ],
    ids=["fedadam-loop", "time-attention-adafl-sampler", "dropout-vmap", "dropout-loop", "robust-bucketed-clipping-host",
         "lazy-synthetic-scaffold"],
)
def test_resume_from_a_middle_checkpoint_is_bit_identical(tmp_path, algorithm, extra):
    """Resume from the round-3 file of a run that kept every checkpoint (save_top_k=-1)."""
    keep_all = {"callbacks": [{"class_path": "lfed.lightning.checkpoint.RoundCheckpoint",
                               "init_args": {"dirpath": str(tmp_path / "ckpts"), "every_n_train_steps": 3, "save_top_k": -1}}]}
    config = write_config(tmp_path / "cfg.yaml", algorithm, trainer=keep_all, **extra)
    want = run_state(fit(config))
    middle = tmp_path / "ckpts" / "epoch=0-step=3.ckpt"
    assert load(middle)["global_step"] == 3
    got = run_state(fit(config, "--ckpt_path", str(middle)))
    assert_same_state(got, want)


# ----------------------------------------------------------------------------- another run's checkpoint


@pytest.fixture(scope="module")
def fedavg_checkpoint(tmp_path_factory) -> Path:
    """last.ckpt of a 2-round FedAvg run (10 clients, MLP 64-16-10, Dirichlet 0.5, seed 0)."""
    root = tmp_path_factory.mktemp("fedavg")
    fit(write_config(root / "cfg.yaml", "fedavg", rounds=2, every=2))
    return checkpoint_dir(root / "run") / "last.ckpt"


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"data": {"num_clients": 8}}, ["data.num_clients: checkpoint 10, this run 8"]),
        ({"algorithm": "scaffold"}, [
            "composition.algorithm: checkpoint 'fedavg', this run 'scaffold'",
            "composition.objective: checkpoint 'plain', this run 'scaffold'",
            "composition.weighting: checkpoint 'size', this run 'uniform'",
        ]),
        ({"hidden": [32]}, [
            "model.num_params: checkpoint 1210, this run 2410",  # 64*16+16+16*10+10 vs 64*32+32+32*10+10
            "model.parameters: checkpoint net.0.weight[16, 64] (entry 0), this run net.0.weight[32, 64] (entry 0)",
        ]),
        ({"data": {"partition": "iid"}}, ["data.partition: checkpoint 'dirichlet', this run 'iid'", "data.client_indices_hash: checkpoint '"]),
        ({"data": {"seed": 1}}, ["data.seed: checkpoint 0, this run 1", "data.client_indices_hash"]),
        ({"server_optimizer": {"class_path": "lfed.server.optimizers.FedAdam", "init_args": {"lr": 0.01}}},
         ["composition.server_optimizer: checkpoint 'torch.optim.sgd.SGD', this run 'lfed.server.optimizers.FedAdam'"]),
    ],
    ids=["num_clients", "algorithm", "model", "partition", "partition-seed", "server-optimizer"],
)
def test_a_checkpoint_of_another_run_is_refused_naming_each_difference(tmp_path, fedavg_checkpoint, change, expected):
    change = dict(change)
    algorithm = change.pop("algorithm", "fedavg")
    config = write_config(tmp_path / "cfg.yaml", algorithm, rounds=4, every=2, **change)
    with pytest.raises(ValueError, match="was made by a different run and does not match this configuration") as info:
        fit(config, "--ckpt_path", str(fedavg_checkpoint))
    message = str(info.value)
    for line in expected:
        assert line in message, message
    differing = [ln for ln in message.splitlines() if ln.startswith("  ")]
    assert len(differing) >= len(expected)


def test_changed_hyperparameters_resume_with_a_warning(tmp_path, fedavg_checkpoint):
    config = write_config(tmp_path / "cfg.yaml", "fedavg", rounds=3, every=3, training={"client_lr": 0.1})
    with pytest.warns(ResumeWarning, match=r"client_lr: 0.05 -> 0.1.*not an exact continuation"):
        cli = fit(config, "--ckpt_path", str(fedavg_checkpoint))
    assert cli.trainer.global_step == 3


def test_datamodule_refuses_another_partition():
    a = FederatedDataModule("digits", num_clients=10, partition="dirichlet", rho=0.5, seed=0)
    b = FederatedDataModule("digits", num_clients=10, partition="dirichlet", rho=0.1, seed=0)
    a.load_state_dict(a.state_dict())  # the same split loads
    with pytest.raises(ValueError) as info:
        b.load_state_dict(a.state_dict())
    assert "data.rho: checkpoint 0.5, this run 0.1" in str(info.value)
    assert "data.client_indices_hash" in str(info.value)


def test_verify_fingerprint_compares_shared_keys_only():
    saved = {"composition.algorithm": "fedavg", "model.num_params": 10, "hparams.client_lr": 0.1, "data.seed": 0}
    verify_fingerprint(saved, {"composition.algorithm": "fedavg", "model.num_params": 10, "hparams.client_lr": 0.1})
    with pytest.raises(ValueError) as info:
        verify_fingerprint(saved, {"composition.algorithm": "igfl", "model.num_params": 11, "hparams.client_lr": 0.1})
    lines = [ln for ln in str(info.value).splitlines() if ln.startswith("  ")]
    assert lines == [
        "  composition.algorithm: checkpoint 'fedavg', this run 'igfl'",
        "  model.num_params: checkpoint 10, this run 11",
    ]
    with pytest.warns(ResumeWarning, match="no lfed run fingerprint"):
        verify_fingerprint(None, saved)


# ----------------------------------------------------------------------------- divergence guard


def _digits_module(backend: str, **kwargs) -> FederatedModule:
    from lfed.models.zoo import MLP

    torch.manual_seed(0)
    return FederatedModule(MLP(64, [16], 10), fraction=0.3, training=dict(client_lr=0.05, batch_size=10, local_steps=3),
                           engine=dict(backend=backend), seed=0, **kwargs)


def _digits_data() -> FederatedDataModule:
    ds = load_dataset("digits")
    return FederatedDataModule.from_tensors(ds.train_x, ds.train_y, ds.test_x, ds.test_y,
                                            num_clients=10, partition="dirichlet", rho=0.5, seed=0)


def _first_round(client: int, rounds: int, num_clients: int = 10, fraction: float = 0.3) -> int | None:
    """The first round in which the module's uniform sampler picks ``client`` (same draws as the module)."""
    sampler = UniformSampler()
    sampler.setup(torch.ones(num_clients))
    k = cohort_size(fraction, num_clients)
    for r in range(rounds):
        ids, _ = sampler.sample(r, k, round_generator(0, r, "sample"))
        if client in ids.tolist():
            return r
    return None


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_nan_in_one_clients_data_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, backend):
    rounds = 8
    first = {c: _first_round(c, rounds) for c in range(10)}
    client = min(c for c, r in first.items() if r is not None and r >= 2)
    r0 = first[client]  # the client first trains in round r0 >= 2: rounds 0..r0-1 are clean

    data = _digits_data()
    d = data.build()
    d.train_x[d.client_index[client, : d.client_sizes[client]]] = float("nan")  # all its training examples
    ckpt = RoundCheckpoint(dirpath=tmp_path, every_n_train_steps=1)
    trainer = Trainer(max_steps=rounds, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, callbacks=[ckpt], plugins=[AtomicCheckpointIO()])
    with pytest.raises(FloatingPointError, match=rf"round {r0}: training losses contain NaN or Inf from clients \[{client}\]"):
        trainer.fit(_digits_module(backend), datamodule=data)

    saved = load(tmp_path / "last.ckpt")
    assert saved["global_step"] == r0  # written after round r0 - 1, not overwritten by the bad round
    clean = _digits_module(backend)
    from conftest import run_rounds

    run_rounds(clean, _digits_data(), r0, precision="32-true")
    for name, value in clean.state_dict().items():
        assert torch.equal(saved["state_dict"][name], value), name
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values() if v.is_floating_point())


# ----------------------------------------------------------------------------- atomic writes


def test_atomic_io_round_trip_leaves_no_temporary_file(tmp_path):
    io = AtomicCheckpointIO()
    io.save_checkpoint({"x": torch.arange(3)}, tmp_path / "sub" / "a.ckpt")
    assert torch.equal(io.load_checkpoint(tmp_path / "sub" / "a.ckpt")["x"], torch.arange(3))
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["a.ckpt"]


class _FailingIO(AtomicCheckpointIO):
    def _write(self, checkpoint, f):
        f.write(b"partial")
        raise OSError("disk full")


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    AtomicCheckpointIO().save_checkpoint({"round": 1}, tmp_path / "last.ckpt")
    with pytest.raises(OSError, match="disk full"):
        _FailingIO().save_checkpoint({"round": 2}, tmp_path / "last.ckpt")
    assert load(tmp_path / "last.ckpt") == {"round": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_a_dead_processs_temporary_file_is_removed_by_the_next_save(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    (tmp_path / f".last.ckpt.tmp-{dead}").write_bytes(b"half a checkpoint")
    (tmp_path / f".last.ckpt.tmp-{os.getpid()}-other").write_bytes(b"not ours to judge")
    AtomicCheckpointIO().save_checkpoint({"round": 3}, tmp_path / "last.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".last.ckpt.tmp-{os.getpid()}-other", "last.ckpt"]


def test_round_checkpoint_refuses_non_atomic_or_mid_round_saves():
    with pytest.raises(ValueError, match="save_last: 'link'"):
        RoundCheckpoint(save_last="link")
    with pytest.raises(ValueError, match="save_on_exception"):
        RoundCheckpoint(save_on_exception=True)


def _cli_trainer(tmp_path, *args):
    from lfed.lightning.cli import LfedCLI

    cli = LfedCLI(FederatedModule, FederatedDataModule, run=False,
                  args=["--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path), *args])
    return cli.trainer


def test_cli_installs_an_atomic_last_checkpoint_every_n_rounds_by_default(tmp_path):
    trainer = _cli_trainer(tmp_path, "--checkpoint_every", "7")
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    [ckpt] = [c for c in trainer.callbacks if isinstance(c, RoundCheckpoint)]
    assert ckpt.every_n_rounds == 7 and ckpt.save_last is True and ckpt.save_top_k == 0
    assert Path(ckpt.dirpath) == checkpoint_dir(tmp_path)  # the run's own directory
    assert Path(ckpt.dirpath).parent.parent.parent == tmp_path / "runs"
    assert _cli_trainer(tmp_path / "second").checkpoint_callback.every_n_rounds == 10


def test_cli_checkpoint_default_steps_aside(tmp_path):
    assert not [c for c in _cli_trainer(tmp_path, "--checkpoint_every", "0").callbacks if isinstance(c, RoundCheckpoint)]
    assert _cli_trainer(tmp_path, "--trainer.enable_checkpointing", "false").checkpoint_callback is None
    own = _cli_trainer(tmp_path, "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_train_steps=3")
    assert [type(c).__name__ for c in own.checkpoint_callbacks] == ["ModelCheckpoint"]


def test_install_atomic_io_leaves_a_users_checkpoint_io_alone():
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    class Mine(TorchCheckpointIO):
        pass

    default = Trainer(accelerator="cpu", logger=False)
    assert install_atomic_io(default.strategy) and isinstance(default.strategy.checkpoint_io, AtomicCheckpointIO)
    mine = Trainer(accelerator="cpu", logger=False, plugins=[Mine()])
    assert not install_atomic_io(mine.strategy) and type(mine.strategy.checkpoint_io) is Mine


# ----------------------------------------------------------------------------- composition checks


def _warnings_for(algorithm: str, num_clients: int = 100, total_rounds: int = 500, **given) -> list[str]:
    from lfed.core.settings import RunSettings

    s = RunSettings(algorithm=algorithm, **given)  # the roles, and the stragglers group
    roles = {k: getattr(s, k) for k in algorithms.ROLES}
    components = algorithms.build(algorithms.resolve(algorithm, **roles), s.stragglers)
    explicit = {k for k, v in roles.items() if v is not None}
    return algorithms.validate_composition(components, explicit, num_clients=num_clients, total_rounds=total_rounds)


@pytest.mark.parametrize("algorithm", sorted(algorithms.PRESETS))
def test_every_preset_is_a_sensible_composition(algorithm):
    assert _warnings_for(algorithm) == []


@pytest.mark.parametrize(
    "algorithm, settings, expected",
    [
        ("fedavg", {"channel": 1.0}, "not the identity"),
        ("efl", {"partial_work": "scale"}, "p_incomplete=0 makes every active client complete"),
        ("fedavg", {"partial_work": "drop"}, "same as 'keep'"),
        ("igfl", {"weighting": "dwfed"}, "weighting has no effect"),
        ("fedprox", {"objective": Prox(mu=0.0)}, "plain local SGD"),
        ("efl", {"objective": EFL(lam=0.0)}, "Fisher report"),
        ("adafl", {"fraction": 1.0}, "AdaFL scores change nothing"),
        # 10 rounds of 10 of 100 clients: 100 participations, 1 per client on average
        ("igfl_s_time", {"total_rounds": 10}, "1 participations on average"),
    ],
)
def test_compositions_that_make_no_sense_are_explained(algorithm, settings, expected):
    settings = dict(settings)
    total = settings.pop("total_rounds", 500)
    [message] = _warnings_for(algorithm, total_rounds=total, **settings)
    assert expected in message


def test_time_attention_with_enough_rounds_is_fine_and_all_inactive_is_refused():
    # 20 rounds of 10 of 100 clients: 2 participations per client on average (the threshold)
    assert _warnings_for("igfl_s_time", total_rounds=20) == []
    with pytest.raises(ValueError, match="p_inactive: 1.0"):
        _warnings_for("fedavg", stragglers=Stragglers(p_inactive=1.0))


def test_the_module_warns_about_its_composition_at_fit_start():
    with pytest.warns(algorithms.CompositionWarning, match="not the identity"):
        from conftest import run_rounds

        run_rounds(_digits_module("vmap", channel=1.0), _digits_data(), 1)
