"""Durations, message sizes and activation bytes of Plan actions under a ``CostModel``.

Shared by the generators that need timing (eager-forward budget, the greedy DIP interleaver) and
by the simulator, so every executor of a Plan prices an action the same way.

* A stage's time for a (sub-)microbatch = the sum over its layers of ``a*x^2 + b*x`` per sequence
  unit (an image's ViT patches on the encoder, a sample's tokens on the LLM) plus each layer's
  per-call constant ``c`` once (one call per (sub-)microbatch), at the component's TP/CP degree. An
  encoder (sub-)microbatch of text-only samples costs nothing: the runtime makes no call.
* A stage with a layer priced by a measured ``table`` (``Quadratic.table``, from ``entrain profile``)
  is not a quadratic, and one with a layer that runs on label tokens (``LayerCost.per_label``: the
  ``lm_head`` and the loss) depends on each sample's answer length where the data gives it: their
  (sub-)microbatch time is the exact ``CostModel.stage_ms`` over the samples' units and label
  tokens, summed per sample (memoised) plus the per-call constants once. Other stages, and label
  stages over samples without answer counts (``LABEL_FRACTION`` of the tokens: linear, so the closed
  form is exact), keep the closed form above.
* A raw-work sample (no token metadata) has only its whole-component forward+backward work ``w``.
  It is priced as ``x = w / sum_l (b_fwd,l + b_bwd,l)`` linear-equivalent tokens: each stage gets
  ``sum_{l in stage} b_l * x``, i.e. the sample's work split over stages (and over forward and
  backward) by the stages' share of the per-layer linear costs; activation and message bytes use
  the same ``x``. Per-call constants are added as for any sample.
* A split backward: ``I`` + ``W`` = the layers' backward plus the split's own cost
  (``LayerCost.split_extra_fraction`` and ``split_extra_ms``: phase ``bwd_split``); ``I`` = the
  layers' input-gradient parts of it (``LayerCost.bwd_input_fraction`` of each trainable layer's
  split backward, the whole backward of a frozen layer that passes gradients), ``W`` = the rest; a
  stage whose input needs no gradient (the first encoder stage) runs its whole backward as ``W``
  (``I`` costs 0), as the runtime does.
* Every compute action that does work (``F``, ``B``, ``I``, ``W``) also pays the hardware's
  ``action_overhead_ms``, however many layers the stage holds.
* A call of fewer tokens than the hardware's ``*_min_efficient_tokens`` has its size-dependent
  time multiplied by ``CostModel.small_call_factor`` (small sub-microbatches are not free).
* p2p time of a message = ``latency + bytes / bandwidth`` (``HardwareSpec``); gradient messages
  have the size of the activations they answer. DP all-reduce of a rank's trainable parameter
  gradients (bf16 ``param_bytes / tp``: ``LayerCost.rank_param_bytes``, replicated K/V projections
  whole): ``latency + 2 (dp-1)/dp * bytes / allreduce_bandwidth``.
* End of step (``step_end_ms``), once per iteration after the last rank's all-reduce: the hardware's
  ``step_end_ms`` plus ``step_end_ms_per_param_byte`` times the trainable parameter bytes of the
  pipeline rank holding the most (clipping and the optimizer update are per-parameter work; the DP
  all-reduce above is not in it). 0 unless a profile sets them (``entrain profile --from-trace``).
* Model state of a rank (``model_state_bytes``): 18 bytes per trainable parameter (bf16 weight, fp32
  gradient, fp32 master weight and AdamW m, v), 2 per frozen one, divided by TP — the planner's
  memory check (``costs.memory.ADAM_BYTES_PER_BF16_WEIGHT_BYTE``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from entrain.core.costs.costmodel import CostModel, HardwareSpec, parallel_key
from entrain.core.costs.memory import ADAM_BYTES_PER_BF16_WEIGHT_BYTE
from entrain.core.ir.plan import ActionKind, Layout
from entrain.core.workload.work import SampleWork

__all__ = ["PlanCosts", "StageQuad", "rank_param_bytes", "step_end_time_ms"]


@dataclass(frozen=True, slots=True)
class StageQuad:
    """A stage's summed per-unit quadratic ``a*x^2 + b*x`` and per-call constant ``c``, per phase."""

    fwd_a: float
    fwd_b: float
    fwd_c: float
    bwd_a: float
    bwd_b: float
    bwd_c: float
    activation_bytes_per_token: float
    output_bytes_per_token: float
    grad_bytes: float
    """Trainable parameter gradient bytes held by one rank of this stage (bf16, / tp)."""
    state_bytes: float = 0.0
    """Model state one rank of this stage holds (mixed-precision AdamW: bf16 weight + fp32 gradient +
    fp32 master, m, v = 18 bytes per trainable parameter, bf16 weights of frozen layers; / tp)."""
    activation_bytes_per_token_sq: float = 0.0
    """Activation bytes per squared sequence-unit length (eager attention's saved scores), / (tp*cp)."""
    bwd_input_a: float = 0.0
    bwd_input_b: float = 0.0
    bwd_input_c: float = 0.0
    """The input-gradient part of the split backward (``I``); 0 on a stage whose input needs no
    gradient (the first encoder stage): its whole backward is ``W``."""
    bwd_split_a: float = 0.0
    bwd_split_b: float = 0.0
    bwd_split_c: float = 0.0
    """The backward split into ``I`` + ``W`` (``bwd`` plus the split's own cost)."""
    expert_grad_bytes: float = 0.0
    """Of ``grad_bytes``: the mixture-of-experts layers' expert shards (all-reduced over the ``dp / ep``
    replicas holding the same experts)."""


