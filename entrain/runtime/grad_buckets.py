"""Data-parallel gradient all-reduce in buckets, started while the pipeline still runs (DDP's scheme,
driven by the Plan's actions).

A rank's trainable parameters, in reverse registration order (the last stage's last layers first:
the order backward produces them), are cut into buckets of about ``BUCKET_BYTES``. A parameter's
gradient is *final* for the step

* when its stage has run its last backward action of the step (``B`` or ``W`` in this rank's action
  list), or earlier:
* inside that last backward, on a stage whose backward actions are all ``B``: once torch has
  accumulated its gradient once per ``B`` (``Tensor.register_post_accumulate_grad_hook``). ``W``
  accumulates weight gradients by hand (``stage_backward_weight``), which no hook sees, so a stage
  with split backwards (``I`` / ``W``) waits for its last ``W``; a parameter some ``B`` did not reach
  (a frozen path, a microbatch without images) waits for its stage's last ``B``.

A bucket whose parameters are all final is copied into one flat buffer and all-reduced
asynchronously (``async_op=True``) over the DP group, in bucket order only: every replica of a
pipeline rank holds the same buckets and launches them in the same order, whatever its own schedule.
After the last action ``flush`` launches the rest (a parameter no backward reached contributes
zeros); ``wait`` waits for every bucket before clipping and AdamW and copies the sums back.
FSDP reduces its own gradients (reduce-scatter) and uses none of this.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from entrain.core.ir.plan import Action, ActionKind
from entrain.runtime.parallelize import local

__all__ = ["BUCKET_BYTES", "GradBuckets", "Launch"]

BUCKET_BYTES = 25 * 2**20
"""Gradient bytes per all-reduce bucket (a bucket holds at least one parameter)."""

_BACKWARD = (ActionKind.B, ActionKind.W)


@dataclass
class _Bucket:
    params: list[torch.Tensor]
    group: object = None
    reduce: bool = True
    """False: no other process holds these parameters (an expert shard without replicas)."""
    pending: int = 0
    """Parameters whose gradient is not final yet this step."""
    flat: torch.Tensor | None = None
    work: object | None = None


@dataclass(frozen=True, slots=True)
class Launch:
    """When a bucket's all-reduce started: after ``actions_done`` of the step's actions, inside a
    backward (``in_hook``) or between actions, or by ``flush`` after the last one."""

    bucket: int
    actions_done: int
    in_hook: bool
    flushed: bool


def _cut(params: Sequence[torch.Tensor], bucket_bytes: int, group_of: Callable) -> list[_Bucket]:
    """Buckets of about ``bucket_bytes``, each of parameters reduced over one group (``group_of``)."""
    buckets, size_bytes = [_Bucket([])], 0
    for p in params:
        nbytes = local(p).numel() * p.element_size()
        group = group_of(p)
        if buckets[-1].params and (size_bytes + nbytes > bucket_bytes or buckets[-1].group is not group):
            buckets.append(_Bucket([]))
            size_bytes = 0
        buckets[-1].params.append(p)
        buckets[-1].group = group
        size_bytes += nbytes
    return [b for b in buckets if b.params]


@dataclass
class _StepState:
    stage_left: Counter = field(default_factory=Counter)
    """Backward actions (B, W) of each stage still to run this step."""
    hooks_wanted: dict[int, int] = field(default_factory=dict)
    """Per parameter (id): accumulations that make it final (0: wait for its stage)."""
    seen: Counter = field(default_factory=Counter)
    final: set[int] = field(default_factory=set)
    next_bucket: int = 0
    actions_done: int = 0
    armed: bool = False


class GradBuckets:
    """One rank's bucketed DP all-reduce (module docstring). ``stage_params``: trainable parameters
    per stage, in registration order; ``hooks``: finish parameters inside a backward (off under TP,
    whose DTensor parameters are reduced between actions)."""

    def __init__(
        self,
        stage_params: dict[int, list[torch.Tensor]],
        group,
        *,
        bucket_bytes: int = BUCKET_BYTES,
        hooks: bool = True,
        run: Callable[[str, Callable[[], object]], object] | None = None,
        group_of: Callable[[torch.Tensor], object] | None = None,
    ):
        ordered = [p for s in sorted(stage_params, reverse=True) for p in reversed(stage_params[s])]
        self.stage_params = stage_params
        self.stage_of = {id(p): s for s, ps in stage_params.items() for p in ps}
        self.buckets = _cut(ordered, bucket_bytes, group_of or (lambda p: group))
        for b in self.buckets:  # group None: held by this process alone (``group_of``), nothing to sum
            b.reduce = b.group is not None
        self.bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b.params}
        self.group = group
        self.run = run or (lambda what, fn: fn())
        """Runs a collective's wait (the trainer's: a failure names the peers behind)."""
        self.launches: list[Launch] = []
        self._step = _StepState()
        if hooks:
            for p in ordered:
                p.register_post_accumulate_grad_hook(self._on_accumulated)

    # --- the step -----------------------------------------------------------------------------------
    def start(self, actions: Sequence[Action]) -> None:
        """Arm for one step of this rank's ``actions``."""
        backward = [a for a in actions if a.kind in _BACKWARD]
        left = Counter(a.stage for a in backward)
        split = {a.stage for a in backward if a.kind is ActionKind.W}
        wanted = {pid: (0 if s in split else left[s]) for pid, s in self.stage_of.items()}
        self._step = _StepState(stage_left=left, hooks_wanted=wanted, armed=True)
        self.launches = []
        for b in self.buckets:
            b.pending, b.flat, b.work = len(b.params), None, None

    def after_action(self, a: Action) -> None:
        """Call after each action: a stage's last backward makes its parameters final."""
        st = self._step
        if not st.armed:
            return
        st.actions_done += 1
        if a.kind not in _BACKWARD:
            return
        st.stage_left[a.stage] -= 1
        if st.stage_left[a.stage] == 0:
            for p in self.stage_params.get(a.stage, ()):
                self._finish(p)
            self._launch_ready(in_hook=False)

    def flush(self) -> None:
        """After the last action: launch every bucket not launched yet, in order."""
        while self._step.next_bucket < len(self.buckets):
            self._launch(self._step.next_bucket, in_hook=False, flushed=True)

    def wait(self, what: str) -> None:
        """Wait for every bucket and copy the sums into the gradients; disarm."""
        self.flush()
        self._step.armed = False
        for b in self.buckets:
            if not b.reduce:
                continue
            self.run(what, b.work.wait)
            offset = 0
            for p in b.params:
                g = local(p.grad)
                g.copy_(b.flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
            b.flat = b.work = None

    # --- internals ----------------------------------------------------------------------------------
    def _on_accumulated(self, p: torch.Tensor) -> None:
        st = self._step
        wanted = st.hooks_wanted.get(id(p), 0)
        if not st.armed or wanted == 0:
            return
        st.seen[id(p)] += 1
        if st.seen[id(p)] > wanted:
            raise RuntimeError(
                f"a parameter of stage {self.stage_of[id(p)]} got gradient {st.seen[id(p)]} of {wanted} "
                "expected this step: its bucket was all-reduced too early"
            )
        if st.seen[id(p)] == wanted:
            self._finish(p)
            self._launch_ready(in_hook=True)

    def _finish(self, p: torch.Tensor) -> None:
        st = self._step
        if id(p) not in st.final:
            st.final.add(id(p))
            self.buckets[self.bucket_of[id(p)]].pending -= 1

    def _launch_ready(self, *, in_hook: bool) -> None:
        st = self._step
        while st.next_bucket < len(self.buckets) and self.buckets[st.next_bucket].pending == 0:
            self._launch(st.next_bucket, in_hook=in_hook, flushed=False)

    def _launch(self, index: int, *, in_hook: bool, flushed: bool) -> None:
        b = self.buckets[index]
        for p in b.params:
            if p.grad is None:  # no backward reached it this step: it adds zeros
                p.grad = torch.zeros_like(p)
        if b.reduce:
            b.flat = torch.cat([local(p.grad).reshape(-1) for p in b.params])
            b.work = dist.all_reduce(b.flat, group=b.group, async_op=True)
        self._step.next_bucket = index + 1
        self.launches.append(Launch(index, self._step.actions_done, in_hook, flushed))
