"""Architecture numbers and cost-model presets."""

import dataclasses

import pytest

from entrain.core.architectures import MODEL_PRESETS, QWEN2_VOCAB_SIZE, get_arch
from entrain.core.errors import ConfigError

# sum(p.numel()) of the transformers 5.24.0 modules built from these configs (measured once, meta device).
HF_PARAM_COUNTS = {
    "tiny": (809_472, 1_344_128),
    "qwen25vl-llama3-1b": (668_684_288, 1_284_311_040),
    "qwen25vl-llama3-3b": (673_928_192, 3_285_494_784),
}


@pytest.mark.parametrize("name", sorted(HF_PARAM_COUNTS))
def test_param_counts_match_transformers(name):
    arch = get_arch(name)
    assert (arch.vision.num_params(), arch.llm.num_params()) == HF_PARAM_COUNTS[name]


def test_published_sizes():
    """675M vision tower (Qwen2.5-VL, merger to 3584), Llama-3.2 1.24B / 3.21B with their own 128,256 vocab."""
    vit = dataclasses.replace(get_arch("qwen25vl-llama3-1b").vision, out_hidden_size=3584)
    assert vit.num_params() == pytest.approx(675e6, rel=0.005)
    llm1 = dataclasses.replace(get_arch("qwen25vl-llama3-1b").llm, vocab_size=128_256)
    llm3 = dataclasses.replace(get_arch("qwen25vl-llama3-3b").llm, vocab_size=128_256)
    assert llm1.num_params() == pytest.approx(1.236e9, rel=0.002)
    assert llm3.num_params() == pytest.approx(3.213e9, rel=0.002)


def test_arch_facts():
    a = get_arch("qwen25vl-llama3-1b")
    assert a.vision.window_patches == 64 and a.vision.patch_dim == 1176 and a.vision.merge_factor == 4
    assert a.vision.fullatt_block_indexes == (7, 15, 23, 31)
    assert a.llm.vocab_size == QWEN2_VOCAB_SIZE and a.llm.head_dim == 64 and a.llm.tie_word_embeddings
    assert get_arch("qwen25vl-llama3-3b").llm.head_dim == 128
    t = get_arch("tiny")
    assert t.llm.vocab_size <= 4096 and not t.llm.tie_word_embeddings
    assert t.vision.hf_kwargs()["fullatt_block_indexes"] == [1]
    assert set(MODEL_PRESETS) == {"tiny", "qwen25vl-llama3-1b", "qwen25vl-llama3-3b"}


def test_unknown_arch():
    with pytest.raises(ConfigError, match="unknown model preset"):
        get_arch("gpt5")
