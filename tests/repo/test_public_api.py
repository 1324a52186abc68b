"""lfed's public API (issue 41): five packages whose ``__all__`` hold what a method's author needs, and
docs/extending.md written against them only, its code run as it stands.

* every name of each package's ``__all__`` imports (lazily: importing the packages loads neither torch
  nor Lightning) and is the defining module's own object;
* docs/extending.md and examples/ import from the five packages only;
* docs/extending.md's Python blocks run in order in a temporary folder (a block whose first line is
  ``# file: NAME`` is written to that file instead; a block after a ``<!-- excerpt -->`` line is a part
  of a larger file and is not run), and its ``lfed fit`` line runs for two rounds.
"""

from __future__ import annotations

import importlib
import inspect
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

PACKAGES = ("lfed", "lfed.client", "lfed.server", "lfed.personal", "lfed.privacy")
DOC = REPO / "docs" / "extending.md"
EXCERPT = "<!-- excerpt -->"
#: The drivers: the only public names that load Lightning.
LIGHTNING_NAMES = {"FederatedDataModule", "FederatedModule", "RunGroup"}  # FederatedData(set): none since 0.5


# ----------------------------------------------------------------------------- the exports
@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_imports(package):
    module = importlib.import_module(package)
    assert list(module.__all__) == sorted(set(module.__all__)), "__all__: sorted, each name once"
    for name in module.__all__:
        value = getattr(module, name)
        if isinstance(value, type) or inspect.isfunction(value):  # the defining module's own object
            assert getattr(importlib.import_module(value.__module__), name) is value
    namespace: dict = {}
    exec(f"from {package} import *", namespace)  # noqa: S102
    assert set(module.__all__) <= set(namespace)
    assert set(module.__all__) <= set(dir(module))


def test_the_method_names_of_the_issue_are_exported():
    import lfed
    import lfed.client
    import lfed.engine
    import lfed.personal
    import lfed.privacy
    import lfed.server

    assert {"ClientRule", "Plain", "Prox", "Scaffold", "IGFL", "EFL", "FedDyn"} <= set(lfed.client.__all__)
    assert {"StepRule", "LossTerm"} <= set(lfed.engine.__all__) & set(lfed.__all__)  # the engine's, and the root's
    assert {"AggregationWeights", "ServerCombination", "Channel", "Dense", "TernaryTopK", "ClientSampler", "FedAdam",
            "FedYogi", "FedAdagrad", "Participation"} <= set(lfed.server.__all__)
    assert {"Ditto", "FedRep", "FedPer", "FedBN", "APFL", "FedAvgFT", "PerFedAvg", "FedRoD"} <= set(lfed.personal.__all__)
    assert {"DPFedAvg", "PrivacyAccountant", "calibrate_noise", "clip_rows"} <= set(lfed.privacy.__all__)
    assert {"Component", "Cohort", "LocalWork", "StateSpec", "run_round", "Algorithm", "LocalTraining", "setup_state",
            "CohortTrainer", "FederatedModule", "FederatedDataModule", "FederatedDataset"} <= set(lfed.__all__)
    from lfed.client.feddyn import FedDyn
    from lfed.state.spec import StateSpec

    assert lfed.client.FedDyn is FedDyn and lfed.StateSpec is StateSpec


def test_an_unknown_name_is_an_attribute_error_and_submodules_still_import():
    import lfed.client

    with pytest.raises(AttributeError, match="'lfed.client' has no attribute 'Nope'"):
        lfed.client.Nope  # noqa: B018
    from lfed import models  # a submodule, not an export
    from lfed.client import objectives

    assert models.__name__ == "lfed.models" and objectives.__name__ == "lfed.client.objectives"


def test_the_packages_import_lazily():
    """Importing the five packages loads neither torch nor Lightning; every name but the drivers' loads no Lightning."""
    names = {p: importlib.import_module(p).__all__ for p in PACKAGES}
    light = {p: [n for n in ns if n not in LIGHTNING_NAMES] for p, ns in names.items()}
    code = "\n".join([
        "import sys",
        *[f"import {p}" for p in PACKAGES],
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'lightning', 'dp_accounting'}))",
        *[f"from {p} import {', '.join(ns)}" for p, ns in light.items()],
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'lightning'))",
    ])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]" and out[1] == "[]", out


