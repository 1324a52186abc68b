"""Every ``>>>`` example in lfed's docstrings runs and prints what it says (doctest)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import lfed


def _modules_with_examples() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(lfed.__path__, "lfed."):
        spec = importlib.util.find_spec(info.name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            with open(spec.origin, encoding="utf-8") as f:
                if ">>>" in f.read():
                    names.append(info.name)
    return names


MODULES = _modules_with_examples()


def test_the_examples_are_found():
    assert {"lfed.server.attention", "lfed.server.weight_formulas", "lfed.engine.ranks"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
