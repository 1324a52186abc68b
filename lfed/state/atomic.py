"""Atomic, durable file writes: the one helper behind checkpoints and the dataset cache.

:func:`write_atomically` streams into a temporary file beside the target
(``.<name>.tmp-<pid>``), flushes and syncs it, renames it over the target with ``os.replace``
(atomic on POSIX and Windows within one file system, which the same directory guarantees) and
syncs the directory, so a process killed at any moment leaves either the old file or the new
one, never a half-written file. A temporary file left by a killed process is removed by
:func:`remove_stale_temps`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

TMP_MARK = ".tmp-"


def temp_name(path: Path) -> Path:
    """The temporary file this process writes ``path`` through."""
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")


def write_atomically(target: Path, write: Callable[[BinaryIO], None], mode: int | None = None) -> None:
    """Write ``target`` with ``write(f)`` (an open binary file) atomically and durably.

    Args:
        target: The file to (re)place; its directory is created.
        write: Writes the content into the open temporary file.
        mode: Permission bits for the new file (None: the process's default).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(target)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(target.parent)


def fsync_dir(directory: Path) -> None:
    """Sync a directory so a rename in it survives a power loss (a no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temps(target: Path) -> None:
    """Remove temporary files of ``target`` left by processes that no longer run."""
    prefix = f".{target.name}{TMP_MARK}"
    for p in target.parent.glob(f"{prefix}*"):
        pid = p.name[len(prefix):]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            with contextlib.suppress(OSError):
                p.unlink()


def _pid_alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill(pid, 0) would terminate the process on Windows: keep its file
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True
