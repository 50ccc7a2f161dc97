"""Whole Qwen3-VL checkpoints (``--model-path``): transformers' own ``Qwen3VLForConditionalGeneration``
— a ViT with a learned position table, DeepStack features from tapped vision blocks added to the
first LLM layers, and a Qwen3 decoder with interleaved M-RoPE — as Entrain stages.

* ``spec``: the architecture (cost model shapes) from ``config.json`` (torch-free).
* ``presets``: published shapes for ``plan`` / ``simulate`` (torch-free).
* ``family``: the ``ModelFamily`` (torch-free at import).
* ``positions``: the ``[3, T]`` M-RoPE ids of a packed batch, per sample by ``get_rope_index``.
* ``model``: meta-device build, per-rank tensor loading, stage modules with named message parts.
* ``export``: one ``from_pretrained``-loadable folder.

Importing this package registers the family (torch-free).
"""

from entrain.models.families.qwen3_vl.family import QWEN3_VL_FAMILY
from entrain.models.families.registry import register_family

register_family(QWEN3_VL_FAMILY, replace=True)
