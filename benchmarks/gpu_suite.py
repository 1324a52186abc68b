"""``python benchmarks/gpu_suite.py ...``: the GPU suite, the package ``benchmarks/gpu_suite/`` (one module per section;
its docstring says what each checks and times; ``--help``). A folder wins over a module of the same name, so
``import gpu_suite`` (benchmarks/ on the path) is the package; this file only runs it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_suite.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
