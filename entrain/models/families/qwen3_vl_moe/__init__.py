"""Whole Qwen3-VL-MoE checkpoints (``--model-path``): transformers' own
``Qwen3VLMoeForConditionalGeneration`` — Qwen3-VL's tower and DeepStack with a mixture-of-experts
decoder (router, top-k experts, dense ``mlp_only_layers``, the auxiliary load-balancing loss) — as
Entrain stages.

* ``spec``: the architecture (cost model shapes) from ``config.json`` (torch-free).
* ``presets``: published shapes for ``plan`` / ``simulate`` (torch-free).
* ``family``: the ``ModelFamily`` (torch-free at import).
* ``model``: the MoE LLM stage and the per-sample routing statistics part.

Importing this package registers the family (torch-free).
"""

from entrain.models.families.qwen3_vl_moe.family import QWEN3_VL_MOE_FAMILY
from entrain.models.families.registry import register_family

register_family(QWEN3_VL_MOE_FAMILY, replace=True)
