"""Qwen2.5-Omni thinker checkpoints (``--model-path``): transformers' own
``Qwen2_5OmniThinkerForConditionalGeneration`` — a Whisper-style audio tower, Qwen2.5-VL's vision
tower and a Qwen2 language model with time-aligned multimodal rotary positions — as Entrain stages.

* ``spec``: the architecture (cost model shapes) from ``config.json`` (torch-free).
* ``family``: the ``ModelFamily`` (torch-free at import).
* ``positions``: the ``[3, T]`` ids of a packed batch, per sample by transformers' ``get_rope_index``
  (images, videos, audio clips, videos with their audio track).
* ``model``: meta-device build, per-rank tensor loading, stage modules (the audio tower on the first
  encoder stage, its features a message part to the first LLM stage).
* ``export``: one ``from_pretrained``-loadable thinker folder.

Importing this package registers the family (torch-free).
"""

from entrain.models.families.qwen2_5_omni.family import QWEN2_5_OMNI_FAMILY
from entrain.models.families.registry import register_family

register_family(QWEN2_5_OMNI_FAMILY, replace=True)
