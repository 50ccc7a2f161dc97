"""A plan file (``entrain plan --out FILE``) checked completely before ``entrain train --plan`` starts
a process: every field present with its type (``PLAN_FIELDS``), no field at any level that ``entrain
plan`` does not write (``REPORT_FIELDS``: the plan's report), the stages numbered in order, each
component's stages covering its layers exactly once and in order, and the pipeline ranks valid.

Each problem is one ``ConfigError`` naming the file and the field's path, e.g.
``--plan p.json: layout.stages[2].layers[1]: expected int, got str``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from typing import NamedTuple

from entrain.core.costs.costmodel import RECOMPUTE_MODES
from entrain.core.errors import ConfigError
from entrain.core.safetensors_header import checkpoint_fingerprint
from entrain.core.schedules.common import ScheduleOptions

__all__ = [
    "PLAN_FIELDS",
    "REPORT_FIELDS",
    "CHECKPOINT_FLAGS",
    "checkpoint_fingerprints",
    "RUN_FIELDS",
    "load_plan_dict",
    "check_stage_ranges",
]


class Maybe(NamedTuple):
    """A field ``entrain plan`` writes only sometimes (checked when present)."""

    spec: object


class Items(NamedTuple):
    """A list of any length (empty too) of ``spec``."""

    spec: object


class Components(NamedTuple):
    """``layout.components``: an object of ``llm`` and the encoder components, each a ``spec``: ``encoder``
    in a one-encoder plan, else one per encoder the stages name (``check_stage_ranges`` checks which)."""

    spec: object


ANY = object()
"""A value ``train --plan`` does not read (a report's number or free-form map): any JSON value."""


def _report(*names: str) -> dict:
    """An object of the plan's report whose values train does not read: only its field names checked."""
    return {name: Maybe(ANY) for name in names}


_COMPONENT = {"tp": int, "cp": int, "pp": int, "ep": Maybe(int)}
_PART = {"name": str, "width": int, "dtype_bytes": int, "rows": str, "rows_per_token": Maybe(float)}
_STAGE = {"stage": int, "component": str, "layers": (int, int), "pp_rank": int, "recompute": Maybe(str),
          "parts": Maybe(Items(_PART)), "encoder": Maybe(str)}  # fmt: skip
PLAN_FIELDS: dict = {
    "system": str,
    "model": str,
    "dataset": str,
    "min_pixels": int,
    "max_pixels": int,
    "global_batch": int,
    "microbatch_size": int,
    "schedule_options": dict,
    "layout": {
        "dp": int,
        "microbatch_size": int,
        "num_microbatches": int,
        "components": Components(_COMPONENT),
        "stages": [_STAGE],
    },
}
"""Every field ``train --plan`` reads, with its type (a dict: an object; a one-item list: a non-empty
list of that; a tuple: a list of exactly those)."""

CHECKPOINT_FLAGS = ("model_path", "vision_model", "llm_model", "tokenizer")
"""The checkpoint flags a plan records in ``model_source`` (and, but for the tokenizer, fingerprints)."""


def checkpoint_fingerprints(folders: Mapping[str, str]) -> dict[str, str]:
    """``{flag dest: checkpoint_fingerprint}`` of the checkpoint folders among ``folders`` (by flag dest;
    the tokenizer is not one)."""
    return {k: checkpoint_fingerprint(v) for k, v in folders.items() if k in CHECKPOINT_FLAGS[:3] and v}


_CONFIG_COMPONENT = _report("tp", "cp", "pp", "layer_names", "layers_per_stage", "stage_time_ms",
                            "stage_memory_bytes", "recompute", "ep")  # fmt: skip
REPORT_FIELDS: dict = {
    "b_min": Maybe(int),
    "k_trials": Maybe(int),
    "trials": Maybe(
        Items(
            _report("batch_size", "allocations_seen", "stable", "reference", "allocation_stable", "eq2_gap")
        )
    ),  # fmt: skip
    "config": Maybe(
        {
            **_report(
                "dp", "microbatch_size", "num_microbatches", "gpus_per_replica", "allocation", "memory_ok"
            ),
            "components": Maybe({"encoder": Maybe(_CONFIG_COMPONENT), "llm": Maybe(_CONFIG_COMPONENT)}),
        }
    ),  # fmt: skip
    **_report(
        "predicted_iteration_time_ms",
        "converged",
        "reason",
        "tolerance",
        "max_batch_size",
        "allocation",
        "gpus_per_replica",
        "hardware",
        "gpus",
        "alpha",
        "p_error",
        "n0",
        "seed",
        "source",
        "fits_memory",
    ),  # fmt: skip
    "decisions": Maybe(Items(_report("name", "chosen", "candidates", "margin", "default"))),
    "model_source": Maybe({k: Maybe(str) for k in CHECKPOINT_FLAGS}),
    "checkpoint_fingerprint": Maybe({k: Maybe(str) for k in CHECKPOINT_FLAGS[:3]}),
}
"""The fields a plan file may hold besides ``PLAN_FIELDS``: what ``entrain plan`` reports (only their
names checked), the checkpoint folders it was made with and their content fingerprints
(``entrain.core.safetensors_header.checkpoint_fingerprint``)."""

RUN_FIELDS = ("model", "dataset", "min_pixels", "max_pixels", "global_batch", "microbatch_size")
"""What a plan records about the run it was made for (docs/contract.md ``entrain plan``)."""

_AT_LEAST_1 = {"dp", "microbatch_size", "num_microbatches", "tp", "cp", "pp", "ep", "global_batch", "min_pixels",
               "max_pixels"}  # fmt: skip
_JSON_NAMES = {dict: "object", list: "list", type(None): "null", bool: "bool"}


def _name(t) -> str:
    return _JSON_NAMES.get(t, t.__name__)


def _fail(path: str, where: str, what: str) -> ConfigError:
    return ConfigError(
        f"--plan {path}: {where or 'the file'}: {what}; write the plan again with `entrain plan ... --out FILE`"
    )


def _check(value, spec, where: str, path: str) -> None:
    """``value`` against ``spec`` (see ``PLAN_FIELDS``), ``where`` its path in the file."""
    if spec is ANY:
        return
    if isinstance(spec, Maybe):
        _check(value, spec.spec, where, path)
    elif isinstance(spec, dict):
        _check_object(value, spec, where, path)
    elif isinstance(spec, Components):
        _check_object(value, {"llm": spec.spec}, where, path, others=spec.spec)
    elif isinstance(spec, Items):
        if not isinstance(value, list):
            raise _fail(path, where, f"expected a list, got {_name(type(value))}")
        for i, item in enumerate(value):
            _check(item, spec.spec, f"{where}[{i}]", path)
    elif isinstance(spec, list | tuple):
        items = spec * len(value) if isinstance(spec, list) and isinstance(value, list) else spec
        if not isinstance(value, list) or not value or len(value) != len(items):
            size = f"a list of {len(spec)}" if isinstance(spec, tuple) else "a non-empty list"
            got = f"{len(value)} item(s)" if isinstance(value, list) else _name(type(value))
            raise _fail(path, where, f"expected {size}, got {got}")
        for i, (item, sub) in enumerate(zip(value, items)):
            _check(item, sub, f"{where}[{i}]", path)
    else:
        _check_scalar(value, spec, where, path)


def _check_object(value, spec: dict, where: str, path: str, others=None) -> None:
    """An object: every field of ``spec`` present (but a ``Maybe`` one) and no other field (``others``:
    any other field, each of that spec)."""
    if not isinstance(value, dict):
        raise _fail(path, where, f"expected object, got {_name(type(value))}")
    if others is not None:
        spec = {**{k: others for k in value}, **spec}
    for key in value:
        if key not in spec:
            here = f"{where}.{key}" if where else key
            near = difflib.get_close_matches(str(key), [str(k) for k in spec], n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(map(str, spec))}"
            raise _fail(path, here, f"unknown field ({hint})")
    for key, sub in spec.items():
        here = f"{where}.{key}" if where else key
        if key in value:
            _check(value[key], sub, here, path)
        elif not isinstance(sub, Maybe):
            raise _fail(path, here, "missing")


def _check_scalar(value, spec: type, where: str, path: str) -> None:
    if not isinstance(value, spec) or (spec is int and isinstance(value, bool)):
        raise _fail(path, where, f"expected {_name(spec)}, got {_name(type(value))}")
    field = where.rsplit(".", 1)[-1]
    low = 1 if field in _AT_LEAST_1 else 0
    if spec is int and value < low:
        raise _fail(path, where, f"expected an int >= {low}, got {value}")


def load_plan_dict(path: str) -> dict:
    """The plan file's JSON object, every field of ``PLAN_FIELDS`` checked (name and type), no field at
    any level that neither it nor ``REPORT_FIELDS`` names (the key's JSON path in the error), its
    stages numbered, placed and covering layers as ``check_stage_ranges`` asks (without the model's
    layer counts), and its schedule options known ones of the right type."""
    try:
        with open(path) as f:
            d = json.load(f)
    except OSError as e:
        raise ConfigError(f"--plan {path}: cannot read it ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"--plan {path}: not JSON ({e})") from None
    _check(d, {**PLAN_FIELDS, **REPORT_FIELDS}, "", path)
    _check_options(d["schedule_options"], path)
    check_stage_ranges(d["layout"], path)
    return d


def _check_options(options: dict, path: str) -> None:
    fields = ScheduleOptions.__dataclass_fields__
    for key, value in options.items():
        where = f"schedule_options.{key}"
        if key not in fields:
            raise _fail(path, where, f"unknown schedule option; known: {', '.join(sorted(fields))}")
        allowed = {t.strip() for t in str(fields[key].type).split("|")}
        kind = "int" if isinstance(value, int) and not isinstance(value, bool) else _name(type(value))
        if kind not in allowed and not (kind == "int" and "float" in allowed):
            raise _fail(path, where, f"expected {' or '.join(sorted(allowed))}, got {kind}")
    try:
        ScheduleOptions.from_any(options)
    except ConfigError as e:
        raise _fail(path, "schedule_options", str(e)) from None


def check_stage_ranges(layout: dict, path: str, layer_counts: Mapping[str, int] | None = None) -> None:
    """The stages of ``layout`` (a plan file's, types checked) numbered 0..n-1 in order, the encoder's
    before the LLM's (with one pipeline per encoder, every encoder's: ``_component_keys``; its layer
    count in ``layer_counts`` under its name), each component's covering ``[0, layer_counts[c])`` exactly once in order
    (without ``layer_counts``: from 0, contiguous), ``components.<c>.pp`` the count of pipeline ranks its
    stages are on (a rank may hold consecutive stages: the memory check splits one by recomputation
    mode), its stages on non-decreasing ranks, and the ranks used exactly ``0..R-1``."""
    stages = layout["stages"]
    for i, s in enumerate(stages):
        if s["stage"] != i:
            raise _fail(
                path,
                f"layout.stages[{i}].stage",
                f"expected {i} (stages are numbered 0..n-1 in order), got {s['stage']}",
            )
        if s["component"] not in ("encoder", "llm"):
            raise _fail(
                path, f"layout.stages[{i}].component", f"expected 'encoder' or 'llm', got {s['component']!r}"
            )
        if s.get("recompute", "none") not in RECOMPUTE_MODES:
            raise _fail(
                path,
                f"layout.stages[{i}].recompute",
                f"expected one of {', '.join(RECOMPUTE_MODES)}, got {s['recompute']!r}",
            )
    comps = [s["component"] for s in stages]
    if comps != sorted(comps, key=lambda c: c != "encoder") or len(set(comps)) != 2:
        raise _fail(path, "layout.stages", f"expected the encoder's stages then the llm's, got {comps}")
    for key in _component_keys(stages, layout["components"], path):
        mine = [(i, s) for i, s in enumerate(stages) if s.get("encoder", s["component"]) == key]
        _check_component(key, mine, layout["components"][key]["pp"], path, (layer_counts or {}).get(key))
    ranks = sorted({s["pp_rank"] for s in stages})
    if ranks != list(range(len(ranks))):
        raise _fail(
            path,
            "layout.stages",
            f"pipeline ranks {ranks} leave a rank without a stage; expected 0..{len(ranks) - 1}",
        )


def _component_keys(stages: list, components: dict, path: str) -> list[str]:
    """The keys ``layout.components`` must hold: ``encoder`` and ``llm`` in a one-encoder plan; with one
    pipeline per encoder, each encoder its stages name (``layout.stages[i].encoder``: every encoder
    stage names one, each encoder's stages consecutive) and ``llm``."""
    named = [(i, s["encoder"]) for i, s in enumerate(stages) if "encoder" in s]
    for i, name in named:
        where = f"layout.stages[{i}].encoder"
        if stages[i]["component"] != "encoder":
            raise _fail(path, where, f"{name!r} on an llm stage: only encoder stages name their encoder")
        if name in ("", "encoder", "llm"):
            raise _fail(path, where, f"{name!r}: an encoder is named neither '', 'encoder' nor 'llm'")
    unnamed = [i for i, s in enumerate(stages) if s["component"] == "encoder" and "encoder" not in s]
    if named and unnamed:
        raise _fail(path, f"layout.stages[{unnamed[0]}].encoder", "missing (every encoder stage names its encoder when one does)")  # fmt: skip
    names = [n for _, n in named]
    order = list(dict.fromkeys(names))
    if names != [n for n in order for _ in range(names.count(n))]:
        raise _fail(
            path, "layout.stages", f"encoder stages of {names}: each encoder's stages must be consecutive"
        )
    keys = [*(order or ["encoder"]), "llm"]
    for key in keys:
        if key not in components:
            raise _fail(path, f"layout.components.{key}", "missing")
    for key in components:
        if key not in keys:
            raise _fail(
                path, f"layout.components.{key}", f"unknown field (the stages' components: {', '.join(keys)})"
            )
    return keys


def _check_component(comp: str, mine: list, pp: int, path: str, num_layers: int | None) -> None:
    ranks = len({s["pp_rank"] for _, s in mine})
    if pp != ranks:
        raise _fail(
            path,
            f"layout.components.{comp}.pp",
            f"{pp}, but the layout puts the {comp} on {ranks} pipeline rank(s)",
        )
    end, rank = 0, -1
    for i, s in mine:
        first, stop = s["layers"]
        where = f"layout.stages[{i}].layers"
        if first != end:
            what = (
                f"layer(s) {end}..{first - 1} skipped"
                if first > end
                else f"layer(s) {first}..{end - 1} run twice"
            )
            raise _fail(path, where, f"[{first}, {stop}) after the {comp}'s layers up to {end}: {what}")
        if stop <= first:
            raise _fail(path, where, f"[{first}, {stop}) is empty")
        if num_layers is not None and stop > num_layers:
            raise _fail(path, where, f"[{first}, {stop}) ends past the model's {num_layers} {comp} layers")
        if s["pp_rank"] < rank:
            raise _fail(
                path,
                f"layout.stages[{i}].pp_rank",
                f"{s['pp_rank']}: the {comp}'s stages must be on non-decreasing pipeline ranks (previous {rank})",
            )
        end, rank = stop, s["pp_rank"]
    if num_layers is not None and end != num_layers:
        raise _fail(
            path,
            f"layout.stages[{mine[-1][0]}].layers",
            f"the {comp}'s stages end at layer {end}, but the model has {num_layers} {comp} layers (layer(s) {end}..{num_layers - 1} missing)",
        )
