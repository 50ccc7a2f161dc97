"""A whole Qwen3-VL-MoE checkpoint's architecture from its ``config.json`` (torch-free).

Qwen3-VL (tower, DeepStack, interleaved M-RoPE: ``qwen3_vl.spec``) whose decoder layers' MLP is, on
the sparse layers, a mixture of experts: a router (``num_experts x hidden``, softmax, top
``num_experts_per_tok`` renormalised) and ``num_experts`` SwiGLU experts of width
``moe_intermediate_size``. A layer ``i`` is sparse unless it is in ``mlp_only_layers`` or
``(i + 1) % decoder_sparse_step != 0`` (then a dense MLP of ``intermediate_size``), as transformers'
``Qwen3VLMoeTextDecoderLayer`` decides.

Cost model: a sparse layer's FLOPs are the router's and the ``top_k`` active experts' per token (the
expected load of a balanced router), its parameters (memory) every expert's; its ``ExpertSpec`` says
which of those are the experts', so the cost model prices the busiest rank's expert tokens and the
all-to-all under ``--ep`` and shards the experts' memory (docs/design.md, "Mixture-of-experts costs"). With ``output_router_logits`` the auxiliary load-balancing loss needs
each sample's routing statistics at the loss: every LLM cut after the first sparse layer carries the
``router_stats`` part (``[samples, 2 * num_experts]`` float32), one row per sample, which is a few
KB against the hidden states' MB; a part's rows count tokens or image rows, so it is priced as zero.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from entrain.core.errors import ConfigError
from entrain.models.families.qwen3_vl.spec import Qwen3VLShape
from entrain.models.families.qwen3_vl.spec import shape_of_config as dense_shape_of_config
from entrain.models.families.registry import read_config

__all__ = ["MODEL_TYPES", "ROUTER_STATS", "Qwen3VLMoeShape", "claims", "shape_of_config", "shape_of_folder",
           "sparse_layers"]  # fmt: skip

MODEL_TYPES = ("qwen3_vl_moe",)
ROUTER_STATS = "router_stats"
"""The message part of per-sample routing statistics: row ``s`` = ``[top-k hits per expert, router
probability sum per expert]`` of sample ``s`` over the sparse layers run so far."""


def claims(config: dict) -> bool:
    return config.get("model_type") in MODEL_TYPES


def sparse_layers(num_layers: int, num_experts: int, sparse_step: int, mlp_only) -> tuple[int, ...]:
    """The decoder layers with a mixture of experts, as ``Qwen3VLMoeTextDecoderLayer`` picks them."""
    only = set(mlp_only)
    return tuple(
        i for i in range(num_layers) if i not in only and num_experts > 0 and (i + 1) % sparse_step == 0
    )


@dataclass(frozen=True)
class Qwen3VLMoeShape(Qwen3VLShape):
    """Qwen3-VL's shape plus the experts: ``num_experts`` of width ``moe_intermediate_size``, ``top_k``
    per token, on decoder layers ``sparse``; ``aux_loss``: the load-balancing loss is part of the loss
    (``output_router_logits``), weighted by ``aux_coef`` (``router_aux_loss_coef``)."""

    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    sparse: tuple[int, ...] = ()
    aux_loss: bool = False
    aux_coef: float = 0.0

    def moe_layer_params(self) -> int:
        """Router + every expert's gate/up/down projections."""
        h = self.llm.hidden_size
        return self.num_experts * h + self.num_experts * 3 * h * self.moe_intermediate_size

    def layer_specs(self, label_fraction: float | None = None) -> dict:
        """Qwen3-VL's specs with each sparse decoder layer's dense MLP replaced by the router and the
        ``top_k`` active experts (FLOPs, activations) and every expert (parameters)."""
        from entrain.core.model.layer_specs import ExpertSpec

        specs = super().layer_specs(label_fraction)
        llm = self.llm
        h, i, mi, k, e = (
            llm.hidden_size,
            llm.intermediate_size,
            self.moe_intermediate_size,
            self.top_k,
            self.num_experts,
        )
        llm_specs = list(specs["llm"])
        for layer in self.sparse:
            s = llm_specs[1 + layer]
            llm_specs[1 + layer] = replace(
                s,
                lin_flops=s.lin_flops - 2.0 * 3 * h * i + 2.0 * h * e + k * 2.0 * 3 * h * mi,
                # dense MLP's 6i bytes -> per active expert its gathered input and SwiGLU, + fp32 probs
                activation_bytes_per_token=s.activation_bytes_per_token - 6.0 * i + k * (6.0 * mi + 2.0 * h) + 8.0 * e,
                param_count=s.param_count - 3 * h * i + self.moe_layer_params(),
                experts=ExpertSpec(e, k, k * 2.0 * 3 * h * mi, e * 3 * h * mi),
            )  # fmt: skip
        return {**specs, "llm": llm_specs}

    def message_parts(self, component: str, layer: int) -> tuple:
        """Qwen3-VL's DeepStack parts, and on the LLM ``router_stats`` from the first sparse layer (list
        index ``sparse[0] + 1``) to the lm_head (the loss consumes it) when the auxiliary loss is on."""
        from entrain.core.model.layer_specs import MessagePart

        parts = super().message_parts(component, layer)
        carried = self.sparse and self.sparse[0] + 1 <= layer <= self.llm.num_hidden_layers + 2
        if component == "llm" and self.aux_loss and carried:
            parts += (MessagePart(ROUTER_STATS, 2 * self.num_experts, 4, rows="tokens", rows_per_token=0.0),)
        return parts


