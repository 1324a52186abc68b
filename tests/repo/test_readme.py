"""The README's Python snippets, run verbatim in the order printed (issue 51: they must do what the README says)."""

from __future__ import annotations

import re
import subprocess
import sys

import torch
from conftest import REPO


def _python_blocks() -> list[str]:
    text = (REPO / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_readme_snippets_run_as_printed_and_give_the_same_weights_bit_for_bit(tmp_path, monkeypatch):
    """'Your own model, loss and data' under a Trainer, then 'The same run without Lightning': the second's
    weights equal the first's bit for bit (0.4's snippet continued from the trained net: it did not)."""
    blocks = [b for b in _python_blocks() if "Trainer(" in b or "fit_run(run" in b]
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    module, run = namespace["module"], namespace["run"]
    assert len(namespace["history"]) == 50
    assert torch.equal(module.layout.module_vector(module.net), run.layout.module_vector(run.net))


def test_a_run_without_lightning_imports_no_lightning_module():
    """build_run + fit_run of 3 rounds on a FederatedDataset, in a fresh interpreter: no `lightning` module loaded."""
    code = ("import sys\n"
            "from lfed import FederatedDataset, LocalTraining, build_run, fit_run\n"
            "from lfed.models.zoo import MLP\n"
            "run = build_run(net=MLP(64, [16], 10), training=LocalTraining(client_lr=0.1))\n"
            "assert len(fit_run(run, FederatedDataset(dataset='digits', num_clients=10), 3)) == 3\n"
            "print(sorted(m for m in sys.modules if m == 'lightning' or m.startswith(('lightning.', 'pytorch_lightning'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
