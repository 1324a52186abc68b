"""Run a benchmark script with lfed imported from another checkout (a before/after sitting of two versions).

    python benchmarks/run_with.py /path/to/old/checkout benchmarks/dp_sgd_opacus.py --clients 10 --repeats 1

``git worktree add /tmp/old <commit>`` makes the checkout. The script itself is the one given (this checkout's, so
both versions run the same measurement); only ``import lfed`` resolves to the checkout, which the script's first line
of output names.
"""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit("usage: python benchmarks/run_with.py CHECKOUT SCRIPT [ARGS...]")
    root, script = sys.argv[1], sys.argv[2]
    # an editable install's import hook would find the installed lfed first
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()
                        and "editable" not in repr(f).lower()]
    sys.path.insert(0, root)
    sys.argv = [script, *sys.argv[3:]]
    import lfed

    print(f"[lfed from {lfed.__file__}]", flush=True)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