# ----------------------------------------------------------------------------- the docs' code
def fenced_blocks(text: str) -> list[dict]:
    """Every fenced block of a markdown text: language, code, whether an excerpt, its first line number."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        before = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        code = "\n".join(lines[i + 1:end]) + "\n"
        first = code.split("\n", 1)[0]
        file = first[len("# file: "):].strip() if first.startswith("# file: ") else None
        blocks.append({"lang": m.group(1), "code": code, "excerpt": before == EXCERPT, "line": i + 2, "file": file})
        i = end + 1
    return blocks


IMPORT = re.compile(r"^\s*(?:from\s+(lfed[\w.]*)\s+import|import\s+(lfed[\w.]*))", re.MULTILINE)


def lfed_imports(code: str) -> set[str]:
    return {a or b for a, b in IMPORT.findall(code)}


def test_the_docs_and_examples_import_only_the_public_packages():
    blocks = [b for b in fenced_blocks(DOC.read_text()) if b["lang"] == "python"]
    assert len(blocks) >= 6
    deep = {f"extending.md:{b['line']}": sorted(lfed_imports(b["code"]) - set(PACKAGES)) for b in blocks}
    for path in sorted((REPO / "examples").glob("*.py")):
        deep[str(path.relative_to(REPO))] = sorted(lfed_imports(path.read_text()) - set(PACKAGES))
    assert {k: v for k, v in deep.items() if v} == {}


def write_files(blocks: list[dict], folder: Path) -> None:
    for b in blocks:
        if b["file"]:
            (folder / b["file"]).write_text(b["code"])


@pytest.fixture
def doc_folder(tmp_path, monkeypatch):
    """A temporary folder holding the files of docs/extending.md, the working directory and on ``sys.path``."""
    blocks = fenced_blocks(DOC.read_text())
    write_files(blocks, tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    written = {Path(b["file"]).stem for b in blocks if b["file"] and b["file"].endswith(".py")}
    yield blocks
    for name in written:  # the doc's modules are this test's own
        sys.modules.pop(name, None)


def test_the_extending_page_s_python_runs(doc_folder):
    """The walk-through's method file and its run_round script, and every other complete block, in order."""
    blocks = doc_folder
    assert Path("fedcm.py").exists() and Path("fedcm.yaml").exists()
    namespace: dict = {"__name__": "extending_md"}
    run = 0
    for b in blocks:
        if b["lang"] == "python" and not b["excerpt"] and not b["file"]:
            exec(compile(b["code"], f"docs/extending.md:{b['line']}", "exec"), namespace)  # noqa: S102
            run += 1
    assert run >= 3
    # the walk-through trained: FedCM moved its momentum and the model learned the toy task
    assert namespace["record"].round == 19 and namespace["record"].cohort.clients.numel() == 5
    assert namespace["rule"].state("momentum").abs().sum() > 0
    assert namespace["accuracy"] > 0.7
    # the file's one check before round 0
    from fedcm import FedCM

    from lfed import CompositionContext

    context = CompositionContext(frozenset())
    assert FedCM(alpha=1.0).check(context) and FedCM(alpha=0.5).check(context) == []
    # the page's other complete components (a loss term, a median combination) run a round the same way
    import torch

    from lfed import Algorithm, ModuleStateStore, run_round, setup_state
    from lfed.server import Dense, Participation, SizeWeights, UniformSampler

    ns = namespace
    algorithm = Algorithm(objective=ns["ProxAsLoss"](mu=0.1), weighting=SizeWeights(), combination=ns["CoordinateMedian"](),
                          channel=Dense(), sampler=UniformSampler(), participation=Participation(fraction=0.25))
    w = ns["engine"].layout.module_vector(ns["net"])
    setup_state(algorithm, ModuleStateStore(), ns["data"].client_sizes, w.numel(), w)
    w_new, record = run_round(algorithm, w, ns["data"], ns["plan"], ns["engine"], round=0, seed=1)
    assert record.cohort.clients.numel() == 5 and torch.isfinite(w_new).all() and not torch.equal(w_new, w)


def test_the_extending_page_s_lfed_fit_line_runs(doc_folder, tmp_path):
    from lfed.lightning.cli import run_cli

    lines = [ln for b in doc_folder if b["lang"] == "bash" for ln in b["code"].split("\n") if "fedcm.yaml" in ln]
    assert len(lines) == 1, lines
    words = shlex.split(lines[0])
    args = words[words.index("lfed") + 1:]
    args = [str(REPO / a) if a.startswith("configs/") else a for a in args]
    cli = run_cli([*args, "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.logger=false",
                   "--trainer.enable_progress_bar=false", "--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}"])
    objective = cli.model.objective
    assert type(objective).__name__ == "FedCM" and objective.alpha == 0.5 and cli.trainer.global_step == 2
    assert objective.state("momentum").abs().sum() > 0
    assert any(k.endswith("objective.momentum") for k in cli.model.state_dict())  # in every checkpoint
    assert cli.model.runs[0].label == "fedavg+FedCM"


