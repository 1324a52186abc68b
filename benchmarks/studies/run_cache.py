"""A study's finished runs in one JSON-lines file, not a folder of thousands (issue 64).

``RunCache(folder)`` keeps its entries in ``<folder>.jsonl`` beside where the folder was (``benchmarks/results/robust/
run_cache.jsonl``, ``.../protocol/run_cache.jsonl``, ``.../paper/run_cache.jsonl``): one line per run, ``{"file":
<key>, ...the run's entry}``, the key being the name the run's file had (``<name>-<16 hex of its arguments>``,
:meth:`paper_results.Runner._cache_file`). A run trained again is appended; the last line of a key is its entry. A
reader greps one file (``grep '"file": "robust_IID_Krum' run_cache.jsonl``) or loads it with ``pandas.read_json(...,
lines=True)``.

The layout before, one ``<folder>/<key>.json`` a run, is still read, first (so a checkout or a process on the old
layout, or a test writing an entry by hand, is seen as it was), and :meth:`RunCache.migrate` moves every such file
into the lines and deletes it: :class:`paper_results.Runner` migrates its folder once, when it opens a cache that has
one. Appending is one ``write`` of one line to a file opened for appending, so processes that share a cache (runs
taking turns through a lock) do not interleave their lines.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class RunCache:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder.parent / f"{self.folder.name}.jsonl"
        self._index: dict[str, dict] = {}
        self._stamp: tuple[int, int] | None = None

    # ------------------------------------------------------------------ the lines
    def _lines(self) -> dict[str, dict]:
        """``{key: entry}`` of the file, read again when it changed (another process appended)."""
        stamp = self._stat()
        if stamp is None:
            self._index, self._stamp = {}, None
            return self._index
        if stamp != self._stamp:
            index: dict[str, dict] = {}
            with open(self.path, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        entry = json.loads(line)
                    except ValueError:  # a line cut short (a process killed while writing): not an entry
                        continue
                    index[entry.pop("file")] = entry
            self._index, self._stamp = index, stamp
        return self._index

    def _legacy(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    # ------------------------------------------------------------------ reading and writing
    def get(self, key: str) -> dict | None:
        """The entry of ``key`` (the old layout's file first), or None."""
        old = self._legacy(key)
        if old.is_file():
            return json.loads(old.read_text())
        entry = self._lines().get(key)
        return None if entry is None else dict(entry)

    def has(self, key: str) -> bool:
        return self._legacy(key).is_file() or key in self._lines()

    def keys(self, prefix: str = "") -> list[str]:
        """Every key starting with ``prefix``, sorted (the old layout's files too)."""
        old = {p.stem for p in self.folder.glob(f"{prefix}*.json")} if self.folder.is_dir() else set()
        return sorted(old | {k for k in self._lines() if k.startswith(prefix)})

    def put(self, key: str, entry: dict) -> None:
        """Append ``entry`` as ``key``'s (one write of one line); an old-layout file of ``key`` is removed, so it cannot
        shadow the new entry."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        current = self._stamp is not None and self._stamp == self._stat()  # no one appended since this process read
        line = (json.dumps({"file": key, **entry}) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        if current or (self._stamp is None and os.path.getsize(self.path) == len(line)):  # ours the only line
            self._index[key] = dict(entry)  # known without reading the file again
            self._stamp = self._stat()
        self._legacy(key).unlink(missing_ok=True)

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size

    def migrate(self) -> int:
        """Move every old-layout file (``<folder>/<key>.json``) into the lines, in the order of their names, then delete
        it (and the folder once empty); returns how many moved. A file that does not parse is left where it is."""
        if not self.folder.is_dir():
            return 0
        moved = 0
        for old in sorted(self.folder.glob("*.json")):
            try:
                entry = json.loads(old.read_text())
            except ValueError:
                continue
            self.put(old.stem, entry)
            moved += 1
        if not any(self.folder.iterdir()):
            self.folder.rmdir()
        return moved
