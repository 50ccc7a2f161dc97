"""LLaVA-OneVision: SigLIP 384-px tiles (AnyRes) + projector + Qwen2, through transformers' own
``LlavaOnevisionForConditionalGeneration``. Importing this package registers the family (torch-free)."""

from entrain.models.families import registry
from entrain.models.families.llava_onevision.family import ONEVISION_FAMILY

registry.families()  # the built-in families first, whichever is imported first (stable preset order)
registry.register_family(ONEVISION_FAMILY, replace=True)
