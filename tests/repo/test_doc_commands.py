"""Every ``lfed`` command of the README, the docs and the headers of the configs and sweeps that names a file of this repository is checked as printed
(issue 51): copied out of the Markdown (a command continued with ``\\`` joined, a trailing ``# comment`` dropped), its
config files and sweep files exist, and ``lfed fit`` parses every flag of it against the code (``--print_config``, in
this process); a ``lfed grid`` or ``lfed audit`` command's own flags are parsed by its own parser and the rest as ``lfed
fit``'s. A command with a placeholder (``X``, ``<...>``, ``...``, a file a walk-through writes first) is not a command
to run as printed; docs/extending.md's walk-through runs verbatim in test_extending.py.

Every command of README.md and docs/*.md is also *run* (test_each_doc_command_runs), in this process through the
``lfed`` entry point, with 2 rounds (``--trainer.max_steps 2 --trainer.val_check_interval 2``), a temporary
``default_root_dir`` (a grid's ``--root``), W&B disabled and ``--data.download false`` (a test downloads nothing). A
command whose data or file is not here, or that asks for a GPU where there is none, must fail with its one clear
line (exit 2); the few a test here cannot run (separate processes, a minute of CPU) are listed in NOT_RUN_HERE with
the reason and where they run. The pages' Python snippets are run here, in their own test file, or listed."""

from __future__ import annotations

import csv
import re
import shlex
import sys

import pytest
import torch
import yaml
from conftest import REPO

from lfed.lightning.cli import run_cli

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "configs").rglob("*.yaml")),
        *sorted((REPO / "sweeps").glob("*.yaml"))]  # the configs' and sweeps' own headers say how to run them


def _commands(pages: list = DOCS, bare_configs: bool = False) -> list[tuple[str, str]]:
    """``(where, command)`` of every command in ``pages`` that can run as printed, each once; ``bare_configs``: also
    ``lfed fit --config configs/x.yaml`` alone."""
    out = []
    for path in pages:
        text = path.read_text()
        text = re.sub(r"\\\n\s*", " ", text)  # a command continued on the next line
        for m in re.finditer(r"(?:^|`|\n)[#\s]*(lfed (?:fit|grid|audit|validate|test) [^`\n]*)", text):
            command = m.group(1).split("  #")[0].split(" # ")[0].strip()
            words = shlex.split(command)
            files = [w for w in words if w.endswith(".yaml")]
            if not files or any(ch in command for ch in "<>") or "..." in command:
                continue  # a placeholder, not a command to run as printed
            if not all((REPO / f).is_file() for f in files):
                continue  # a file a walk-through writes first (docs/extending.md: test_extending.py runs it)
            if not bare_configs and re.fullmatch(r"lfed fit --config configs/[\w/]+\.yaml", command):
                continue  # a config as it is: test_configs.py parses and instantiates every one
            out.append((f"{path.name}: {command}", command))
    return sorted({command: (where, command) for where, command in sorted(out)}.values())  # each command once


COMMANDS = _commands()


def test_the_docs_hold_the_commands_this_test_checks():
    names = " ".join(c for _, c in COMMANDS)
    for config in ("quickstart.yaml", "robust_digits.yaml", "dp_digits.yaml", "personal_digits.yaml", "fedbuff_digits.yaml",
                   "fedavg_mnist.yaml", "lora_shakespeare.yaml"):
        assert config in names, config
    assert any(c.startswith("lfed grid") for _, c in COMMANDS) and any(c.startswith("lfed audit") for _, c in COMMANDS)


