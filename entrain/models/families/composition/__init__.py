"""Today's composition: a Qwen2-VL / Qwen2.5-VL vision tower feeding a Llama / Qwen2 causal LM with
1-D positions (presets ``tiny``, ``qwen25vl-*``; stock ``--vision-model`` + ``--llm-model``).
Importing this package registers the family (torch-free)."""

from entrain.models.families.composition.family import COMPOSITION_FAMILY
from entrain.models.families.registry import register_family

register_family(COMPOSITION_FAMILY, replace=True)
