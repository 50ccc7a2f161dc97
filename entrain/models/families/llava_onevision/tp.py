"""LLaVA-OneVision's tensor-parallel plan (``torch.distributed.tensor.parallel``), per stage:

* SigLIP encoder layers: ``self_attn.q/k/v_proj`` column-wise (by heads: SigLIP's attention reshapes
  with ``-1`` heads, so it runs on the local heads unchanged), ``self_attn.out_proj`` row-wise;
  ``mlp.fc1`` column-wise, ``mlp.fc2`` row-wise. The embeddings (patch conv, positions), the layer
  norms and ``image_newline`` stay replicated.
* The projector (the merger layer): ``linear_1`` column-wise, ``linear_2`` row-wise (its output, the
  image features, replicated for ``pack_image_features``).
* LLM stages: the composition's Qwen2 plan (``composition.tp.tp_llm_stage``; fewer KV heads than
  TP ranks: replicated, ``composition.tp.replicate_kv_heads``).
"""

from __future__ import annotations

__all__ = ["check_tp", "apply_tp"]


def check_tp(shape, tp: int) -> None:
    """ConfigError unless ``tp`` divides every sharded dimension of ``shape`` (a ``OneVisionShape``)."""
    from entrain.models.families.composition.tp import check_tp_dims

    if tp == 1:
        return
    v, llm = shape.vision, shape.llm
    dims = {
        "vision heads": v.num_heads,
        "vision MLP width": v.intermediate_size,
        "projector width (LLM hidden size)": llm.hidden_size,
        "LLM attention heads": llm.num_attention_heads,
        "LLM MLP width": llm.intermediate_size,
        "vocabulary": llm.vocab_size,
    }
    check_tp_dims(tp, dims, llm.num_key_value_heads or llm.num_attention_heads)


def apply_tp(stage, mesh) -> None:
    """Tensor-parallelise the layers stage ``stage`` owns over ``mesh`` (its TP group)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from entrain.models.families.composition.tp import fc_plan, tp_llm_stage
    from entrain.models.families.llava_onevision.model import EncoderStage

    if not isinstance(stage, EncoderStage):
        tp_llm_stage(stage, mesh)
        return
    plan = {f"self_attn.{p}_proj": ColwiseParallel() for p in "qkv"}
    plan["self_attn.out_proj"] = RowwiseParallel()
    for i in stage.layer_ids:
        layer = stage.tower.encoder.layers[i]
        parallelize_module(layer, mesh, {**plan, **fc_plan("mlp.")})
        layer.self_attn.num_heads //= mesh.size()
    if stage.has_merger:
        parallelize_module(
            stage.projector, mesh, {"linear_1": ColwiseParallel(), "linear_2": RowwiseParallel()}
        )