@pytest.mark.parametrize("where,command", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_each_doc_command_parses_as_printed(where, command, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(REPO)
    words = shlex.split(command)[1:]
    sub, rest = words[0], words[1:]
    if sub == "grid":
        from lfed.lightning.grid import parser as grid_parser
        from lfed.lightning.sweep import load_sweep

        args, rest = grid_parser().parse_known_args(rest)
        assert load_sweep(args.sweep).points()
        rest = [a for c in args.config for a in ("--config", c)] + rest
    elif sub == "audit":
        from lfed.lightning.audit import parser as audit_parser

        _, rest = audit_parser().parse_known_args(rest)
    if sub in ("validate", "test"):
        rest = [a for a in rest if a != "--ckpt_path"]
    with pytest.raises(SystemExit) as exit_:
        run_cli(["fit", *rest, f"--trainer.default_root_dir={tmp_path}", "--print_config"])
    assert exit_.value.code in (0, None), (where, capsys.readouterr().err[-2000:])
    assert "model:" in capsys.readouterr().out


# ------------------------------------------------------------------------------ each command of the pages, run

#: The pages whose commands are run (2 rounds each).
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUNNABLE = _commands(PAGES, bare_configs=True)

#: What of a command decides that a test here does not run it (a substring of the command), and why: each runs elsewhere
#: or is too long for a test. Every entry must still match a command of the pages (test_not_run_here_lists_doc_commands).
NOT_RUN_HERE = {
    "--trainer.strategy ddp": "DDP starts one process per device (Lightning starts the command again): "
                              "tests/lightning/test_distributed.py runs lfed fit and lfed grid on 2 CPU processes",
    "configs/resnet_synthetic.yaml": "recording a ResNet-20's vmapped step takes 15 to 35 s of a 2-core CPU per command; "
                                     "tests/models/test_resnet.py runs this config (ResNet-18, batch and group norm, 1 round)",
    "configs/personal_femnist.yaml": "2 rounds take 45 to 90 s of a 2-core CPU (105 writers, each one's personal model "
                                     "scored); test_configs.py builds the config",
    "sweeps/igfl_client_lr.yaml": "72 runs on MNIST, 60 s at 2 rounds each; lfed grid runs here with "
                                  "sweeps/quickstart_client_lr.yaml",
    "sweeps/robust_attack_rule.yaml": "60 runs, 15 s at 2 rounds each on a quiet 2-core CPU (60 s under load); lfed grid "
                                      "runs here with sweeps/quickstart_client_lr.yaml, and tests/robust/test_robust_runs.py "
                                      "builds every value of this sweep",
}

#: A file a config reads that a test does not make: the one line of a command without it (docs/adapters.md: the base
#: is written by scripts/pretrain_shakespeare.py).
FILES = {"configs/lora_shakespeare.yaml": ("runs/shakespeare_base/base.pt",
                                          r"model.net.init_args.base_checkpoint: no file at runs/shakespeare_base/base\.pt")}


def _not_run_here(command: str) -> str | None:
    if "--trainer.accelerator gpu" in command and not torch.cuda.is_available():
        return None  # run: it must refuse in one line
    return next((why for key, why in NOT_RUN_HERE.items() if key in command), None)


def _datasets(words: list[str]) -> set[str]:
    """The datasets a command's configs and flags name (a grid's: its sweep's configs too)."""
    names, configs = set(), [w for w in words if w.endswith(".yaml") and not w.startswith("sweeps/")]
    for sweep in (w for w in words if w.startswith("sweeps/")):
        values = yaml.safe_load((REPO / sweep).read_text()).get("parameters", {}).get("config", {}).get("values", [])
        configs += list(values)
    for config in configs:
        data = (yaml.safe_load((REPO / config).read_text()) or {}).get("data") or {}
        if "dataset" in data:
            names.add(data["dataset"])
    names |= {words[i + 1] for i, w in enumerate(words[:-1]) if w == "--data.dataset"}
    names |= {w.split("=", 1)[1] for w in words if w.startswith("--data.dataset=")}
    return names or {"digits"}  # the data module's default


def _missing(dataset: str) -> bool:
    from lfed.data.datasets import load_dataset

    if dataset == "synthetic":  # FedProx's Synthetic: generated from its seed, nothing to find
        return False
    try:
        load_dataset(dataset, None, download=False)
    except FileNotFoundError:
        return True
    return False


def _expected_error(command: str) -> str | None:
    """The one line (a regex) the command must fail with here, or None: it must run."""
    words = shlex.split(command)
    if "--trainer.accelerator gpu" in command and not torch.cuda.is_available():
        return r"trainer\.accelerator: 'gpu' needs a CUDA device and torch sees none"
    for config, (path, line) in FILES.items():
        if config in words and not (REPO / path).is_file():
            return line
    missing = sorted(d for d in _datasets(words) if _missing(d))
    return rf"({'|'.join(missing)}): (missing|no LEAF)" if missing else None


def test_not_run_here_lists_doc_commands():
    """Each entry of NOT_RUN_HERE still names a command of the pages (no stale entry hides a new command), and what a
    test here runs is most of them."""
    for key in NOT_RUN_HERE:
        assert any(key in c for _, c in RUNNABLE), f"NOT_RUN_HERE[{key!r}] matches no command of README.md or docs/"
    run = [c for _, c in RUNNABLE if _not_run_here(c) is None]
    assert len(run) >= 20 and any(c.startswith("lfed grid") for c in run) and any(c.startswith("lfed audit") for c in run)


@pytest.mark.parametrize("where,command", [(w, c) for w, c in RUNNABLE if _not_run_here(c) is None],
                         ids=[w for w, c in RUNNABLE if _not_run_here(c) is None])
def test_each_doc_command_runs(where, command, monkeypatch, capsys, tmp_path):
    """The command as printed, through the ``lfed`` entry point in this process, for 2 rounds: exit 0 and a
    metrics.csv whose last round is 2; or, without its data, file or GPU, exit 2 and its one line."""
    from lfed.entry import main

    monkeypatch.chdir(REPO)  # the pages' paths are relative to the repository root
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.delenv("LFED_DEBUG", raising=False)
    words = shlex.split(command)
    few = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.enable_progress_bar", "false",
           "--trainer.default_root_dir", str(tmp_path), "--data.download", "false"]
    if words[1] == "grid":
        few += ["--root", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", [*words, *few])
    expected = _expected_error(command)
    capsys.readouterr()
    code = 0
    try:
        main()
    except SystemExit as stop:
        code = stop.code or 0
    out, err = capsys.readouterr()
    if expected is not None:
        errors = [line for line in err.splitlines() if "error:" in line]
        assert code == 2 and len(errors) == 1, (where, code, err[-3000:])
        assert re.match(rf"lfed {words[1]}: error: {expected}", errors[0]), (where, errors[0])
        assert "Traceback" not in err
        return
    assert code == 0, (where, err[-3000:])
    tables = sorted(tmp_path.rglob("metrics.csv"))
    assert tables, (where, "no metrics.csv")
    for table in tables:  # a grid: one per run
        with open(table, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("rounds_done")]
        assert rows and max(int(r["rounds_done"]) for r in rows) == 2, (where, table)
        assert any(r.get("test/acc") for r in rows), (where, table, "no evaluation")


# ------------------------------------------------------------------------------ the pages' Python snippets

#: Where each page's Python snippets run; a fragment (a name the page does not define, ``...``) is listed with why.
SNIPPETS = {
    "README.md": "tests/repo/test_readme.py runs both, verbatim and in order",
    "extending.md": "tests/repo/test_extending.py runs the walk-through verbatim",
    "grids.md": "test_the_grids_page_snippet_runs_verbatim, here",
    "adapters.md": "a fragment: MyNet and FederatedModule(..., ...) are the reader's; "
                   "tests/models/test_adapters.py builds LoRA runs",
    "state.md": "a fragment: net is the reader's; tests/state/test_stores.py runs each client_state",
}


def _snippets(page) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


def test_every_python_snippet_of_the_pages_is_run_or_listed():
    have = {page.name for page in PAGES if _snippets(page)}
    assert have == set(SNIPPETS), f"pages with Python snippets: {sorted(have)}; listed: {sorted(SNIPPETS)}"
    for where in SNIPPETS.values():
        test_file = re.match(r"(tests/[\w/]+\.py)", where)
        assert test_file is None or (REPO / test_file.group(1)).is_file(), where


def test_the_grids_page_snippet_runs_verbatim(monkeypatch):
    """docs/grids.md's Python: two runs of the quickstart (60 rounds) trained together; its rows name both, done."""
    (snippet,) = _snippets(REPO / "docs" / "grids.md")
    monkeypatch.chdir(REPO)
    namespace: dict = {}
    exec(compile(snippet, "docs/grids.md", "exec"), namespace)
    rows = namespace["rows"]
    assert [r["model.training.client_lr"] for r in rows] == [0.03, 0.1]
    assert all(r["status"] == "done" and r["rounds"] == 60 for r in rows)
