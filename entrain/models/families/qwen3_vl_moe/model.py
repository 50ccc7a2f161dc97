"""A whole Qwen3-VL-MoE checkpoint as Entrain pipeline stages.

The model is transformers' own ``Qwen3VLMoeForConditionalGeneration`` built on the meta device (only a
rank's stages' parameters read, as ``qwen3_vl.model`` does); the vision stages and the DeepStack
parts are Qwen3-VL's. Each decoder layer runs as transformers' ``Qwen3VLMoeTextDecoderLayer`` (router,
top-k experts, or the dense MLP of ``mlp_only_layers``).

The auxiliary load-balancing loss (``output_router_logits``), as transformers computes it for one
sequence (``load_balancing_loss_func`` with no attention mask): over the sparse layers ``l`` and the
sample's ``L`` tokens ``t``, with ``p = softmax(router_logits)`` and the top-k experts of ``p``,
``f_e = sum_{l,t} [e in topk] / (n_sparse * L)``, ``P_e = sum_{l,t} p_e / (n_sparse * L)`` and
``aux = num_experts * sum_e f_e * P_e``. It is a nonlinear function of sums over every sparse layer,
which live on several pipeline stages, so each sample's two sums travel with the message: part
``router_stats`` ``[samples, 2E]`` (float32, as transformers sums) is made by the LLM stage of the
first sparse layer, added to by every stage with sparse layers, and consumed by the loss stage; the
gradient of the probability sums flows back through the part to the routers that made them (the hit
counts carry none, as in transformers: top-k has no gradient).

A step's loss: each sample's transformers loss (token-mean CE + ``router_aux_loss_coef * aux``),
weighted by its share of the batch's label tokens — the CE part is Entrain's ``sum(token CE) /
label tokens of the batch`` as for every family, and sample ``s`` adds ``coef * aux_s * labels_s /
labels of the batch``. So the loss does not depend on packing, microbatches, cuts or replicas.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from entrain.core.errors import ConfigError
from entrain.models.families.qwen3_vl import model as dense
from entrain.models.families.qwen3_vl_moe.spec import MODEL_TYPES, ROUTER_STATS, shape_of_config

__all__ = [
    "read_hf_config",
    "build_model",
    "build_stage",
    "model_class",
    "MoeTextStage",
    "aux_loss",
    "expert_counts",
]


def read_hf_config(folder: str):
    """Transformers' config of the Qwen3-VL-MoE checkpoint in ``folder`` (ConfigError otherwise)."""
    return dense.read_hf_config(folder, shape_of_config)


def model_class() -> type:
    from transformers import Qwen3VLMoeForConditionalGeneration

    return Qwen3VLMoeForConditionalGeneration


def build_model(folder: str, *, stages=None, hf_config=None, strict: bool = True) -> nn.Module:
    """``qwen3_vl.model.build_model`` with transformers' MoE class, its experts run by transformers'
    ``eager`` loop over the routed experts (exact in every dtype; the default ``grouped_mm`` kernel
    refuses float64)."""
    config = hf_config if hf_config is not None else read_hf_config(folder)
    config._experts_implementation = "eager"
    return dense.build_model(
        folder, stages=stages, hf_config=config, strict=strict, cls=model_class(), model_types=MODEL_TYPES
    )


def routing_stats(logits: torch.Tensor, top_k: int, segments: torch.Tensor, num_samples: int) -> torch.Tensor:
    """``[samples, 2E]``: per sample, the top-k hits per expert and the router probability sum per
    expert of one layer's ``[T, E]`` router logits (``segments [T]``: each token's sample), as
    ``load_balancing_loss_func`` reduces them (softmax in the logits' dtype, sums in float32)."""
    probs = torch.softmax(logits, dim=-1)
    experts = logits.shape[-1]
    _, chosen = torch.topk(probs, top_k, dim=-1)
    hits = torch.zeros_like(probs, dtype=torch.float32).scatter_add_(
        1, chosen, torch.ones(chosen.shape, dtype=torch.float32, device=chosen.device)
    )
    stats = torch.cat([hits, probs.float()], dim=1)
    return stats.new_zeros((num_samples, 2 * experts)).index_add(0, segments, stats)


def aux_loss(stats: torch.Tensor, tokens: torch.Tensor, num_sparse: int) -> torch.Tensor:
    """``[samples]`` auxiliary losses from each sample's ``stats [samples, 2E]`` over ``num_sparse``
    sparse layers and its ``tokens [samples]``."""
    experts = stats.shape[1] // 2
    rows = (tokens * num_sparse).to(stats.dtype).unsqueeze(1)
    return experts * ((stats[:, :experts] / rows) * (stats[:, experts:] / rows)).sum(1)


