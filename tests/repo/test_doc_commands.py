"""Every ``lfed`` command of the README, the docs and the headers of the configs and sweeps that names a file of this repository is checked as printed
(issue 51): copied out of the Markdown (a command continued with ``\\`` joined, a trailing ``# comment`` dropped), its
config files and sweep files exist, and ``lfed fit`` parses every flag of it against the code (``--print_config``, in
this process); a ``lfed grid`` or ``lfed audit`` command's own flags are parsed by its own parser and the rest as ``lfed
fit``'s. A command with a placeholder (``X``, ``<...>``, ``...``, a file a walk-through writes first) is not a command
to run as printed; docs/extending.md's walk-through runs verbatim in test_extending.py."""

from __future__ import annotations

import re
import shlex

import pytest
from conftest import REPO

from lfed.lightning.cli import run_cli

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "configs").rglob("*.yaml")),
        *sorted((REPO / "sweeps").glob("*.yaml"))]  # the configs' and sweeps' own headers say how to run them


def _commands() -> list[tuple[str, str]]:
    out = []
    for path in DOCS:
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
            if re.fullmatch(r"lfed fit --config configs/[\w/]+\.yaml", command):
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
