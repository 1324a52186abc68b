"""One version number (issue 41): the package's metadata takes ``lfed.__version__`` (pyproject.toml: dynamic), and
the release it names has its entry in CHANGELOG.md (issue 63)."""

from __future__ import annotations

import re

import tomllib
from conftest import REPO

import lfed


def test_the_build_reads_the_version_from_lfed_init():
    from setuptools.config.pyprojecttoml import read_configuration

    raw = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in raw["project"] and "version" in raw["project"]["dynamic"]
    assert raw["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "lfed.__version__"}
    resolved = read_configuration(REPO / "pyproject.toml", expand=True)  # resolves the attr from this tree
    assert resolved["project"]["version"] == lfed.__version__ == "0.5.0"


def test_the_version_is_the_changelogs_newest_release():
    """CHANGELOG.md's sections are ``## Unreleased`` (optional, first) and then ``## X.Y.Z`` newest first: the first
    released one is ``lfed.__version__``, and it says what changed for users, what was retired and what moved."""
    text = (REPO / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    released = [h for h in headings if h != "Unreleased"]
    assert headings[0] in ("Unreleased", lfed.__version__) and released[0] == lfed.__version__, headings
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", h) for h in released), released
    versions = [tuple(map(int, h.split("."))) for h in released]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    entry = text.split(f"## {lfed.__version__}\n", 1)[1].split("\n## ", 1)[0]
    assert all(f"### {part}" in entry for part in ("Added", "Retired", "Moved")), entry[:200]
