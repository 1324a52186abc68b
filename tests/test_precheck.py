"""The pre-check of ``lfed fit|validate|test`` (lfed/precheck.py, issue 66): a settings mistake said in the full
command's words before torch and Lightning are imported; its tables are the real parser's; it refuses nothing the full
command accepts (every shipped config, abbreviated options, a component's settings, lfed 0.3's keys)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import typing

import pytest
from conftest import REPO

from lfed.precheck import precheck, tables

QUICKSTART = str(REPO / "configs" / "quickstart.yaml")

#: Mistakes of every kind the pre-check sees: each is said as the full command says it (test_the_full_command_says_the_same).
MISTAKES: list[list[str]] = [
    ["--model.algorithm", "fedprx"],
    ["--model.algorithm=fedprx"],
    ["--model.partial_work", "kep"],
    ["--model.engine.backend", "vmpa"],
    ["--model.fractoin", "0.1"],
    ["--model.training.client_lrr", "0.1"],
    ["--model.trainingg.client_lr", "0.1"],
    ["--data.datset", "mnist"],
    ["--trainer.max_stepz", "10"],
    ["--trainer.foo.bar", "3"],
    ["--seed_everythinx", "3"],
    ["--modle.fraction", "0.1"],
    ["--model.fractoin", "0.1", "--model.algorithm", "fedprx"],  # a name is said as the parser meets it, a key at the end
    ["--model.fraction", "1.5"],
    ["--model.fraction", "2"],
    ["--model.fraction", "0"],
    ["--model.training.client_lr", "0"],
    ["--model.training.batch_size", "0"],
    ["--model.training.local_steps", "0"],
    ["--model.stragglers.p_inactive", "2"],
    ["--model.engine.chunk_size", "0"],
    ["--data.num_clients", "0"],
    ["--data.num_clients", "-3"],
    ["--data.holdout_fraction", "1"],
    ["--data.validation_fraction", "1.5"],
    ["--data.eval_batch_size", "0"],
    ["--data.partition", "dirichelt"],
    ["--data.rho", "0"],
    ["--data.shards_per_client", "0"],
    ["--data.dataset", "mnsit"],
    ["--trainer.max_steps", "0"],
    ["--trainer.max_steps", "-1", "--trainer.max_epochs", "3"],
    ["--data.num_clients", "0", "--model.fraction", "1.5"],  # the model's settings are checked first
]

#: Config files with a mistake: ``name -> text``.
BAD_FILES = {
    "unknown_key.yaml": "model:\n  algorithm: fedavg\n  fractoin: 0.2\ndata:\n  dataset: digits\n",
    "unknown_section.yaml": "modle:\n  fraction: 0.5\n",
    "unknown_deep.yaml": "model:\n  trainingg:\n    client_lr: 0.1\n    batch_size: 3\n",
    "unknown_group_field.yaml": "model:\n  training:\n    client_lrr: 0.1\n",
    "unknown_top.yaml": "seed_everythin: 3\n",
    "bad_values.yaml": "model:\n  fraction: 1.5\ndata:\n  dataset: digits\n  num_clients: 0\n",
    "bad_name.yaml": "model:\n  algorithm: scafold\n",
    "bad_dataset.yaml": "data:\n  dataset: cifar\n",
    "bad_trainer.yaml": "trainer:\n  max_steps: 0\n",
    "tab.yaml": "model:\n\talgorithm: fedavg\n",
    "unclosed.yaml": "model: {algorithm: fedavg\n",
}


def _full(args: list[str]) -> str:
    """What the full command (Lightning's parser, lfed's checks) says of ``args``; it must refuse them."""
    os.environ.setdefault("WANDB_MODE", "disabled")
    from lfed.lightning.cli import ConfigError, LfedCLI
    from lfed.lightning.datamodule import FederatedDataModule
    from lfed.lightning.module import FederatedModule

    with pytest.raises(ConfigError) as refused:
        LfedCLI(FederatedModule, FederatedDataModule, save_config_kwargs={"overwrite": True}, config_errors=True, args=args)
    return str(refused.value)


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("precheck")
    for name, text in BAD_FILES.items():
        (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize("extra", MISTAKES, ids=" ".join)
def test_the_full_command_says_the_same(extra, tmp_path, monkeypatch):
    """Each mistake: the pre-check's line is the full command's, word for word (so neither can drift from the other)."""
    monkeypatch.chdir(tmp_path)  # a run that started by mistake would write here
    args = ["fit", "--config", QUICKSTART, *extra]
    said = precheck(args)
    assert said is not None, args
    assert said == _full(args)


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_config_files_mistake_is_said_as_the_full_command_says_it(name, bad_files, monkeypatch):
    monkeypatch.chdir(bad_files)  # the file by a relative name, as a user types it
    args = ["fit", "--config", name]
    said = precheck(args)
    assert said is not None, name
    assert said == _full(args)


def test_a_missing_config_file_is_said_as_the_full_command_says_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args in (["fit", "--config", "nope.yaml"], ["test", "--config", "../nope.yaml", "--ckpt_path", "x.ckpt"],
                 ["fit", "--config", "nope.yaml", "--model.algorithm", "fedprx"]):  # the file is read first: its line
        said = precheck(args)
        assert said is not None and said.startswith("config: File does not exist: "), args
        assert said == _full(args)


def test_a_name_before_a_missing_file_is_said_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    said = precheck(["fit", "--model.algorithm", "fedprx", "--config", "nope.yaml"])
    assert said is not None and said.startswith("model.algorithm: expected one of 'fedavg'")


def _configs() -> list[str]:
    """Every config of ``lfed fit`` in configs/ (configs/paper/grids/ holds studies of benchmarks/studies/paper_protocol.py)."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").rglob("*.yaml")
                  if not p.is_relative_to(REPO / "configs" / "paper" / "grids"))


