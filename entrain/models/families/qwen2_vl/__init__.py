"""Whole Qwen2-VL and Qwen2.5-VL checkpoints (``--model-path``): transformers' own
``Qwen2VLForConditionalGeneration`` / ``Qwen2_5_VLForConditionalGeneration`` — the Qwen2(.5) vision
tower and the Qwen2 language model with multimodal rotary positions (M-RoPE) — as Entrain stages.

* ``positions``: the ``[3, T]`` M-RoPE ids of a packed batch, per sample by transformers' ``get_rope_index``.
* ``model``: meta-device build, per-rank tensor loading, stage modules.
"""
