"""Forked gloo workers for runtime tests (docs/design.md §6.6): the parent has imported
torch and transformers already, workers fork from it (no re-import), rendezvous through a file store
in the test's tmp folder, use one thread each, and report through files. A worker that raises writes
its traceback, which the parent re-raises; a hung group fails after ``timeout_s``."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import pickle
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from entrain.core.ir.plan import IterationPlan
from entrain.core.workload.samples import SampleMeta
from entrain.models.families.composition.config import VLMConfig
from entrain.models.families.composition.model import VLM
from entrain.runtime.data import SampleRenderer
from entrain.runtime.trainer import PipelineTrainer, StepResult


def _worker(
    fn: Callable,
    rank: int,
    world: int,
    folder: str,
    args: tuple,
    pg_timeout_s: float,
    clean_shutdown: bool,
    device: str,
) -> None:
    out = Path(folder) / f"rank{rank}.pkl"
    try:
        torch.set_num_threads(1)
        from entrain.runtime.distributed import DEVICE_ENV, init_distributed, shutdown

        os.environ[DEVICE_ENV] = device  # forked: this worker's own environment

        env = init_distributed(
            timeout_s=pg_timeout_s, rank=rank, world_size=world, init_method=f"file://{folder}/store"
        )
        result = fn(env, *args)
        if clean_shutdown:
            shutdown()
        out.write_bytes(pickle.dumps(("ok", result)))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.write_bytes(pickle.dumps(("error", traceback.format_exc())))
        os._exit(1)
    os._exit(0)


def run_workers(
    fn: Callable,
    world: int,
    folder: Path,
    *args,
    timeout_s: float = 60.0,
    pg_timeout_s: float = 60.0,
    clean_shutdown: bool = True,
    device: str = "cpu",
) -> list:
    """Run ``fn(env, *args)`` on ``world`` forked ranks; returns each rank's result. ``pg_timeout_s``:
    the process-group timeout; ``clean_shutdown=False`` skips the final barrier (broken groups);
    ``device``: ``ENTRAIN_DEVICE`` of the workers (``cpu``: gloo even where a GPU is visible)."""
    torch.set_num_threads(1)
    folder.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("fork")
    procs = [
        ctx.Process(
            target=_worker, args=(fn, r, world, str(folder), args, pg_timeout_s, clean_shutdown, device)
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout_s)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
        procs[r].join()
    results = []
    for r in range(world):
        f = folder / f"rank{r}.pkl"
        if not f.exists():
            raise AssertionError(
                f"rank {r} produced no result (hung: {hung}, exit codes {[p.exitcode for p in procs]})"
            )
        status, value = pickle.loads(f.read_bytes())
        if status != "ok":
            raise AssertionError(f"rank {r} failed:\n{value}")
        results.append(value)
    return results


@dataclass(frozen=True)
class ReferenceStep:
    """A single-process reference step: gradients before and after clipping, their global norm
    before clipping, and the loss."""

    grads: dict[str, torch.Tensor]
    clipped: dict[str, torch.Tensor]
    grad_norm: float
    loss: float


def reference_step(
    model: VLM,
    cfg: VLMConfig,
    metas: dict[str, SampleMeta],
    ids: list[str],
    *,
    seed: int,
    max_grad_norm: float | None,
) -> ReferenceStep:
    """Single process, full batch, every sample alone (unpacked) through the Hugging Face modules:
    ``loss = sum(token CE) / label tokens of the batch``; then global-norm clipping (torch's)."""
    dtype = next(model.parameters()).dtype
    r = SampleRenderer(cfg, dict(metas), seed=seed, dtype=dtype)
    num_labels = r.num_labels(ids)
    model.zero_grad(set_to_none=True)
    total = 0.0
    for sid in ids:
        s = r.sample(sid)
        emb = model.llm.model.embed_tokens(s.input_ids)
        if s.grid_thw:
            grid = torch.tensor(s.grid_thw, dtype=torch.int64)
            feats = model.vision(r.patches(sid), grid).pooler_output
            emb = emb.index_put((s.image_positions,), feats)
        hidden = model.llm.model(inputs_embeds=emb[None]).last_hidden_state
        logits = model.llm.lm_head(hidden[0, s.label_positions])
        loss = F.cross_entropy(logits.float(), s.targets, reduction="sum") / num_labels
        loss.backward()
        total += float(loss.detach())
    params = [p for p in model.parameters() if p.grad is not None]
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    norm = float(torch.sqrt(sum(p.grad.double().pow(2).sum() for p in params)))
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    clipped = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return ReferenceStep(grads, clipped, norm, total)


def reference_grads(
    model: VLM,
    cfg: VLMConfig,
    metas: dict[str, SampleMeta],
    ids: list[str],
    *,
    seed: int,
    max_grad_norm: float | None,
) -> tuple[dict[str, torch.Tensor], float]:
    """``reference_step``'s clipped gradients and loss."""
    ref = reference_step(model, cfg, metas, ids, seed=seed, max_grad_norm=max_grad_norm)
    return ref.clipped, ref.loss


def train_step_before_clip(trainer: PipelineTrainer, it: IterationPlan) -> tuple[StepResult, dict]:
    """``trainer.train_step(it)`` and this rank's gradients as they were just before clipping."""
    before: dict[str, torch.Tensor] = {}
    clip = trainer._clip  # the step's clipping (and grad-norm) stage, between backward and AdamW

    def snapshot_then_clip() -> float:
        before.update(trainer.named_grads())
        return clip()

    trainer._clip = snapshot_then_clip
    try:
        result = trainer.train_step(it)
    finally:
        del trainer._clip
    assert before, "train_step did not call _clip: the pre-clip snapshot hook no longer applies"
    return result, before


def assert_matches_reference(
    name: str,
    *,
    before: dict[str, torch.Tensor],
    after: dict[str, torch.Tensor],
    loss: float,
    grad_norm: float,
    ref: ReferenceStep,
    tol: float,
) -> None:
    """Per tensor, the gradients before clipping equal the reference's unclipped ones and after
    clipping its clipped ones (relative error < ``tol``); the reported grad norm (before clipping)
    and the loss equal the reference's. Any constant scaling of the gradients, before or after the
    norm is taken, fails one of these."""
    for what, grads, ref_grads in (
        ("before clipping", before, ref.grads),
        ("after clipping", after, ref.clipped),
    ):
        errors = relative_errors(grads, ref_grads)
        worst = max(errors, key=errors.get)
        assert errors[worst] < tol, f"{name}: {worst} {what}: relative error {errors[worst]:.3g} >= {tol}"
    assert abs(grad_norm - ref.grad_norm) < tol * ref.grad_norm, (
        f"{name}: grad norm {grad_norm} vs reference {ref.grad_norm}"
    )
    assert abs(loss - ref.loss) < 1e-5 * abs(ref.loss), f"{name}: loss {loss} vs reference {ref.loss}"


def relative_errors(grads: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    out = {}
    for name, g_ref in ref.items():
        g = grads.get(name)
        if g is None:
            out[name] = float("inf")
            continue
        out[name] = float((g.double() - g_ref.double()).norm() / max(float(g_ref.double().norm()), 1e-12))
    extra = set(grads) - set(ref)
    for name in extra:
        out[name] = float(grads[name].norm())
    return out


def dumps(obj) -> bytes:
    return pickle.dumps(obj)


class PeakTensorMemory(TorchDispatchMode):
    """Peak bytes of live tensor storages created while active (every op's outputs, whatever holds
    them: autograd's saved tensors, checkpoint inputs, recomputed activations, gradients). A storage
    counts from the op that made it until it is freed (a weak reference's callback)."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.refs: dict[int, weakref.ref] = {}
        self.current = self.peak = 0

    def _free(self, key: int, _ref) -> None:
        self.current -= self.live.pop(key, 0)
        self.refs.pop(key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                st = t.untyped_storage()
                key = id(st)
                if key not in self.live:
                    self.live[key] = st.nbytes()
                    self.refs[key] = weakref.ref(st, functools.partial(self._free, key))
                    self.current += self.live[key]
                    self.peak = max(self.peak, self.current)
        return out
