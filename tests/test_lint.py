"""The codebase stays ruff clean (config in pyproject.toml)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    result = subprocess.run([ruff, "check", ROOT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout
