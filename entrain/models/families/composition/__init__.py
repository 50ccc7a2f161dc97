"""Today's composition: a Qwen2-VL / Qwen2.5-VL vision tower feeding a Llama / Qwen2 causal LM with
1-D positions (presets ``tiny``, ``qwen25vl-*``; stock ``--vision-model`` + ``--llm-model``)."""
