"""The ``lfed`` command's dispatch (lfed/entry.py): its own help, without Lightning; an unknown command in one line
(issue 51 item 11)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO


def _lfed(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    code = ("import sys, runpy; sys.argv = ['lfed', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('lfed', run_name='__main__')\n"
            "finally:\n    print('LIGHTNING_IMPORTED' if 'lightning' in sys.modules else 'NO_LIGHTNING', file=sys.stderr)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("args", [["--help"], ["-h"]])
def test_lfed_help_lists_lfeds_commands_without_importing_lightning(args):
    done = _lfed(*args)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "usage: lfed {fit,validate,test,grid,audit} [--help] ..."
    assert "Lightning Trainer command line tool" not in done.stdout and "predict" not in done.stdout
    assert [ln.split()[0] for ln in lines if ln.startswith("  ") and not ln.startswith("   ")] == ["fit", "validate", "test", "grid", "audit"]
    assert "NO_LIGHTNING" in done.stderr  # instant: the help of the commands needs none of them


def test_lfed_without_a_command_shows_the_commands_and_exit_2():
    done = _lfed()
    assert done.returncode == 2 and done.stdout.startswith("usage: lfed {fit,validate,test,grid,audit}")


def test_an_unknown_command_is_one_line():
    done = _lfed("predict")
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == ("lfed: error: 'predict' is not a command; the commands are fit, validate, test, "
                                           "grid and audit (lfed --help)")


def test_help_and_docstrings_cite_docs_not_a_file_users_do_not_have():
    """``SPEC.md`` is the team's; lfed's help texts (its docstrings) and docs cite docs/algorithms.md's sections."""
    found = [f"{p.relative_to(REPO)}:{i}" for p in sorted((REPO / "lfed").rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if "SPEC" in line]
    found += [f"{p.relative_to(REPO)}:{i}" for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
              if p.name != "algorithms.md" for i, line in enumerate(p.read_text().splitlines(), 1) if "SPEC §" in line]
    assert not found, found
