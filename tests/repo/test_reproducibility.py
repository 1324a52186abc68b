"""docs/reproducibility.md, the promises with no other home: the same run twice (in two processes) gives the same
bits; vmap, loop and chunks of one client agree to the contract's tolerance in float64 and float32; lfed leaves
torch's deterministic-algorithms setting to the user; and every test the contract names exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO, assert_within

#: The run of these tests: SCAFFOLD with stragglers on digits (10 clients, half of them a round), MLP 64-32-10.
RUN = """
import sys, torch
from lfed.core.fit import fit_run
from lfed.core.algorithm import LocalTraining
from lfed.core.settings import Engine, build_run
from lfed.data.federated import FederatedDataset
from lfed.models.zoo import MLP
from lfed.participation.stragglers import Stragglers

def weights(dtype, backend="vmap", chunk_size=None):
    torch.manual_seed(0)
    net = MLP(in_features=64, hidden=[32], num_classes=10).to(dtype)
    run = build_run(net=net, algorithm="scaffold", fraction=0.5, seed=3, stragglers=Stragglers(p_incomplete=0.3),
                    engine=Engine(backend=backend, chunk_size=chunk_size),
                    training=LocalTraining(client_lr=0.1, batch_size=8, local_epochs=1))
    fit_run(run, FederatedDataset(dataset="digits", num_clients=10, partition="dirichlet", rho=0.5, seed=0), 2)
    return torch.cat([run.layout.module_vector(run.net), run.components.objective.state("control")]).detach()
"""


def _weights(*args, **kwargs) -> torch.Tensor:
    scope: dict = {}
    exec(RUN, scope)  # noqa: S102 - the same source the other process runs
    return scope["weights"](*args, **kwargs)


@pytest.mark.bitlevel
def test_the_same_run_twice_in_two_processes_gives_the_same_bits(tmp_path):
    """The same settings and seed, machine, threads and software, in float64 and float32: the weights and control
    variates bit for bit, in this process and in a fresh one (its own allocations, its kernels' first calls)."""
    here = {dtype: _weights(dtype) for dtype in (torch.float64, torch.float32)}
    for dtype, weights in here.items():
        assert torch.equal(_weights(dtype), weights), dtype
    out = tmp_path / "there.pt"
    code = RUN + f"\ntorch.save([weights(torch.float64), weights(torch.float32)], {str(out)!r})\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())})
    assert done.returncode == 0, done.stderr[-3000:]
    there = torch.load(out, weights_only=True)
    assert torch.equal(there[0], here[torch.float64]) and torch.equal(there[1], here[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_vmap_loop_and_chunks_of_one_agree_to_the_tolerance(dtype):
    """The two backends, and the vmap backend in chunks of one client against the whole cohort: other products of
    other shapes (and in the loop, another order of the steps' operations), so equal to conftest.CROSS_MACHINE."""
    vmap = _weights(dtype)
    assert_within(_weights(dtype, "loop"), vmap, what="loop against vmap")
    assert_within(_weights(dtype, "vmap", 1), vmap, what="chunks of 1 against the whole cohort")


def test_lfed_leaves_the_deterministic_setting_to_the_user():
    """lfed never calls torch.use_deterministic_algorithms (Lightning's trainer.deterministic does); the environment
    it records says which is in force."""
    from lfed.state.environment import environment

    before = torch.are_deterministic_algorithms_enabled()
    _weights(torch.float32)
    assert torch.are_deterministic_algorithms_enabled() == before
    assert environment()["deterministic_algorithms"] == before
    sources = "\n".join(p.read_text() for p in (REPO / "lfed").rglob("*.py"))
    assert "use_deterministic_algorithms(" not in sources and "cudnn.deterministic =" not in sources


def test_every_test_the_contract_names_exists():
    """docs/reproducibility.md names its tests as ``tests/<file>.py::<test>``: each file has that test function."""
    text = (REPO / "docs" / "reproducibility.md").read_text()
    named = set(re.findall(r"(tests/[\w/]+\.py)::(\w+)", text))
    assert len(named) >= 10
    for path, name in sorted(named):
        source = (REPO / path).read_text()
        assert re.search(rf"^def {name}\(", source, flags=re.M), f"{path}::{name} (docs/reproducibility.md)"


def test_every_bitlevel_test_is_named_in_the_contract():
    """A test marked ``bitlevel`` holds a promise of the contract: the contract names it."""
    text = (REPO / "docs" / "reproducibility.md").read_text()
    for path in (REPO / "tests").rglob("test_*.py"):
        source = path.read_text()
        module_marked = re.search(r"^pytestmark = .*pytest\.mark\.bitlevel", source, flags=re.M) is not None
        for match in re.finditer(r"((?:^@.*\n)*)^def (test_\w+)\(", source, flags=re.M):
            if module_marked or "pytest.mark.bitlevel" in match.group(1):
                name = f"{path.relative_to(REPO)}::{match.group(2)}"
                assert name in text, f"{name} is marked bitlevel but docs/reproducibility.md does not name it"
