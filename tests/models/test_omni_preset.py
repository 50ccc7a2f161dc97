"""The ``qwen25-omni-7b`` cost-model preset: its numbers (``entrain.core.model.omni``) are transformers'
thinker config defaults but for the vision width (the released checkpoint's 1280), the Omni family
serves it, its shape reads them, and training it is refused in one line."""

from __future__ import annotations

import pytest

from entrain.core.errors import ConfigError
from entrain.core.model.omni import QWEN25_OMNI_7B, QWEN25_OMNI_7B_AUDIO, QWEN25_OMNI_7B_THINKER_CONFIG
from entrain.models.families.base import ModelSource
from entrain.models.families.registry import family_of_preset


def test_preset_numbers_are_the_thinker_config_defaults():
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen2_5OmniThinkerConfig()
    cfg = QWEN25_OMNI_7B_THINKER_CONFIG
    assert cfg["tie_word_embeddings"] == hf.tie_word_embeddings
    for part, theirs in (("audio_config", hf.audio_config), ("text_config", hf.text_config),
                         ("vision_config", hf.vision_config)):  # fmt: skip
        for key, value in cfg[part].items():
            if key == "rope_theta":
                assert value == theirs.rope_parameters["rope_theta"]
            elif (part, key) == ("vision_config", "hidden_size"):
                assert (value, theirs.hidden_size) == (
                    1280,
                    3584,
                )  # the class default is not the checkpoint's
            else:
                assert _plain(getattr(theirs, key)) == _plain(value), (
                    part,
                    key,
                )


def test_the_omni_family_serves_the_preset_from_those_numbers():
    family = family_of_preset(QWEN25_OMNI_7B)
    shape = family.shape(ModelSource(preset=QWEN25_OMNI_7B))
    assert shape.name == QWEN25_OMNI_7B
    assert (shape.vision.depth, shape.vision.hidden_size, shape.vision.num_heads) == (32, 1280, 16)
    llm = shape.llm
    assert (llm.num_hidden_layers, llm.hidden_size, llm.num_attention_heads, llm.num_key_value_heads) == (
        28,
        3584,
        28,
        4,
    )
    assert (llm.intermediate_size, llm.vocab_size, llm.tie_word_embeddings) == (18944, 152064, False)
    a = shape.audio
    assert (a.encoder_layers, a.d_model, a.encoder_attention_heads, a.encoder_ffn_dim, a.output_dim) == (
        QWEN25_OMNI_7B_AUDIO.encoder_layers,
        1280,
        20,
        5120,
        3584,
    )
    assert 8.8e9 < shape.num_params() < 9.0e9  # the thinker: 7.6B decoder + 0.67B vision + 0.64B audio
    with pytest.raises(ConfigError, match="cost-model preset") as e:
        family.runtime_config(ModelSource(preset=QWEN25_OMNI_7B))
    assert "\n" not in str(e.value)


def _plain(value):
    return list(value) if isinstance(value, (list, tuple)) else value


def test_both_paths_price_a_clip_with_the_audio_towers_own_layers():
    """The one-encoder cost model of the preset (both towers in the first stages) prices a sample's audio
    rows with the audio tower's layers on the first encoder layer, where the runtime runs it, exactly as
    the N-encoder planner prices its audio pipeline (``planning.encoders.shape_encoders``), and its vision
    rows with the vision tower's layers: not the audio rows as rows of the vision layers."""
    from entrain.core.costs.presets import build_cost_model
    from entrain.core.planning.encoders import encoder_works, shape_encoders
    from entrain.core.workload.samples import SampleMeta

    shape = family_of_preset(QWEN25_OMNI_7B).shape(ModelSource(preset=QWEN25_OMNI_7B))
    one = build_cost_model(shape, "a40-flops")
    encoders = shape_encoders(shape, "a40-flops")
    heard = SampleMeta("heard", (), 20, audio=(1000,))
    both = SampleMeta("both", ((448, 448),), 20, audio=(3000,))
    for meta in (heard, both):
        (w,) = encoder_works([meta], encoders)
        assert one.sample_work(meta).encoder == pytest.approx(sum(w.encoders), rel=1e-9)
    assert encoder_works([heard], encoders)[0].encoders[0] == 0.0  # no vision work in a clip alone
    n = one.encoder.num_layers
    units = one.units("encoder", heard)
    assert units == heard.encoder_units  # sums and memory see every row, as before
    assert one.stage_ms("encoder", 1, n, units, "fwd", num_calls=0) == 0.0  # the audio tower: the first layer
    assert one.stage_ms("encoder", 0, 1, units, "fwd", num_calls=0) > 0.0
    assert one.to_json() == type(one).from_json(one.to_json()).to_json()
