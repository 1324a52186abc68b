"""One version number (issue 41): the package's metadata takes ``lfed.__version__`` (pyproject.toml: dynamic)."""

from __future__ import annotations

import tomllib
from conftest import REPO

import lfed


def test_the_build_reads_the_version_from_lfed_init():
    from setuptools.config.pyprojecttoml import read_configuration

    raw = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in raw["project"] and "version" in raw["project"]["dynamic"]
    assert raw["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "lfed.__version__"}
    resolved = read_configuration(REPO / "pyproject.toml", expand=True)  # resolves the attr from this tree
    assert resolved["project"]["version"] == lfed.__version__ == "0.4.0"
