"""A plan file with one pipeline per encoder (``entrain plan --out`` where Entrain's ``encoder towers``
decision chose it): each encoder's stages named (``layout.stages[i].encoder``), each encoder's degrees
under its name in ``layout.components``, the microbatch count in ``schedule_options``. Read back
(``system_setup.read_plan_file``) it gives the layout as written and the configuration whose plans are the
searched configuration's (``encoders_plan.encoders_config``), so ``train --plan`` plans every step as the
planner's configuration does; a file that breaks the layout is one ``ConfigError`` naming the field."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache

import pytest

from entrain.core.errors import ConfigError
from entrain.core.planning.encoders_baselines import generate_disttrain_encoders_plan
from entrain.core.planning.encoders_plan import encoders_layout, generate_encoders_plan
from entrain.core.planning.system_setup import SystemSetup, read_plan_file, setup_to_json
from tests.core.test_encoder_allocation import _encoders
from tests.core.test_encoders_plan import _plan

RUN = {"model": "qwen25-omni-7b", "dataset": "omni", "min_pixels": 3136, "max_pixels": 12845056}


@cache
def _setup():
    best, batches, plan = _plan()
    layout = replace(
        plan.layout,
        stages=tuple(replace(s, recompute="full") if s.stage == 0 else s for s in plan.layout.stages),
    )  # a memory-fitted stage
    return best, batches, layout


def _counts() -> dict[str, int]:
    encoders = _encoders()
    return {**{e.name: e.cost.encoder.num_layers for e in encoders}, "llm": encoders[0].cost.llm.num_layers}


def _write(tmp_path, obj: dict):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(obj))
    return str(path)


def _file(layout, options: dict, system: str = "entrain") -> dict:
    return {**setup_to_json(system, SystemSetup(layout, options, "N-encoder planner (vision, audio)")), **RUN}


@pytest.mark.parametrize("count", ["paper", "requested"])
def test_the_file_gives_the_layout_and_the_configurations_plans(tmp_path, count):
    best, batches, layout = _setup()
    options = {} if count == "paper" else {"microbatch_count": count}
    system, setup = read_plan_file(_write(tmp_path, _file(layout, options)), layer_counts=_counts())
    assert system == "entrain" and setup.layout == layout and setup.options == options
    assert setup.config.microbatch_count == count and encoders_layout(setup.config) == layout
    encoders, searched = _encoders(), replace(best, microbatch_count=count)
    assert generate_encoders_plan(batches, encoders, setup.config).iterations == (
        generate_encoders_plan(batches, encoders, searched).iterations
    )
    assert generate_disttrain_encoders_plan(batches, encoders, setup.config).iterations == (
        generate_disttrain_encoders_plan(batches, encoders, best).iterations
    )


def test_the_files_decisions_are_the_setups(tmp_path):
    """``train --plan`` records the plan's decisions (``config.json``); an entry of other types is left out."""
    from entrain.core.planning.system_setup import Decision

    _, _, layout = _setup()
    made = Decision("encoder towers", "one pipeline per encoder", {"one pipeline per encoder": 1.0, "x": float("inf")},
                    0.0033, "one pipeline per encoder")  # fmt: skip
    obj = {**_file(layout, {}), "decisions": [made.to_json(), {"name": "microbatch count", "chosen": 3}]}
    _, setup = read_plan_file(_write(tmp_path, obj))
    assert setup.decisions == (made,)


def test_a_one_encoder_file_reads_as_before(tmp_path):
    from entrain.core.ir.plan import ComponentLayout, Layout, StageSpec

    stages = (StageSpec(0, "encoder", 0, 2, 0), StageSpec(1, "llm", 0, 3, 1))
    layout = Layout(1, 1, 4, {"encoder": ComponentLayout(), "llm": ComponentLayout()}, stages)
    _, setup = read_plan_file(_write(tmp_path, _file(layout, {})), layer_counts={"encoder": 2, "llm": 3})
    assert setup.layout == layout and setup.config is None


def _broken(layout, edit) -> dict:
    obj = _file(layout, {"microbatch_count": "requested"})
    edit(obj["layout"])
    return obj


def _drop_audio(lay):
    del lay["components"]["audio"]


def _encoder_on_llm(lay):
    lay["stages"][-1]["encoder"] = "audio"


def _unnamed(lay):
    del lay["stages"][0]["encoder"]


def _one_layer_short(lay):
    first = next(s for s in lay["stages"] if s.get("encoder") == "audio")
    first["layers"][0] = 1


def _shared_rank(lay):
    """The audio pipeline's first stage on the vision pipeline's last rank (the ranks stay 0..R-1)."""
    first = next(s["stage"] for s in lay["stages"] if s.get("encoder") == "audio")
    for s in lay["stages"][first:]:
        s["pp_rank"] -= 1


def _extra_component(lay):
    lay["components"]["video"] = {"tp": 1, "cp": 1, "pp": 1}


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (_drop_audio, "layout.components.audio: missing"),
        (_encoder_on_llm, "encoder: 'audio' on an llm stage"),
        (_unnamed, "layout.stages[0].encoder: missing"),
        (_one_layer_short, "layer(s) 0..0 skipped"),
        (_extra_component, "layout.components.video: unknown field"),
    ],
)
def test_a_broken_layout_is_one_line_naming_the_field(tmp_path, edit, field):
    _, _, layout = _setup()
    with pytest.raises(ConfigError) as e:
        read_plan_file(_write(tmp_path, _broken(layout, edit)), layer_counts=_counts())
    assert field in str(e.value) and str(e.value).startswith("--plan ") and "\n" not in str(e.value)


def test_a_layout_the_planner_does_not_make_and_a_system_train_does_not_plan_are_refused(tmp_path):
    _, _, layout = _setup()
    with pytest.raises(ConfigError, match="every stage is on its own pipeline rank"):
        read_plan_file(_write(tmp_path, _broken(layout, _shared_rank)))
    with pytest.raises(ConfigError, match="system 'dip' with one pipeline per encoder"):
        read_plan_file(_write(tmp_path, _file(layout, {}, system="dip")))