def _fit_quadratic(f1: float, f2: float) -> tuple[float, float]:
    """(a, b) of ``g(x) = a x^2 + b x`` from ``g(1)`` and ``g(2)``."""
    a = (f2 - 2.0 * f1) / 2.0
    return a, f1 - a


class PlanCosts:
    """Prices the actions of Plans over ``layout`` for the given samples (ids -> work)."""

    def __init__(self, layout: Layout, cost: CostModel, samples: dict[str, SampleWork]):
        self.layout = layout
        self.cost = cost
        self.samples = samples
        self.stage_quads = tuple(self._stage_quad(i) for i in range(len(layout.stages)))
        self.tabled = tuple(
            self._has_table(i) or self._beside_audio_tower(i) for i in range(len(layout.stages))
        )
        """Per stage: whether it is priced exactly per sample, not by its quad: a layer has a cost table,
        or it is an encoder stage of a cost model whose encoder runs an audio tower (a sample's audio rows
        are that tower's, on the first layer, and no other layer's: ``CostModel.units``; the quad would
        price them as rows of every layer of the stage)."""
        self.expert_stages = tuple(self._has_experts(i) for i in range(len(layout.stages)))
        """Per stage: whether a layer is a mixture of experts (its calls add ``CostModel.expert_ms``)."""
        self.label_stages = tuple(self._has_label_layer(i) for i in range(len(layout.stages)))
        """Per stage: whether a layer runs on label tokens (priced per sample over samples whose
        answer counts are known)."""
        self._sample_ms: dict[tuple[int, str, str], float] = {}
        self._raw_tokens_per_ms = {c: self._linear_ms_per_token(c) for c in ("encoder", "llm")}
        self._unit_sums: dict[tuple[str, str], tuple[float, float]] = {}
        self._sums_memo: dict[tuple[str, tuple[str, ...]], tuple[float, float]] = {}
        self._dropped = tuple(self._dropped_bytes(i) for i in range(len(layout.stages)))
        """Per stage, per layer: bytes per token (and per squared unit) its recomputation re-creates."""
        self._input_grads = tuple(self._input_grad(i) for i in range(len(layout.stages)))
        self._phase_coefs = tuple(
            {
                "fwd": (q.fwd_a, q.fwd_b, q.fwd_c),
                "bwd": (q.bwd_a, q.bwd_b, q.bwd_c),
                "bwd_input": (q.bwd_input_a, q.bwd_input_b, q.bwd_input_c),
                "bwd_split": (q.bwd_split_a, q.bwd_split_b, q.bwd_split_c),
            }
            for q in self.stage_quads
        )
        self._compute_memo: dict[tuple[int, ActionKind, tuple[str, ...]], float] = {}
        self._message_memo: dict[tuple[int, tuple[str, ...]], float] = {}
        """compute_ms per (stage, kind, ids), a pure function of them: generators price the same
        (sub-)microbatch many times (candidate orders, eager budgets, the simulator)."""

    # --- per-stage coefficients --------------------------------------------------------------------
    def _stage_quad(self, stage: int) -> StageQuad:
        spec = self.layout.stages[stage]
        comp = spec.component
        par = self.layout.components.get(comp)
        tp, cp = (par.tp, par.cp) if par else (1, 1)
        first, end = spec.first_layer, spec.end_layer
        coef = []
        for phase in ("fwd", "bwd", "bwd_input", "bwd_split"):
            if phase == "bwd_input" and not self._input_grad(stage):
                coef += [0.0, 0.0, 0.0]
                continue

            def ms(units, calls, phase=phase):
                t = self.cost.stage_ms(comp, first, end, units, phase, tp, cp, num_calls=calls)
                if phase != "fwd":  # recomputation runs before the input gradients (in I, or in B)
                    t += sum(
                        self.cost.recompute_ms(comp, i, units, spec.recompute, tp, cp, calls)
                        for i in range(first, end)
                    )
                return t

            coef += [*_fit_quadratic(ms((1,), 0), ms((2,), 0)), ms((), 1)]
        layers = self.cost.component(comp).layers[first:end]
        kept, kept_sq = self.cost.kept_bytes_per_token(comp, first, end, spec.recompute)
        act, act_sq = kept / (tp * cp), kept_sq / (tp * cp)
        out = layers[-1].output_bytes_per_token / (tp * cp) if layers else 0.0
        ep = self._ep(comp)
        grad = sum(layer.rank_param_bytes(tp, ep) for layer in layers if layer.trainable)
        state = sum(
            layer.rank_param_bytes(tp, ep) * (ADAM_BYTES_PER_BF16_WEIGHT_BYTE if layer.trainable else 1.0)
            for layer in layers
        )
        experts = sum(
            x.experts.param_bytes / (tp * ep)
            for x in layers
            if x.trainable and x.experts is not None and ep > 1
        )
        return StageQuad(*coef[:6], act, out, grad, state, act_sq, *coef[6:], expert_grad_bytes=experts)

    def _ep(self, comp: str) -> int:
        par = self.layout.components.get(comp)
        return par.ep if par else 1

    def _has_experts(self, stage: int) -> bool:
        return any(layer.experts is not None for layer in self._layers(stage))

    def expert_ms(self, stage: int, phase: str, tokens: float) -> float:
        """One call's mixture-of-experts time beyond the balanced curves of ``stage`` over ``tokens`` LLM
        tokens (0 on a stage without experts; ``CostModel.expert_ms``)."""
        return self._expert_ms(stage, phase, tokens) if self.expert_stages[stage] else 0.0

    def _expert_ms(self, stage: int, phase: str, tokens: float) -> float:
        """A call's mixture-of-experts time beyond the stage's balanced curves (``CostModel.expert_ms``)."""
        spec = self.layout.stages[stage]
        tp, cp = self._parallel(spec.component)
        return self.cost.stage_expert_ms(
            spec.component, spec.first_layer, spec.end_layer, tokens, phase, tp, cp, self._ep(spec.component),
            spec.recompute,
        )  # fmt: skip

    def _dropped_bytes(self, stage: int) -> tuple[tuple[float, float], ...]:
        spec = self.layout.stages[stage]
        tp, cp = self._parallel(spec.component)
        coefs = self.cost.recompute_dropped_bytes_per_token(
            spec.component, spec.first_layer, spec.end_layer, spec.recompute
        )
        return tuple((a / (tp * cp), b / (tp * cp)) for a, b in coefs)

    def _input_grad(self, stage: int) -> bool:
        """Whether a stage sends a gradient upstream: its first layer's input needs one."""
        spec = self.layout.stages[stage]
        return self.cost.input_grad_needed(spec.component, spec.first_layer)

    def _parallel(self, comp: str) -> tuple[int, int]:
        par = self.layout.components.get(comp)
        return (par.tp, par.cp) if par else (1, 1)

    def _layers(self, stage: int):
        spec = self.layout.stages[stage]
        return self.cost.component(spec.component).layers[spec.first_layer : spec.end_layer]

    def _has_table(self, stage: int) -> bool:
        key = parallel_key(*self._parallel(self.layout.stages[stage].component))
        return any(
            q is not None and bool(q.table)
            for layer in self._layers(stage)
            for q in (layer.fwd.get(key), layer.bwd.get(key))
        )

    def _beside_audio_tower(self, stage: int) -> bool:
        """Whether ``stage`` is an encoder stage and the encoder runs an audio tower
        (``CostModel.audio_tower``)."""
        return self.layout.stages[stage].component == "encoder" and self.cost.audio_tower

    def _has_label_layer(self, stage: int) -> bool:
        return any(layer.per_label for layer in self._layers(stage))

    def _answers_known(self, ids: tuple[str, ...]) -> bool:
        samples = self.samples
        return any(samples[s].meta is not None and samples[s].meta.answer_tokens is not None for s in ids)

    def _variable_ms(self, stage: int, phase: str, sid: str) -> float:
        """A sample's share of a stage's time priced per sample (constants excluded), exact; raw-work
        samples keep their linear-equivalent price."""
        key = (stage, phase, sid)
        got = self._sample_ms.get(key)
        if got is None:
            spec = self.layout.stages[stage]
            work = self.samples[sid]
            if work.meta is not None:
                tp, cp = self._parallel(spec.component)
                units = self.cost.units(spec.component, work.meta)
                labels = self.cost.labels(spec.component, work.meta)
                got = self.cost.stage_ms(
                    spec.component, spec.first_layer, spec.end_layer, units, phase, tp, cp, 0, labels
                )
                if phase != "fwd":
                    got += sum(
                        self.cost.recompute_ms(spec.component, i, units, spec.recompute, tp, cp, 0, labels)
                        for i in range(spec.first_layer, spec.end_layer)
                    )
            else:
                q = self.stage_quads[stage]
                b = {"fwd": q.fwd_b, "bwd": q.bwd_b, "bwd_input": q.bwd_input_b, "bwd_split": q.bwd_split_b}[
                    phase
                ]
                got = b * self.unit_sums(spec.component, sid)[1]
            self._sample_ms[key] = got
        return got

    def _linear_ms_per_token(self, comp: str) -> float:
        """Sum over the whole component of the per-token linear coefficient, forward + backward."""
        par = self.layout.components.get(comp)
        tp, cp = (par.tp, par.cp) if par else (1, 1)
        n = self.cost.component(comp).num_layers
        total = 0.0
        for phase in ("fwd", "bwd"):
            g1 = self.cost.stage_ms(comp, 0, n, (1,), phase, tp, cp, num_calls=0)
            g2 = self.cost.stage_ms(comp, 0, n, (2,), phase, tp, cp, num_calls=0)
            total += _fit_quadratic(g1, g2)[1]
        return total

    # --- per-sample unit sums --------------------------------------------------------------------------
    def unit_sums(self, comp: str, sid: str) -> tuple[float, float]:
        """(sum of x^2, sum of x) over the sample's sequence units on ``comp``."""
        key = (comp, sid)
        got = self._unit_sums.get(key)
        if got is None:
            got = self._compute_unit_sums(comp, self.samples[sid])
            self._unit_sums[key] = got
        return got

    def _compute_unit_sums(self, comp: str, work: SampleWork) -> tuple[float, float]:
        if work.meta is not None:
            units = self.cost.units(comp, work.meta)
            return float(sum(x * x for x in units)), float(sum(units))
        per_token = self._raw_tokens_per_ms[comp]
        w = work.encoder if comp == "encoder" else work.llm
        return 0.0, (w / per_token if per_token > 0 else 0.0)

    def _sums(self, stage: int, ids: Iterable[str]) -> tuple[float, float]:
        if isinstance(ids, tuple):
            key = (self.layout.stages[stage].component, ids)
            got = self._sums_memo.get(key)
            if got is None:
                got = self._sums_memo[key] = self._sums_uncached(stage, ids)
            return got
        return self._sums_uncached(stage, ids)

    def _sums_uncached(self, stage: int, ids: Iterable[str]) -> tuple[float, float]:
        comp = self.layout.stages[stage].component
        sq = lin = 0.0
        for sid in ids:
            s, x = self.unit_sums(comp, sid)
            sq += s
            lin += x
        return sq, lin

    # --- prices -------------------------------------------------------------------------------------
    def compute_ms(self, stage: int, kind: ActionKind, ids: Iterable[str]) -> float:
        """Duration of a compute action over the samples ``ids`` (one call)."""
        key = (stage, kind, ids if isinstance(ids, tuple) else tuple(ids))
        got = self._compute_memo.get(key)
        if got is None:
            got = self._compute_memo[key] = self._compute_uncached(stage, kind, key[2])
        return got

    def _compute_uncached(self, stage: int, kind: ActionKind, ids: tuple[str, ...]) -> float:
        ms = self._work_ms(stage, kind, ids)
        return ms + self.cost.hardware.action_overhead_ms if ms > 0 else ms

    def _work_ms(self, stage: int, kind: ActionKind, ids: tuple[str, ...]) -> float:
        if not kind.is_compute:
            raise ValueError(f"{kind} is not a compute action")
        if kind is ActionKind.F:
            return self._phase_ms(stage, "fwd", ids)
        if kind is ActionKind.B:
            return self._phase_ms(stage, "bwd", ids)
        inp = self._phase_ms(stage, "bwd_input", ids) if self._input_grads[stage] else 0.0
        return inp if kind is ActionKind.I else self._phase_ms(stage, "bwd_split", ids) - inp

    def _phase_ms(self, stage: int, phase: str, ids: Iterable[str]) -> float:
        """One call of ``phase`` (``fwd``, ``bwd``, ``bwd_input``, ``bwd_split``) over the samples ``ids``."""
        a, b, c = self._phase_coefs[stage][phase]
        ids = tuple(ids)
        sq, lin = self._sums(stage, ids)
        comp = self.layout.stages[stage].component
        if comp == "encoder" and lin == 0:  # text-only samples: the runtime makes no encoder call
            return 0.0
        factor = self.cost.small_call_factor(comp, lin)
        if self.tabled[stage] or (self.label_stages[stage] and self._answers_known(ids)):
            ms = factor * sum(self._variable_ms(stage, phase, s) for s in ids) + c
        else:
            ms = factor * (a * sq + b * lin) + c
        if self.expert_stages[stage]:
            ms += self._expert_ms(stage, phase, lin)
        return ms

    def tokens(self, stage: int, ids: Iterable[str]) -> float:
        return self._sums(stage, ids)[1]

    def activation_bytes(self, stage: int, ids: Iterable[str]) -> float:
        """Bytes a forward of ``ids`` on ``stage`` keeps until its backward."""
        q = self.stage_quads[stage]
        sq, lin = self._sums(stage, ids)
        return q.activation_bytes_per_token * lin + q.activation_bytes_per_token_sq * sq

    def recompute_transient_bytes(self, stage: int, ids: Iterable[str]) -> float:
        """Bytes that exist only while a backward of ``ids`` on ``stage`` re-runs a layer's forward
        (``CostModel.recompute_transient_bytes``; 0 without recomputation)."""
        coefs = self._dropped[stage]
        if not coefs:
            return 0.0
        sq, lin = self._sums(stage, ids)
        return max([0.0, *(a * lin + b * sq for a, b in coefs)])

    def message_bytes(self, src_stage: int, ids: Iterable[str]) -> float:
        """Bytes of the activations ``src_stage`` sends for ``ids`` (gradients: the same size): its
        hidden states and every other part it declares (``StageSpec.parts``)."""
        ids = tuple(ids)
        hidden = self.stage_quads[src_stage].output_bytes_per_token * self.tokens(src_stage, ids)
        return hidden + sum(self.part_bytes(src_stage, ids).values())

    def part_bytes(self, src_stage: int, ids: tuple[str, ...]) -> dict[str, float]:
        """Bytes of each part besides the hidden states of ``src_stage``'s message for ``ids``."""
        spec = self.layout.stages[src_stage]
        if not spec.parts:
            return {}
        tp, cp = self._parallel(spec.component)
        tokens, images = self.tokens(src_stage, ids), sum(map(self._image_rows, ids))
        audio = sum(map(self._audio_rows, ids))
        return {p.name: p.bytes_for(tokens, images, audio) / (tp * cp) for p in spec.parts}

    def _image_rows(self, sid: str) -> float:
        meta = self.samples[sid].meta
        return float(sum(meta.image_tokens_per_image) + meta.video_tokens) if meta is not None else 0.0

    def _audio_rows(self, sid: str) -> float:
        meta = self.samples[sid].meta
        return float(meta.audio_tokens) if meta is not None else 0.0

    def message_ms(self, src_stage: int, ids: tuple[str, ...]) -> float:
        """p2p time of the message ``src_stage`` sends for ``ids`` (memoised)."""
        key = (src_stage, ids if isinstance(ids, tuple) else tuple(ids))
        got = self._message_memo.get(key)
        if got is None:
            got = self._message_memo[key] = self.p2p_ms(self.message_bytes(src_stage, ids))
        return got

    def p2p_ms(self, num_bytes: float) -> float:
        hw = self.cost.hardware
        return hw.p2p_latency_ms + num_bytes / hw.p2p_bandwidth_bytes_per_ms

    def model_state_bytes(self, pp_rank: int) -> float:
        """Weights, gradients and AdamW state held by one GPU of pipeline rank ``pp_rank`` (every stage
        it holds; the same per-parameter layout as the planner's memory check)."""
        return sum(
            q.state_bytes for s, q in zip(self.layout.stages, self.stage_quads) if s.pp_rank == pp_rank
        )

    def allreduce_ms(self, pp_rank: int) -> float:
        """DP gradient all-reduce time of one pipeline rank's stages (0 when dp == 1)."""
        dp = self.layout.dp
        if dp <= 1:
            return 0.0
        mine = [(s, q) for s, q in zip(self.layout.stages, self.stage_quads) if s.pp_rank == pp_rank]
        num_bytes = sum(q.grad_bytes for _, q in mine)
        if num_bytes <= 0:
            return 0.0
        hw = self.cost.hardware
        if not any(q.expert_grad_bytes for _, q in mine):
            return (
                hw.allreduce_latency_ms
                + 2.0 * (dp - 1) / dp * num_bytes / hw.allreduce_bandwidth_bytes_per_ms
            )
        # a stage's expert shards are reduced over the dp / ep replicas holding the same experts
        moved = 0.0
        for s, q in mine:
            r = dp // self._ep(s.component)
            moved += (
                2.0 * (dp - 1) / dp * (q.grad_bytes - q.expert_grad_bytes)
                + 2.0 * (r - 1) / r * q.expert_grad_bytes
            )
        return hw.allreduce_latency_ms + moved / hw.allreduce_bandwidth_bytes_per_ms

    def step_end_ms(self) -> float:
        """What the iteration spends after its actions and DP all-reduce (``step_end_time_ms``)."""
        return step_end_time_ms(self.layout, self.stage_quads, self.cost.hardware)


def rank_param_bytes(layout: Layout, quads: Sequence[StageQuad]) -> list[float]:
    """Per pipeline rank: the trainable parameter bytes of its stages (bf16, / tp, expert shards / ep:
    ``StageQuad.grad_bytes``), what its optimizer step and clipping go over."""
    out = [0.0] * layout.ranks_per_replica
    for spec, q in zip(layout.stages, quads):
        out[spec.pp_rank] += q.grad_bytes
    return out


def step_end_time_ms(layout: Layout, quads: Sequence[StageQuad], hw: HardwareSpec) -> float:
    """The end-of-step phase of an iteration (module docstring): ``hw.step_end_ms`` plus
    ``hw.step_end_ms_per_param_byte`` times the largest ``rank_param_bytes`` (every rank steps its
    optimizer after the gradient-norm all-reduce, so the heaviest one ends the step). The DP gradient
    all-reduce is not in it (``PlanCosts.allreduce_ms``)."""
    if not hw.step_end_ms and not hw.step_end_ms_per_param_byte:
        return 0.0
    return hw.step_end_ms + hw.step_end_ms_per_param_byte * max(rank_param_bytes(layout, quads), default=0.0)
