"""Where the fits in this folder write their numbers: ``entrain/core/costs/fits/NAME.json``, read by the
presets (``entrain.core.costs.presets.fitted``), with the commit and command the numbers came from. Shared by
``fit_a40_paper.py``, ``fit_a40_fig4.py`` and ``fit_cpu_tiny.py``; ``tests/core/test_presets.py`` checks
the presets against the fits' reports."""

from __future__ import annotations

import json
from pathlib import Path

from provenance import source  # benchmarks/provenance.py

FITS = Path(__file__).resolve().parents[1] / "entrain" / "core" / "fits"


def write_preset_fit(name: str, numbers: dict) -> Path:
    """Replace ``NAME.json``'s numbers with ``numbers`` (its ``about`` line kept); the file's path."""
    path = FITS / f"{name}.json"
    doc = {"about": json.loads(path.read_text())["about"], "source": source(), **numbers}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}: the preset now uses these numbers")
    return path