def _int(d: dict, keys: tuple[str, ...], where: str, default=None) -> int:
    for key in keys:
        if key in d:
            try:
                return int(d[key])
            except (TypeError, ValueError):
                raise ConfigError(f"{where}: {key} {d[key]!r} is not an integer") from None
    if default is None:
        raise ConfigError(f"{where}: lacks {keys[0]}")
    return default


def shape_of_config(config: dict, where: str, name: str, limits: dict | None = None) -> Qwen3VLMoeShape:
    """The ``Qwen3VLMoeShape`` of a ``config.json`` dict; ConfigError naming ``where`` and the field."""
    if not claims(config):
        raise ConfigError(
            f"{where}: model_type {config.get('model_type')!r} is not a whole Qwen3-VL-MoE checkpoint "
            f"(expected one of {', '.join(MODEL_TYPES)})"
        )
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(f"{where}: text_config missing or not an object")
    t = f"{where}: text_config"
    experts = _int(text, ("num_experts", "num_local_experts"), t)
    top_k = _int(text, ("num_experts_per_tok",), t)
    width = _int(text, ("moe_intermediate_size",), t)
    step = _int(text, ("decoder_sparse_step",), t, 1)
    mlp_only = text.get("mlp_only_layers") or []
    if experts <= 0 or not 0 < top_k <= experts or width <= 0 or step <= 0:
        raise ConfigError(
            f"{t}: num_experts {experts}, num_experts_per_tok {top_k}, moe_intermediate_size {width}, "
            f"decoder_sparse_step {step}: expected 0 < top-k <= experts and positive sizes"
        )
    dense_text = {"intermediate_size": width, **text}  # a checkpoint without dense layers may omit it
    base = dense_shape_of_config(
        {**config, "model_type": "qwen3_vl", "text_config": dense_text}, where, name, limits
    )
    layers = base.llm.num_hidden_layers
    if not isinstance(mlp_only, list) or any(not isinstance(i, int) or not 0 <= i < layers for i in mlp_only):
        raise ConfigError(
            f"{t}: mlp_only_layers {mlp_only!r}: expected decoder layer indexes in 0..{layers - 1}"
        )
    arch = replace(base.arch, description=f"qwen3_vl_moe {where}")
    return Qwen3VLMoeShape(
        arch,
        base.deepstack,
        base.num_position_embeddings,
        description=arch.description,
        num_experts=experts,
        top_k=top_k,
        moe_intermediate_size=width,
        sparse=sparse_layers(layers, experts, step, mlp_only),
        aux_loss=bool(text.get("output_router_logits", False)),
        aux_coef=float(text.get("router_aux_loss_coef", 0.001)),
    )  # fmt: skip


def shape_of_folder(folder: str) -> Qwen3VLMoeShape:
    from entrain.models.families.composition.spec import processor_limits

    where = os.path.join(folder, "config.json")
    name = f"hf:{os.path.basename(os.path.normpath(folder))}"
    return shape_of_config(read_config(folder), where, name, processor_limits(folder))