@functools.lru_cache(maxsize=8)
def _segments(seq_lens: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``[T]``: each packed token's sample index (made on the host: no device synchronisation)."""
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    return torch.repeat_interleave(torch.arange(len(seq_lens)), lens).to(device, non_blocking=True)


def _keep_logits(module: nn.Module, args, out) -> None:
    """A router's forward hook: its ``[T, E]`` logits and ``[T, k]`` chosen experts, for the stage that
    ran it (a recomputation's call in backward leaves an entry the next forward overwrites)."""
    module.entrain_logits, module.entrain_experts = out[0], out[2]


def expert_counts(chosen: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``[E]`` int64: how many of the ``[T, k]`` routed (token, expert) slots chose each expert (made on
    the slots' device, no host synchronisation)."""
    flat = chosen.reshape(-1)
    return torch.zeros(num_experts, dtype=torch.int64, device=flat.device).index_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int64)
    )


class MoeTextStage(dense.TextStage):
    """Qwen3-VL's LLM stage; each sparse layer's router logits and chosen experts are read by a forward
    hook on its router. With the auxiliary loss on, the logits add to part ``router_stats``, and the
    loss stage adds each sample's weighted auxiliary loss. Every forward adds the chosen experts to
    ``expert_tokens`` (per sparse layer of the stage: tokens routed to each expert, ``take_routing``)."""

    def __init__(self, model: nn.Module, first: int, end: int):
        super().__init__(model, first, end)
        text = model.config.text_config
        layers = model.model.language_model.layers
        self.sparse = [i for i, layer in enumerate(layers) if hasattr(layer.mlp, "gate")]
        self.aux = bool(text.output_router_logits) and bool(self.sparse)
        self.top_k, self.num_experts, self.coef = (
            text.num_experts_per_tok,
            text.num_experts,
            text.router_aux_loss_coef,
        )
        self.expert_tokens: dict[int, tuple[torch.Tensor, int]] = {}
        """Per sparse layer of the stage run since the last ``take_routing``: the ``[E]`` tokens routed
        to each expert and the tokens routed."""
        for i in self.layer_ids:
            gate = layers[i].mlp.gate if i in self.sparse else None
            if gate is not None and not getattr(gate, "entrain_keeps_logits", False):
                gate.register_forward_hook(_keep_logits)
                gate.entrain_keeps_logits = True

    def sparse_layers(self) -> list[int]:
        """The stage's sparse layers (LLM decoder layer indices)."""
        return [i for i in self.layer_ids if i in self.sparse]

    def take_routing(self) -> dict[int, tuple[torch.Tensor, int]]:
        """Per sparse layer of the stage (``sparse_layers``; zeros for one that ran no token): the ``[E]``
        int64 tokens routed to each expert and the tokens routed, summed over the forwards since the
        last call, which starts the next sum."""
        taken, self.expert_tokens = self.expert_tokens, {}
        layers = self.llm.model.layers

        def zero(i: int) -> tuple[torch.Tensor, int]:
            device = layers[i].mlp.gate.weight.device
            return torch.zeros(self.num_experts, dtype=torch.int64, device=device), 0

        return {i: taken[i] if i in taken else zero(i) for i in self.sparse_layers()}

    def _carries(self, cut: int) -> bool:
        """Whether the message across LLM cut ``cut`` (a stage ending there) carries ``router_stats``."""
        return self.aux and self.sparse[0] + 2 <= cut <= len(self.llm.model.layers) + 3

    def parts_in(self) -> tuple[str, ...]:
        return super().parts_in() + ((ROUTER_STATS,) if self._carries(self.first) else ())

    def parts_out(self) -> tuple[str, ...]:
        return super().parts_out() + ((ROUTER_STATS,) if self._carries(self.end) else ())

    def decoder_layer(self, i: int, x: torch.Tensor, pos, emb, batch, parts: dict) -> torch.Tensor:
        x = super().decoder_layer(i, x, pos, emb, batch, parts)
        if i not in self.sparse:
            return x
        gate = self.llm.model.layers[i].mlp.gate
        logits, chosen = gate.__dict__.pop("entrain_logits"), gate.__dict__.pop("entrain_experts")
        counts, tokens = self.expert_tokens.get(i, (0, 0))
        self.expert_tokens[i] = (counts + expert_counts(chosen, self.num_experts), tokens + chosen.shape[0])
        if self.aux:
            stats = routing_stats(
                logits, self.top_k, _segments(batch.seq_lens, x.device), len(batch.seq_lens)
            )
            before = parts.get(ROUTER_STATS)
            parts[ROUTER_STATS] = stats if before is None else before + stats
        return x

    def loss(self, logits: torch.Tensor, batch, parts: dict) -> torch.Tensor:
        loss = super().loss(logits, batch, parts)
        if not self.aux:
            return loss
        stats = parts.pop(ROUTER_STATS)
        segments = _segments(batch.seq_lens, logits.device)
        labels = stats.new_zeros(len(batch.seq_lens)).index_add(  # each sample's label tokens
            0, segments[batch.label_positions], stats.new_ones(batch.label_positions.shape)
        )
        tokens = torch.tensor(batch.seq_lens, dtype=stats.dtype).to(stats.device, non_blocking=True)
        per_sample = aux_loss(stats, tokens, len(self.sparse))
        weights = labels * batch.loss_scale
        return loss + self.coef * (per_sample * weights).sum().to(loss.dtype)


def build_stage(model: nn.Module, component: str, first: int, end: int) -> nn.Module:
    if component != "llm":
        return dense.build_stage(model, component, first, end)
    n = dense.layer_counts(model)["llm"]
    if not 0 <= first < end <= n:
        raise ConfigError(f"llm stage layers [{first}, {end}) outside 0..{n}")
    return MoeTextStage(model, first, end)
