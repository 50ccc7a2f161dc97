"""Every family folder has the same layout: each module's name says its role (``ROLES``, the table of
docs/architecture.md's "How to add a model family"), the folder holds one family, defined in its
``family.py`` and registered by its ``__init__.py``, and each family's name is its folder's. A module
outside the roles is listed in ``EXCEPTIONS`` with its reason."""

from __future__ import annotations

import pathlib

from entrain.models.families.registry import families

FAMILIES = pathlib.Path(__file__).resolve().parents[2] / "entrain" / "models" / "families"

ROLES = {
    "__init__": "registers the family: one register_family line (torch-free)",
    "family": "the ModelFamily subclass and its run config (torch-free at import)",
    "config": "the run config, when model.py needs it (in family.py, which imports model.py, a circle)",
    "spec": "config.json -> the family's shape and its per-layer cost specs (torch-free)",
    "presets": "published and tiny shapes --model serves (torch-free)",
    "processing": "image rule, special tokens, chat template, image processor (torch-free at import)",
    "model": "the model built on the meta device, checkpoint loading, the stage modules (torch)",
    "positions": "the LLM position ids of a packed batch, when they are not 1-D",
    "profiling": "the one-layer inputs entrain profile times",
    "tp": "the tensor-parallel plan",
    "export": "the folder entrain export writes for from_pretrained",
}
REQUIRED = ("__init__", "family")

EXCEPTIONS = {
    ("composition", "hf_checkpoint"): "stock folders' loading; its safetensors reader serves every family",
}
"""(folder, module) outside ``ROLES``, and why."""


def _folders() -> dict[str, set[str]]:
    return {
        d.name: {p.stem for p in d.glob("*.py")}
        for d in sorted(FAMILIES.iterdir())
        if (d / "__init__.py").is_file()
    }


def test_every_module_of_a_family_folder_has_a_role():
    odd = {
        (folder, m)
        for folder, modules in _folders().items()
        for m in modules
        if m not in ROLES and (folder, m) not in EXCEPTIONS
    }
    assert not odd, f"modules without a role (rename them to a role of ROLES): {sorted(odd)}"
    missing = {(f, m) for f, modules in _folders().items() for m in REQUIRED if m not in modules}
    assert not missing, f"family folders without {missing}"


def test_every_exception_is_still_there():
    folders = _folders()
    stale = [key for key in EXCEPTIONS if key[1] not in folders.get(key[0], set())]
    assert not stale, f"drop these from EXCEPTIONS: {stale}"


def test_each_folder_holds_the_family_of_its_name():
    built_in = {f.name: type(f).__module__ for f in families() if type(f).__module__.startswith("entrain.")}
    expected = {folder: f"entrain.models.families.{folder}.family" for folder in _folders()}
    assert built_in == expected
