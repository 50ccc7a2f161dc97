"""InternVL: InternViT 448-px dynamic tiles + pixel shuffle + projector + Qwen2 / Qwen3 / Llama, through
transformers' own ``InternVLForConditionalGeneration``. Importing this package registers the family
(torch-free)."""

from entrain.models.families import registry
from entrain.models.families.internvl.family import INTERNVL_FAMILY

registry.families()  # the built-in families first, whichever is imported first (stable preset order)
registry.register_family(INTERNVL_FAMILY, replace=True)
