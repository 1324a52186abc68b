"""What a run's bits depend on, recorded with it (docs/reproducibility.md).

lfed makes a run a function of its settings and seed (:mod:`lfed.rng`), but the floating-point
bits of that function also depend on the software and the machine that evaluate it: the kernels
torch picks for the CPU's instruction set, how many threads split a product, the device, the
versions. :func:`environment` records them; a checkpoint holds the record of the process that wrote
it (``checkpoint["lfed"]["environment"]``) and ``lfed fit`` writes one per start or resume into the
run's folder (``environment.json``). :func:`environment_note` is the one line a resume prints when
its environment differs from the checkpoint's: the continuation computes the same maths, but not
necessarily the same bits as a continuation where the checkpoint was written.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["BITS_DEPEND_ON", "EnvironmentWarning", "environment", "environment_differences", "environment_note",
           "git_commit"]

#: Environment variables that change which kernels run (and so the bits): recorded when set.
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "CUBLAS_WORKSPACE_CONFIG")

#: The keys of :func:`environment` a resume compares, in the order its line names them (the Python version, the
#: platform and the variables above are recorded, not compared: they act through these).
BITS_DEPEND_ON = ("lfed", "lfed_commit", "torch", "device", "cpu", "cpu_capability", "threads",
                  "deterministic_algorithms")


class EnvironmentWarning(UserWarning):
    """A checkpoint resumed in another environment (or written by another lfed): the same maths, maybe other bits."""


@functools.cache
def git_commit(path: str | None = None) -> str | None:
    """The commit of the checkout lfed runs from (``+dirty`` when its tracked files changed), or None (an installed
    lfed, no git). Read once per process."""
    root = Path(path) if path else Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "lfed"], cwd=root,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


@functools.lru_cache(maxsize=1)
def _cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else the platform's answer)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _device_of(device: Any) -> str:
    import torch

    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return f"cuda {torch.cuda.get_device_name(index)} (capability {major}.{minor})"
    return device.type


def environment(device: Any = None) -> dict[str, Any]:
    """The environment of this process, as plain values: what a run's floating-point bits depend on.

    Keys: ``lfed`` (version), ``lfed_commit`` (the checkout's commit, or None), ``torch`` (version, with CUDA's
    and cuDNN's when built with them), ``python``, ``platform``, ``device`` (``cpu``, or ``cuda <name> (capability
    X.Y)`` for a CUDA ``device``), ``cpu`` (model name), ``cpu_capability`` (the ATen kernels in use,
    ``torch.backends.cpu.get_cpu_capability()``), ``threads`` (``torch.get_num_threads()``),
    ``deterministic_algorithms`` (``torch.are_deterministic_algorithms_enabled()``, ``"warn"`` in warn-only mode;
    lfed sets none of these, the user's ``trainer.deterministic`` does), ``cudnn`` (benchmark / deterministic flags,
    with CUDA), and ``variables``: those of :data:`KERNEL_VARIABLES` that are set.
    """
    import torch

    import lfed

    deterministic: bool | str = torch.are_deterministic_algorithms_enabled()
    if deterministic and torch.is_deterministic_algorithms_warn_only_enabled():
        deterministic = "warn"
    record: dict[str, Any] = {
        "lfed": lfed.__version__,
        "lfed_commit": git_commit(),
        "torch": torch.__version__ + (f", CUDA {torch.version.cuda}" if torch.version.cuda else ""),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": _device_of(device),
        "cpu": _cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "deterministic_algorithms": deterministic,
    }
    if record["device"].startswith("cuda"):
        record["cudnn"] = {"version": torch.backends.cudnn.version(), "benchmark": torch.backends.cudnn.benchmark,
                           "deterministic": torch.backends.cudnn.deterministic}
    record["variables"] = {k: os.environ[k] for k in KERNEL_VARIABLES if k in os.environ}
    return record


def environment_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, saved, current)`` for each key of :data:`BITS_DEPEND_ON` recorded in both that differs."""
    return [(k, saved[k], current[k]) for k in BITS_DEPEND_ON if k in saved and k in current and saved[k] != current[k]]


def environment_note(saved: Mapping[str, Any] | None, current: Mapping[str, Any],
                     source: str = "the checkpoint") -> str | None:
    """The one line a resume says when ``saved`` (a checkpoint's environment; None when it records none: lfed 0.4
    or earlier wrote it) differs from ``current`` in what the bits depend on (:data:`BITS_DEPEND_ON`), naming each
    difference and, when another lfed wrote the checkpoint, which; None when nothing differs."""
    where = "bits may differ from a continuation where it was written (docs/reproducibility.md)"
    if saved is None:
        return (f"resuming {source}, written by lfed 0.4 or earlier (it records no environment), with lfed "
                f"{current.get('lfed')}: the continuation runs this lfed's rounds, and its {where}")
    diffs = environment_differences(saved, current)
    if not diffs:
        return None
    shown = "; ".join(f"{k} {a} -> {b}" for k, a, b in diffs if k != "lfed")
    if saved.get("lfed") != current.get("lfed"):
        return (f"resuming {source}, written by lfed {saved.get('lfed')}, with lfed {current.get('lfed')}"
                f"{f' ({shown})' if shown else ''}: the continuation runs this lfed's rounds, and its {where}")
    return (f"resuming {source} in another environment ({shown}): the continuation is exact in its maths but not in "
            f"its bits: they may differ from a continuation where it was written (docs/reproducibility.md)")