@pytest.mark.parametrize("old", sorted(__import__("lfed").REMOVED))
def test_a_module_path_of_0_4_is_refused_in_one_line_naming_its_new_path(old):
    """Each module moved in 0.5 (lfed.REMOVED) imported from its 0.4 path until 0.6, as 0.5 promised; in 0.6 its
    import fails with one line naming the new path, and the new path is a module (``import``, ``from ... import``
    and ``importlib`` alike, warning nothing)."""
    import warnings

    import lfed

    new = lfed.REMOVED[old]
    assert old not in lfed.MOVED and importlib.import_module(new).__name__ == new
    line = f"{old} was removed in lfed 0.6 (moved in 0.5); import {new}"
    parent, _, leaf = old.rpartition(".")
    sys.modules.pop(old, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for attempt in (lambda: importlib.import_module(old), lambda: exec(f"import {old}", {}),
                        lambda: exec(f"from {parent} import {leaf}", {})):
            with pytest.raises(ModuleNotFoundError) as refused:
                attempt()
            assert str(refused.value) == line
    assert old not in sys.modules
    if parent == "lfed":  # the attribute too (lfed.round): the same line
        with pytest.raises(AttributeError, match=f"^{re.escape(line)}$"):
            getattr(lfed, leaf)


@pytest.mark.parametrize("old", sorted(__import__("lfed").MOVED))
def test_a_module_path_moved_in_0_6_still_imports_and_says_where_it_is(old):
    """Each module moved in 0.6 (lfed.MOVED) still imports from its old path (a config's class_path, a user's import)
    until 0.7, with one FutureWarning naming the new path, and gives the very objects of the new module."""
    import warnings

    import lfed

    sys.modules.pop(old, None)
    new = importlib.import_module(lfed.MOVED[old])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        moved = importlib.import_module(old)
        public = [n for n in dir(new) if not n.startswith("_")]
        assert public and all(getattr(moved, n) is getattr(new, n) for n in public)
    said = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    release = lfed.MOVED_IN.get(old, "0.6")
    until = {"0.6": "0.7"}[release]
    assert said == [f"{old} moved to {lfed.MOVED[old]} in lfed {release}; the old path works until {until}"]


def test_an_old_class_path_reads_as_this_lfed_spells_it_without_importing_the_old_path():
    """What an old checkpoint recorded (a class path of 0.4) is read by lfed.current_path, which imports nothing:
    the module part that moved is replaced, the rest kept; lfed.removed_path says which spellings are refused."""
    import lfed

    assert lfed.current_path("lfed.sampling.AttentionSampler") == "lfed.participation.sampling.AttentionSampler"
    assert lfed.current_path("lfed.asynchronous") == "lfed.core.asynchronous"
    assert lfed.current_path("lfed.engine.schedule.client_batches") == "lfed.engine.batches.client_batches"
    assert lfed.current_path("lfed.server.weights.x") == "lfed.server.weight_formulas.x"  # moved in 0.6: mapped too
    for same in ("lfed.models.MLP", "lfed.roundabout.X", "lfed.core.round.run_round", "torch.nn.Linear"):
        assert lfed.current_path(same) == same
    assert lfed.removed_path("lfed.clock.SimulatedClock") == "lfed.participation.clock.SimulatedClock"
    assert lfed.removed_path("lfed.server.weights.x") is None and lfed.removed_path("lfed.models.MLP") is None
    assert not set(lfed.REMOVED) & set(lfed.MOVED)


def test_every_class_path_in_configs_sweeps_docs_and_readme_is_a_0_5_path():
    """What lfed ships names each class where it is: no class_path of a module that moved (0.4's are refused, 0.6's
    import with a warning) in its configs, sweeps, docs or README."""
    import lfed

    found = []
    for path in [*REPO.glob("configs/**/*.yaml"), *REPO.glob("sweeps/*.yaml"), *REPO.glob("docs/*.md"), REPO / "README.md"]:
        for m in re.finditer(r"class_path[\"']?\s*[:=]\s*[\"']?(lfed(?:\.\w+)+)", path.read_text()):
            name = m.group(1)
            if lfed.current_path(name) != name:
                found.append(f"{path.relative_to(REPO)}: {name}")
    assert not found, found


def test_each_name_is_exported_by_one_package():
    """Issue 64: a name is in the __all__ of one package (the root lfed, the table of every public name, aside)."""
    import pkgutil
    from collections import defaultdict

    import lfed

    where = defaultdict(list)
    for info in pkgutil.iter_modules(lfed.__path__):
        if info.ispkg:
            package = importlib.import_module(f"lfed.{info.name}")
            for name in getattr(package, "__all__", ()):
                where[name].append(package.__name__)
    twice = {name: packages for name, packages in where.items() if len(packages) > 1}
    assert not twice, f"exported by more than one package: {twice}"


def test_lfed_client_step_rule_types_still_resolve_with_one_warning_until_0_7():
    import lfed.client
    from lfed.engine import LossTerm, StepRule

    for name, value in (("StepRule", StepRule), ("LossTerm", LossTerm)):
        lfed.client.__dict__.pop(name, None)  # not yet cached
        with pytest.warns(FutureWarning, match=rf"lfed.client.{name}: import it from lfed \(or lfed.engine\)"):
            assert getattr(lfed.client, name) is value
        assert name not in lfed.client.__all__