def test_every_shipped_config_passes():
    """Never refuse what the full command accepts: every config of configs/ (and its subfolders), with each command;
    a study file of configs/paper/grids/ is no config of ``lfed fit`` (its ``title:`` is refused)."""
    assert len(_configs()) > 30
    for config in _configs():
        for command in ("fit", "validate", "test"):
            assert precheck([command, "--config", str(REPO / config)]) is None, (command, config)
    study = REPO / "configs" / "paper" / "grids" / "adafl_uploads.yaml"
    assert "title: not a setting of lfed fit" in precheck(["fit", "--config", str(study)])


@pytest.mark.parametrize("extra", [
    ["--model.frac", "0.5"],  # an abbreviated option: argparse takes it (or says it is ambiguous)
    ["--trainer.max_step", "10"],
    ["--seed_everyth", "3"],
    ["--model.objective", "prox", "--model.objective.init_args.mu", "0.1"],  # a component's settings: the parser's
    ["--model.objective.mu", "0.5"],
    ["--model.objective", "Prox"],  # a class name, not a preset name: the parser resolves it
    ["--model.net", "MLP"],
    ["--model.client_lr", "0.1"],  # lfed 0.3's key: the full command names its new key
    ["--optimizer", "torch.optim.SGD"],  # refused by the full command in its own words
    ["--model.fraction", "0.5", "--data.num_clients", "10", "--trainer.max_steps", "5"],
    ["--model.fraction", "1"],
    ["--model.training.batch_size", "null"],
    ["--model.training.local_steps", "5"],
    ["--model.seed", "-1"],
    ["--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping"],
    ["--trainer.logger.init_args.save_dir", "logs"],
    ["--data.dataset", "mnist", "--data.partition", "shards"],
    ["--trainer.max_steps", "0", "--trainer.max_time", "00:00:01:00"],
    ["--print_config"],
    ["--help"],
    ["--ckpt_path", "last"],
    ["--config", "{model: {fraction: 0.5}}"],  # a config given as its text, not a file
    ["--data.dataset", "custom", "--data.train.class_path", "my.Data", "--data.test.class_path", "my.Data"],  # your data
    ["--model.fraction.class_path", "lfed.participation.sampling.StepwiseFraction", "--model.fraction.init_args.start",
     "0.1"],
])
def test_what_the_full_command_accepts_or_reads_itself_passes(extra):
    assert precheck(["fit", "--config", QUICKSTART, *extra]) is None


def test_validate_and_test_take_their_values_from_the_checkpoint():
    """An evaluation's model and data settings are the checkpoint's: only the parser's mistakes are said for them."""
    assert precheck(["test", "--ckpt_path", "x.ckpt", "--data.num_clients", "0"]) is None
    assert precheck(["validate", "--ckpt_path", "x.ckpt", "--verbose", "false"]) is None  # Trainer.validate's own
    assert precheck(["fit", "--config", QUICKSTART, "--verbose", "false"]).startswith("verbose: not a setting of lfed fit")
    assert precheck(["test", "--ckpt_path", "x.ckpt", "--model.fractoin", "0.1"]).startswith("model.fractoin: not a setting of lfed test")


