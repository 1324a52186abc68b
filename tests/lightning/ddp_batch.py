"""Run several ``lfed fit`` cases on the same DDP processes, one after another (tests/lightning/test_distributed.py).

Started as each of two torchrun-style workers: ``python ddp_batch.py cases.json`` where ``cases.json`` maps a case's
name to its ``fit`` arguments. Every rank runs the cases in the same order, each through the command line's own entry
(:func:`lfed.lightning.cli.run_cli`, a fresh Trainer on the process group the first case initialized), and marks where
each starts so the test can split the output.
"""

from __future__ import annotations

import json
import sys

from lfed.lightning.cli import run_cli

if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    for name, args in cases.items():
        print(f"=== lfed ddp case {name} ===", flush=True)
        run_cli(args)
