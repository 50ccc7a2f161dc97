"""Whole Qwen2-VL and Qwen2.5-VL checkpoints (``--model-path``): transformers' own
``Qwen2VLForConditionalGeneration`` / ``Qwen2_5_VLForConditionalGeneration`` — the Qwen2(.5) vision
tower and the Qwen2 language model with multimodal rotary positions (M-RoPE) — as Entrain stages.

* ``spec``: the architecture (cost model shapes) from ``config.json`` (torch-free).
* ``family``: the ``ModelFamily`` (torch-free at import).
* ``positions``: the ``[3, T]`` M-RoPE ids of a packed batch, per sample by transformers' ``get_rope_index``.
* ``model``: meta-device build, per-rank tensor loading, stage modules.
* ``export``: one ``from_pretrained``-loadable folder.

Importing this package registers the family (torch-free).
"""

from entrain.models.families.qwen2_vl.family import QWEN2_VL_FAMILY
from entrain.models.families.registry import register_family

register_family(QWEN2_VL_FAMILY, replace=True)
