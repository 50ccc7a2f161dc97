"""The benchmark scripts import their neighbours (``from idle import ...``): tests import them with
``benchmarks/`` on the path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="package")
def benchmarks_on_path():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield
    finally:
        sys.path.remove(str(BENCHMARKS))
