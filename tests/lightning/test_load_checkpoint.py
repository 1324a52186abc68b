"""A trained model back in Python (issue 66 item 5): ``FederatedModule.load_from_checkpoint(path)`` of a checkpoint that
``lfed fit`` wrote builds the run from the settings the checkpoint records, sets it up on its own data and restores it:
``module.net`` scores what the run scored, and a Trainer's evaluation of it gives the run's own test accuracy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lfed.lightning.module import FederatedModule

CONFIG = """\
seed_everything: 0
model:
  algorithm: scaffold
  net:
    class_path: lfed.models.zoo.MLP
    init_args: {in_features: 64, hidden: [16], num_classes: 10}
  fraction: 0.5
  training: {client_lr: 0.1, batch_size: 10, local_epochs: 1}
data:
  dataset: digits
  num_clients: 10
  partition: dirichlet
  rho: 0.5
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """2 rounds of SCAFFOLD on digits with ``lfed fit``: its checkpoint and the test accuracy it logged."""
    from lfed.lightning.cli import run_cli

    root = tmp_path_factory.mktemp("fit")
    config = root / "config.yaml"
    config.write_text(CONFIG)
    cli = run_cli(["fit", "--config", str(config), "--trainer.max_steps=2", "--trainer.val_check_interval=2",
                   "--trainer.accelerator=cpu", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
                   f"--trainer.default_root_dir={root}"])
    [ckpt] = Path(root).glob("runs/*/version_0/checkpoints/last.ckpt")
    return ckpt, float(cli.trainer.callback_metrics["test/acc"])


def test_a_checkpoint_of_lfed_fit_loads_in_python_and_scores_the_runs_test_accuracy(trained):
    from lightning.pytorch import Trainer

    ckpt, fit_acc = trained
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    module = FederatedModule.load_from_checkpoint(ckpt)
    assert module.algorithm == "scaffold" and module.datamodule.num_clients == 10
    state = module.state_dict()
    assert state.keys() == saved.keys()  # the net and every component's state (SCAFFOLD's controls), nothing left out
    for key, value in saved.items():
        assert torch.equal(state[key], value), key
    data = module.datamodule.build()  # the trained net by hand, no Trainer: the run's test accuracy
    with torch.no_grad():
        correct = (module.net(data.test_x.to(next(module.net.parameters()).dtype)).argmax(1) == data.test_y).sum()
    assert float(correct) / len(data.test_y) == pytest.approx(fit_acc, abs=1e-6)
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    [scores] = trainer.test(module, datamodule=module.datamodule, verbose=False)
    assert scores["test/acc"] == fit_acc
    for key, value in saved.items():  # the Trainer's set-up allocated the state afresh; the checkpoint's came back
        assert torch.equal(module.state_dict()[key].cpu(), value), key


def test_loading_names_what_it_needs_when_the_checkpoint_records_no_settings(trained, tmp_path):
    ckpt, _ = trained
    bare = torch.load(ckpt, map_location="cpu", weights_only=True)
    del bare["lfed_config"]  # as a Trainer in Python writes it (no `lfed fit` settings)
    torch.save(bare, tmp_path / "bare.ckpt")
    with pytest.raises(ValueError, match=r"^datamodule: .*bare.ckpt records no data settings"):
        FederatedModule.load_from_checkpoint(tmp_path / "bare.ckpt")
    from lfed.lightning.datamodule import FederatedDataModule
    from lfed.models.zoo import MLP

    given = FederatedModule.load_from_checkpoint(tmp_path / "bare.ckpt", net=MLP(64, [16], 10), datamodule=FederatedDataModule(
        dataset="digits", num_clients=10, partition="dirichlet", rho=0.5))  # its hyperparameters, the net and data given
    assert given.algorithm == "scaffold" and torch.equal(given.objective.control, bare["state_dict"]["objective.control"])
    with pytest.raises(ValueError, match=r"^hparams_file: not used"):
        FederatedModule.load_from_checkpoint(ckpt, hparams_file="hparams.yaml")
