"""The ``lfed`` command's dispatch (lfed/entry.py): its own help, without Lightning; an unknown command in one line
(issue 51 item 11); ``lfed --version`` and ``lfed plot`` without Lightning or torch, the README's ``lfed plot`` as printed
(issue 66)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import REPO


def _lfed(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    code = ("import sys, runpy; sys.argv = ['lfed', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('lfed', run_name='__main__')\n"
            "finally:\n    print('LIGHTNING_IMPORTED' if 'lightning' in sys.modules else 'NO_LIGHTNING', file=sys.stderr)\n"
            "    print('TORCH_IMPORTED' if 'torch' in sys.modules else 'NO_TORCH', file=sys.stderr)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("args", [["--help"], ["-h"]])
def test_lfed_help_lists_lfeds_commands_without_importing_lightning(args):
    done = _lfed(*args)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "usage: lfed {fit,validate,test,grid,audit,plot} [--help] [--version] ..."
    assert "Lightning Trainer command line tool" not in done.stdout and "predict" not in done.stdout
    assert [ln.split()[0] for ln in lines if ln.startswith("  ") and not ln.startswith("   ")] == ["fit", "validate", "test", "grid", "audit", "plot"]
    assert "NO_LIGHTNING" in done.stderr and "NO_TORCH" in done.stderr  # instant: the help of the commands needs none of them


def test_lfed_without_a_command_shows_the_commands_and_exit_2():
    done = _lfed()
    assert done.returncode == 2 and done.stdout.startswith("usage: lfed {fit,validate,test,grid,audit,plot}")


def test_an_unknown_command_is_one_line():
    done = _lfed("predict")
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == ("lfed: error: 'predict' is not a command; the commands are fit, validate, test, "
                                           "grid, audit and plot (lfed --help)")


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_lfed_version_is_one_line_of_lfed_torch_and_lightning_without_importing_them(flag):
    from importlib.metadata import version

    import lfed

    done = _lfed(flag)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"lfed {lfed.__version__}, torch {version('torch')}, lightning {version('lightning')}"]
    assert re.fullmatch(r"lfed \S+, torch \d+\.\d+\S*, lightning \d+\.\d+\S*\n", done.stdout)
    assert "NO_LIGHTNING" in done.stderr and "NO_TORCH" in done.stderr


def _write_runs(root):
    """Three hand-written runs as the README's comparison leaves them under ``runs/``."""
    for name, acc in (("fedavg-digits-aaa", 0.5), ("fedprox-digits-bbb", 0.25), ("scaffold-digits-ccc", 0.75)):
        folder = root / "runs" / name / "version_0"
        folder.mkdir(parents=True)
        (folder / "metrics.csv").write_text(f"step,rounds_done,test/acc,test/loss\n0,1,,\n1,2,{acc},2.0\n")


def test_lfed_plot_draws_without_lightning_or_torch(tmp_path):
    _write_runs(tmp_path)
    done = _lfed("plot", str(tmp_path / "runs"), "-o", str(tmp_path / "c.png"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"lfed plot: wrote {tmp_path / 'c.png'} (test/acc of 3 runs)"]
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert "NO_LIGHTNING" in done.stderr and "NO_TORCH" in done.stderr  # it reads CSV files: no second of start-up


def test_the_readmes_plot_command_runs_as_printed(tmp_path, monkeypatch, capsys):
    """README.md's comparison: its ``lfed plot`` line, run through the entry point over the runs its ``lfed fit`` lines
    leave (tests/repo/test_doc_commands.py runs those), draws their curves into the file it names."""
    from lfed.entry import main

    text = (REPO / "README.md").read_text()
    commands = [c.split("  #")[0].strip() for c in re.findall(r"^(lfed plot [^\n]*)$", text, flags=re.M)]
    assert commands and all("runs/" in c for c in commands), commands
    _write_runs(tmp_path)
    monkeypatch.chdir(tmp_path)
    for command in commands:
        words = shlex.split(command)
        monkeypatch.setattr(sys, "argv", words)
        main()
        out = words[words.index("-o") + 1]
        assert (tmp_path / out).read_bytes()[:4] == b"\x89PNG"
        assert capsys.readouterr().out.splitlines() == [f"lfed plot: wrote {out} (test/acc, test/loss of 3 runs)"]


def test_help_and_docstrings_cite_docs_not_a_file_users_do_not_have():
    """``SPEC.md`` is the team's; lfed's help texts (its docstrings) and docs cite docs/algorithms.md's sections."""
    found = [f"{p.relative_to(REPO)}:{i}" for p in sorted((REPO / "lfed").rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if "SPEC" in line]
    found += [f"{p.relative_to(REPO)}:{i}" for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
              if p.name != "algorithms.md" for i, line in enumerate(p.read_text().splitlines(), 1) if "SPEC §" in line]
    assert not found, found


def test_as_the_program_it_freezes_the_objects_left_for_a_quick_exit_and_not_when_called(monkeypatch, capsys):
    """``gc.freeze()`` at the end of the ``lfed`` program (the interpreter's shutdown then skips collecting the imports'
    millions of objects: 1.5 to 2 CPU s a command, issue 66); a call from a test or a notebook leaves the collector alone."""
    import gc
    import types

    from lfed import entry

    monkeypatch.setattr(sys, "argv", ["lfed", "--version"])
    before = gc.get_freeze_count()
    with pytest.raises(SystemExit):
        entry.main()  # called from here: pytest's __main__ is not lfed's
    assert gc.get_freeze_count() == before
    program = types.ModuleType("__main__")
    program.main = entry.main  # what the lfed script and python -m lfed import
    monkeypatch.setitem(sys.modules, "__main__", program)
    try:
        with pytest.raises(SystemExit) as stop:
            entry.main()
        assert stop.value.code == 0 and gc.get_freeze_count() > before
    finally:
        gc.unfreeze()
    assert capsys.readouterr().out.count("lfed ") == 2


def test_python_m_lfed_as_the_program_exits_as_before():
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, "-m", "lfed", "--version"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("lfed ") and done.stderr == ""
    done = subprocess.run([sys.executable, "-m", "lfed", "plot", "nowhere"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and done.stderr.splitlines() == ["lfed plot: error: runs: nowhere does not exist"]
