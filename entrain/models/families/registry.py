"""The model-family registry: ``register_family``, ``get_family``, ``family_names``,
``family_of_folder``, ``family_of_source`` and ``family_of_preset``.

Built-in families register themselves when their package is imported: the registry imports every
package under ``entrain/models/families/`` on first use (``_builtin_packages``; their ``__init__`` is
torch-free), so a new family folder needs no edit here. A test or a plug-in registers its own family
with ``register_family(family)``.
"""

from __future__ import annotations

import importlib
import json
import os

from entrain.core.errors import ConfigError
from entrain.models.families.base import ModelFamily, ModelSource

__all__ = [
    "register_family",
    "unregister_family",
    "get_family",
    "family_names",
    "families",
    "family_of_folder",
    "family_of_preset",
    "family_of_source",
    "preset_names",
    "read_config",
    "family_of",
    "family_of_manifest",
    "build_stage",
    "DEFAULT_FAMILY",
]

_FAMILIES: dict[str, ModelFamily] = {}
_loaded = False


def _builtin_packages() -> list[str]:
    """The family packages under ``entrain/models/families/``, the composition first."""
    import pkgutil

    from entrain.models import families as package

    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.ispkg)
    names.sort(key=lambda n: n != COMPOSITION)
    return [f"{package.__name__}.{n}" for n in names]


def _load_builtin() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in _builtin_packages():
            importlib.import_module(module)


def register_family(family: ModelFamily, *, replace: bool = False) -> ModelFamily:
    """Add ``family`` under ``family.name``; ConfigError for a name or preset already taken (unless
    ``replace``) or an object that does not implement ``ModelFamily`` (naming the family and every
    member it lacks, e.g. ``token_ids``, which ``FamilyBase`` leaves to each family)."""
    if not isinstance(family, ModelFamily):
        missing = [m for m in _protocol_members() if not hasattr(family, m)]
        name = getattr(family, "name", "") or "?"
        raise ConfigError(
            f"model family {name!r} ({type(family).__name__}) is not a ModelFamily: it lacks "
            f"{', '.join(missing)} (FamilyBase has no default for these: the family must say them)"
        )
    if not family.name:
        raise ConfigError(f"{type(family).__name__}: a model family needs a name")
    if family.name in _FAMILIES and not replace:
        raise ConfigError(f"model family {family.name!r} is registered already")
    taken = {p: f.name for f in _FAMILIES.values() if f.name != family.name for p in f.preset_names()}
    clash = [p for p in family.preset_names() if p in taken]
    if clash:
        raise ConfigError(f"model family {family.name!r}: preset(s) {clash} belong to {taken[clash[0]]!r}")
    _FAMILIES[family.name] = family
    _keep_canonical_order()
    return family


def _keep_canonical_order() -> None:
    """The composition first, then by name: listings (``--help``, ``data families``) must not depend
    on which family module a process happened to import first."""
    ordered = sorted(_FAMILIES.items(), key=lambda item: (item[0] != COMPOSITION, item[0]))
    _FAMILIES.clear()
    _FAMILIES.update(ordered)


def unregister_family(name: str) -> None:
    """Remove family ``name`` (tests that register their own)."""
    _FAMILIES.pop(name, None)


def _protocol_members() -> list[str]:
    names = set(ModelFamily.__annotations__) | {m for m in vars(ModelFamily) if not m.startswith("_")}
    return sorted(names)


def families() -> list[ModelFamily]:
    """Every registered family, built-in ones first."""
    _load_builtin()
    return list(_FAMILIES.values())


def family_names() -> tuple[str, ...]:
    return tuple(f.name for f in families())


def get_family(name: str) -> ModelFamily:
    """The family registered as ``name``; ConfigError listing the registered ones otherwise."""
    _load_builtin()
    try:
        return _FAMILIES[name]
    except KeyError:
        raise ConfigError(f"unknown model family {name!r}; registered: {', '.join(family_names())}") from None


def preset_names() -> tuple[str, ...]:
    """Every ``--model`` preset of every family (what ``--model`` accepts)."""
    return tuple(p for f in families() for p in f.preset_names())


def family_of_preset(preset: str) -> ModelFamily:
    """The family serving ``--model preset``; ConfigError listing the presets otherwise."""
    for f in families():
        if preset in f.preset_names():
            return f
    raise ConfigError(f"unknown model preset {preset!r}; choose from {', '.join(preset_names())}")


def read_config(folder: str) -> dict:
    """``folder/config.json`` as a dict; ConfigError naming the file otherwise."""
    path = os.path.join(folder, "config.json")
    if not os.path.isdir(folder):
        raise ConfigError(f"model folder {folder} does not exist (checkpoints are never downloaded)")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing (a Hugging Face checkpoint folder holds config.json)") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return cfg


def family_of_folder(folder: str) -> ModelFamily:
    """The family whose ``claims_config`` accepts ``folder/config.json`` (its ``model_type`` /
    ``architectures``); ConfigError naming the file, what it declares, and the supported families."""
    cfg = read_config(folder)
    for f in families():
        if f.claims_config(cfg):
            return f
    supported = "; ".join(f"{f.name} ({f.description})" for f in families())
    raise ConfigError(
        f"{os.path.join(folder, 'config.json')}: model_type {cfg.get('model_type')!r} (architectures "
        f"{cfg.get('architectures')}) is not a whole checkpoint of a supported model family: {supported}"
    )


def family_of_source(source: ModelSource) -> ModelFamily:
    """The family of a run's ``ModelSource``: ``model_path``'s config.json, the two stock folders of a
    composition (the family claiming the ``"composition"`` role), or the preset's family."""
    if source.model_path is not None:
        return family_of_folder(source.model_path)
    if source.vision_model is not None or source.llm_model is not None:
        return get_family(COMPOSITION)
    return family_of_preset(source.preset)


COMPOSITION = "composition"
"""The family ``--vision-model`` / ``--llm-model`` runs use (a vision folder feeding an LLM folder)."""
DEFAULT_FAMILY = COMPOSITION
"""The family of checkpoints and plans written before families existed (no ``family`` field)."""


def family_of(obj) -> ModelFamily:
    """The family of a runtime object: a model or stage module (its ``entrain_family`` attribute) or a
    family's runtime config (its ``family`` attribute)."""
    name = getattr(obj, "entrain_family", None) or getattr(obj, "family", None)
    if not isinstance(name, str):
        raise TypeError(f"{type(obj).__name__} names no model family (entrain_family / family)")
    return get_family(name)


def family_of_manifest(manifest: dict) -> ModelFamily:
    """The family a checkpoint manifest records (``DEFAULT_FAMILY`` for one written before families)."""
    return get_family(manifest.get("family") or DEFAULT_FAMILY)


def build_stage(model, component: str, first: int, end: int):
    """``ModelFamily.build_stage`` of ``model``'s family, the stage tagged with the family's name."""
    family = family_of(model)
    stage = family.build_stage(model, component, first, end)
    if getattr(stage, "entrain_family", None) is None:
        stage.entrain_family = family.name
    return stage
