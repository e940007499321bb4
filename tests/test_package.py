"""The package's public names: each in ``__all__`` is imported on first use from the module
its table (``queueworks._HOMES``) names, so the three lists (the typed imports,
``__all__``, the table) must agree."""

from __future__ import annotations

import subprocess
import sys

import pytest

import queueworks
from tests.conftest import ROOT


@pytest.mark.unit
def test_every_public_name_has_a_home_and_every_home_is_public() -> None:
    assert sorted(queueworks._HOME) == sorted(queueworks.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        queueworks.nothing_here  # noqa: B018


@pytest.mark.system
def test_a_fresh_process_imports_each_public_name_on_first_use() -> None:
    """In a process that has imported nothing else, ``import queueworks`` imports no client,
    and ``from queueworks import *`` then gives every name, each its home module's."""
    code = (
        "import importlib, sys\n"
        "import queueworks\n"
        "assert 'queueworks.client.sync' not in sys.modules\n"
        "from queueworks import *\n"
        "for name, home in queueworks._HOME.items():\n"
        "    assert globals()[name] is getattr(importlib.import_module(home), name), name\n"
        "print(len(queueworks._HOME))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(len(queueworks.__all__))
