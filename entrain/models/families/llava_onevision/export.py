"""``entrain export`` of LLaVA-OneVision: ONE Hugging Face folder ``DIR`` that
``LlavaOnevisionForConditionalGeneration.from_pretrained`` loads.

    DIR/config.json + model.safetensors   the trained model (untied: embedding and lm_head train apart)
    DIR/<processor and tokenizer files>   copied from the --model-path folder (a preset: its image
                                          processor's preprocessor_config.json)

A preset's config is ``model.hf_config_of`` of its shape; a checkpoint run's is its folder's own.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from entrain.core.errors import ConfigError
from entrain.models.families.hf_export import copy_source_files, save_whole

__all__ = ["export"]


def export(manifest: dict, params: dict[str, torch.Tensor], out: str) -> dict:
    """``ModelFamily.export``: ``image_token_id``, ``files``, and ``vision`` = ``llm`` = the one folder
    (the export schema's required folder fields; the whole model holds both)."""
    from transformers import LlavaOnevisionForConditionalGeneration

    folder = (manifest.get("model_source") or {}).get("model_path")
    config = _config(manifest, folder)
    params = {**_unused(config, folder, set(params)), **params}

    def extra_files(out: str) -> list[str]:
        return copy_source_files(folder, out) if folder is not None else _preset_processor(manifest, out)

    model_class = LlavaOnevisionForConditionalGeneration
    files = save_whole(model_class, config, params, folder or manifest["model"], out, extra_files)
    return {
        "vision": str(out),
        "llm": str(out),
        "image_token_id": int(config.image_token_index),
        "files": files,
    }


def _unused(config, folder: str | None, trained: set[str]) -> dict[str, torch.Tensor]:
    """The parameters no stage owns (the forward never reads them: SigLIP's ``post_layernorm``, its
    layers past ``vision_feature_layer``), so ``from_pretrained`` finds every tensor: the source
    folder's, or a preset's fresh initialisation."""
    from transformers import LlavaOnevisionForConditionalGeneration

    from entrain.models.families.llava_onevision import model as ov

    meta = ov.OneVisionModel(config.__class__.from_dict(config.to_dict()), meta=True)
    owned = {
        n
        for c in ("encoder", "llm")
        for n, _ in ov.build_stage(meta, c, 0, len(meta.layer_names(c))).owned_parameters()
    }
    names = {n for n, _ in meta.hf.named_parameters()} - owned - trained
    if not names:
        return {}
    if folder is not None:
        from entrain.models.families.composition.hf_checkpoint import SafetensorsFolder

        reader = SafetensorsFolder(folder)
        keys = {n: next((k for k in ov.checkpoint_keys(n) if k in reader), None) for n in names}
        found = reader.read({k for k in keys.values() if k is not None})
        return {n: found[k] for n, k in keys.items() if k is not None}
    torch.manual_seed(0)
    fresh = dict(LlavaOnevisionForConditionalGeneration(config).named_parameters())
    return {n: fresh[n].detach() for n in names}


def _config(manifest: dict, folder: str | None):
    """The run's ``LlavaOnevisionConfig``, untied and with standard attention."""
    from entrain.models.families.llava_onevision import model as ov
    from entrain.models.families.llava_onevision.presets import PRESETS

    if folder is not None:
        config = ov.read_config(folder)
    elif manifest["model"] in PRESETS:
        config = ov.hf_config_of(PRESETS[manifest["model"]])
    else:
        raise ConfigError(
            f"the run's model {manifest['model']!r} is no llava_onevision preset and has no folder"
        )
    config.tie_word_embeddings = False
    config.text_config.tie_word_embeddings = False
    return config


def _preset_processor(manifest: dict, out: str) -> list[str]:
    """A preset's image processor (``preprocessor_config.json``: its tile size and grid pinpoints)."""
    from entrain.models.families.llava_onevision.presets import PRESETS
    from entrain.models.families.llava_onevision.processing import shape_processor

    before = set(os.listdir(out))
    shape_processor(PRESETS[manifest["model"]], None).save_pretrained(out)
    return [str(Path(out) / f) for f in sorted(set(os.listdir(out)) - before)]