def test_a_source_it_cannot_read_leaves_everything_to_the_full_command(monkeypatch):
    import lfed.precheck as pc

    def moved():
        raise LookupError("FederatedModule not found")

    monkeypatch.setattr(pc, "tables", moved)
    assert precheck(["fit", "--config", QUICKSTART, "--model.algorithm", "fedprx"]) is None


def _parser(command: str):
    """The full command's parser of ``command`` (built, nothing parsed)."""
    from lfed.lightning.cli import LfedCLI
    from lfed.lightning.datamodule import FederatedDataModule
    from lfed.lightning.module import FederatedModule

    class Built(Exception):
        pass

    def stop(self, parser, args):
        raise Built(parser)

    original = LfedCLI.parse_arguments
    LfedCLI.parse_arguments = stop
    try:
        LfedCLI(FederatedModule, FederatedDataModule, args=[command])
    except Built as built:
        return built.args[0]
    finally:
        LfedCLI.parse_arguments = original
    raise AssertionError("the parser was not built")


def test_its_tables_are_the_real_ones():
    """What the pre-check reads from the sources is what the parser, the registry and the data know."""
    from lfed.core import registry
    from lfed.core.groups import Engine
    from lfed.core.settings import DEPRECATED
    from lfed.data.datasets import DATASETS
    from lfed.data.partition import PARTITIONS
    from lfed.lightning.cli_errors import known_keys
    from lfed.server.weight_formulas import PARTIAL_WORK

    t = tables()
    for command in ("fit", "validate", "test"):
        parser = _parser(command)
        assert set(t.known()) == {k for k in known_keys(parser, [command]) if not k.endswith(".help")}, command
        own = parser._subcommands_action._name_parser_map[command]
        options = {o[2:] for a in own._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
        assert set(t.top_level[command]) == {o for o in options if "." not in o}, command
    assert t.literals["model.algorithm"] == (tuple(registry.PRESETS), False)
    assert t.literals["model.partial_work"] == (PARTIAL_WORK, True)
    assert t.literals["model.engine.backend"] == (typing.get_args(typing.get_type_hints(Engine)["backend"]), False)
    assert t.literals["model.engine.client_state"][0] == typing.get_args(typing.get_type_hints(Engine)["client_state"])
    assert t.deprecated == DEPRECATED
    assert t.datasets == DATASETS and t.partitions == PARTITIONS


def test_a_mistake_imports_neither_torch_nor_lightning(bad_files):
    """``lfed fit --config configs/quickstart.yaml --model.algorithm fedprx``, as the console script runs it: one line,
    exit status 2, and neither torch nor Lightning in ``sys.modules``; a config file's mistake too."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    env.pop("LFED_DEBUG", None)
    code = ("import sys, runpy; sys.argv = ['lfed', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('lfed', run_name='__main__')\n"
            "finally:\n    print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'lightning'}), file=sys.stderr)")
    for extra in (["--model.algorithm", "fedprx"], ["--model.fraction", "1.5"], ["--data.num_clients", "0"],
                  ["--model.fractoin", "0.1"], ["--config", str(bad_files / "unknown_key.yaml")],
                  ["--config", str(bad_files / "bad_values.yaml")], ["--config", str(bad_files / "missing.yaml")]):
        done = subprocess.run([sys.executable, "-c", code, "fit", "--config", QUICKSTART, *extra], capture_output=True,
                              text=True, env=env, timeout=120, cwd=REPO)
        lines = done.stderr.splitlines()
        assert done.returncode == 2, done.stderr
        assert len(lines) == 2 and lines[0].startswith("lfed fit: error: "), done.stderr
        assert lines[1] == "[]", done.stderr


def test_every_documented_command_passes(monkeypatch):
    """Every ``lfed fit|validate|test`` command of README.md, docs/ and the configs' headers (the ones
    tests/repo/test_doc_commands.py parses and runs as printed): none is refused."""
    sys.path.insert(0, str(REPO / "tests" / "repo"))
    try:
        from test_doc_commands import _commands
    finally:
        sys.path.remove(str(REPO / "tests" / "repo"))

    monkeypatch.chdir(REPO)
    commands = [shlex.split(c)[1:] for _, c in _commands(bare_configs=True)]
    commands = [c for c in commands if c[0] in ("fit", "validate", "test")]
    assert len(commands) > 20
    for words in commands:
        assert precheck(words) is None, words
