"""One training run on this rank: data -> Plans -> model -> steps -> run folder.

Every rank computes the same Plans locally (they are deterministic functions of the dataset order,
seed and config: computed a step or two ahead by a background process, ``entrain.runtime.plan_prefetch``);
rank 0 writes ``config.json``, ``plan.json`` (at the end) and ``metrics.jsonl`` (with each
step's ``plan_hash``, epoch and sample ids) and shows the progress bar on stderr. Checkpoints
(``entrain.runtime.checkpoint``) are saved every ``checkpoint_every`` steps and at the end; with
``resume`` (or on a torchrun restart) the run continues from the newest complete one: the same Plans,
the model, AdamW and RNG states, and the step counter (which is the data position: see
``entrain.runtime.accounting``), so the continued run is bitwise the uninterrupted one. Shutdown
waits on every pending send, runs a barrier, then destroys the process group
(cpu-feasibility.md section 6.8).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from entrain.config import RunConfig, fingerprint_keys
from entrain.core.architectures import PRECISIONS
from entrain.core.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.parallel import check_stage_count
from entrain.core.plan import IterationPlan, Layout
from entrain.core.planning.bmin import below_b_min_warning
from entrain.core.presets import trainable_parts
from entrain.core.systems import get_system
from entrain.core.work import SampleWork
from entrain.runtime.accounting import (
    DataPosition,
    EpochStream,
    endless_position,
    plan_hash,
    split_validation,
)
from entrain.runtime.model_source import checkpoint_content
from entrain.runtime.planning import (
    JudgeFactory,
    MemoryCheck,
    fixed_stages,
    make_plan,
    plan_file,
    ranks_per_replica,
    run_setups,
)
from entrain.runtime.replan import step_monitor
from entrain.runtime.run_folder import METRICS, history, open_metrics, system_out, write_json

__all__ = [
    "SystemSummary",
    "RunData",
    "check_spec",
    "fingerprint",
    "load_data",
    "run_systems",
    "summary_line",
    "world_size_of",
]


@dataclass
class SystemSummary:
    system: str
    iter_ms: float
    stage_std_ms: float
    first_loss: float
    last_loss: float
    tokens_per_s: float
    out: str
    skipped: str | None = None
    """The run's skipped-records line (``RunData.skipped``), for the final summary."""
    replans: list[dict] = field(default_factory=list)
    """``--replan auto``: every re-plan of the run (``entrain.sim.drift.Replan.to_json``)."""


def check_spec(spec: RunConfig, world_size: int | None = None) -> None:
    """Refuse what the runtime cannot run, before any process group starts (the batch and range
    rules themselves are ``ParallelConfig``'s)."""
    par = spec.parallel
    if par.cp > 1:
        raise ConfigError(
            f"the runtime executes Plans with CP = 1; the encoder and llm have CP = {par.cp} "
            "(the planner and simulator cover it)"
        )
    from entrain.runtime.model_source import model_family, model_source
    from entrain.runtime.parallelize import check_tp

    family = model_family(spec)
    shape = family.shape(model_source(spec))
    check_tp(shape, par.tp, family)
    if spec.model.precision is not None and spec.model.precision not in PRECISIONS:
        raise ConfigError(f"--precision {spec.model.precision!r}: choose from {', '.join(PRECISIONS)}")
    _check_something_trains(spec.model.freeze)
    if par.fsdp and par.dp_or_1 < 2:
        raise ConfigError("--fsdp shards each stage over its data-parallel group: it needs --dp 2 or more")
    if par.fsdp and spec.schedule.split_weight_grads is True:
        raise ConfigError("--fsdp with --split-weight-grads on is not supported by the runtime; pick one")
    for comp, n in (("encoder", par.encoder_stages), ("llm", par.llm_stages)):
        if n is not None:
            check_stage_count(comp, n, family.layer_names(shape, comp), shape.name)
    need = world_size_of(spec)
    if world_size is not None and need is not None and need != world_size:
        raise ConfigError(_world_mismatch(spec, need, world_size))
    if world_size is not None and need is None:
        _check_planner_world(spec, world_size)


def _check_something_trains(freeze: Sequence[str]) -> None:
    if not trainable_parts(freeze):
        raise ConfigError(
            f"--freeze {','.join(freeze)} leaves no trainable parameter (the merger trains unless "
            "'encoder' is frozen, the LLM unless 'llm' is): nothing to learn; freeze fewer parts"
        )


def _check_planner_world(spec: RunConfig, world_size: int) -> None:
    """The planner needs whole replicas of at least 2 pipeline ranks (1 for DIP) on the processes,
    each pipeline rank being ``--tp`` processes."""
    dp, tp = spec.parallel.dp_or_1, spec.parallel.tp
    least = max(1 if get_system(s).colocated else 2 for s in spec.schedule.systems)
    per_replica = dp * tp
    if world_size % per_replica or world_size // per_replica < least:
        need = per_replica * max(least, -(-world_size // per_replica))
        if tp == 1:
            raise ConfigError(
                f"dp {dp} needs {need} processes, but {world_size} were started: start {need} processes "
                f"(--nproc {need}), or another multiple of {dp} with at least {least} pipeline ranks a replica"
            )
        raise ConfigError(
            f"--tp {tp} makes every pipeline rank {tp} processes: dp {dp} x {least} pipeline ranks x tp {tp} "
            f"needs {need} processes, but {world_size} were started: start {need} (--nproc {need}) or lower --tp"
        )


def _world_mismatch(spec: RunConfig, need: int, world_size: int) -> str:
    par = spec.parallel
    if spec.schedule.plan:
        return (
            f"the plan {spec.schedule.plan} runs on {need} processes, but {world_size} were started: "
            f"start {need} processes (--nproc {need})"
        )
    per = max(ranks_per_replica(spec, s) for s in spec.schedule.systems) * par.tp
    system = next(
        s for s in spec.schedule.systems if par.dp_or_1 * ranks_per_replica(spec, s) * par.tp == need
    )
    hint = (
        f"start {need} processes (--nproc {need})"
        if world_size % per
        else f"start {need} processes (--nproc {need}) or pass --dp {world_size // per}"
    )
    return (
        f"{system} with {par.encoder_stages} encoder + {par.llm_stages} LLM stages and dp {par.dp_or_1} needs "
        f"{need} processes, but {world_size} were started: {hint}"
    )


def world_size_of(spec: RunConfig) -> int | None:
    """Processes the run needs: the plan file's, or dp x ranks per replica x tp with the stage counts
    fixed by flags; None when the planner chooses the layout for the processes it is given."""
    if spec.schedule.plan:
        return plan_file(spec)[1].layout.world_size
    if not fixed_stages(spec):
        return None
    par = spec.parallel
    return max(par.dp_or_1 * ranks_per_replica(spec, s) * par.tp for s in spec.schedule.systems)


def resolve_precision(spec: RunConfig, device: torch.device) -> str:
    """``--precision``, or bf16 on CUDA and fp32 on CPU when not given. bf16 runs the forward and
    backward under ``torch.autocast`` (CPU and CUDA both support bf16 autocast); parameters,
    gradients and AdamW state stay fp32."""
    if spec.model.precision is not None:
        return spec.model.precision
    return "bf16" if device.type == "cuda" else "fp32"


@dataclass
class RunData:
    """The batches of a run: training steps, held-out validation batches, and where they come from."""

    train: list[list[SampleWork]]
    val: list[list[SampleWork]]
    stream: EpochStream | None = None
    """The epoch stream of a file dataset (None for a built-in generator: one endless epoch)."""
    records: list | None = None
    """A LLaVA / Parquet dataset's usable records (rendered from the real images and text)."""
    skipped: str | None = None
    """``skipped N of M records; see OUT/skipped.jsonl`` when ``--on-bad-sample skip`` left some out."""
    num_skipped: int = 0
    """Records left out by ``--on-bad-sample skip`` (TensorBoard's ``data/skipped_samples``)."""

    def identity(self) -> dict | None:
        """A file dataset's training pool: sample count and sha256 of the ids in file order (a resume
        refuses a dataset that changed since the checkpoint); None for a built-in generator."""
        if self.stream is None:
            return None
        import hashlib

        ids = "\x1f".join(w.id for w in self.stream.works)
        return {
            "train_samples": self.stream.epoch_size,
            "ids_sha256": hashlib.sha256(ids.encode()).hexdigest(),
        }

    def position(self, step: int, global_batch: int) -> DataPosition:
        if self.stream is None:
            return endless_position(step, global_batch)
        return self.stream.position(step, global_batch)


def _check_meta(spec: RunConfig, works: Sequence[SampleWork]) -> None:
    for w in works:
        if w.meta is None:
            raise ConfigError(
                f"{spec.data.dataset}: sample {w.id!r} has no token metadata (a raw-work file); "
                "training needs images and text token counts"
            )


def screen(spec: RunConfig, out_dir: str | None, tokenizer=None):
    """``entrain.data.check.screen_dataset`` of a LLaVA / Parquet ``--dataset`` with
    ``--on-bad-sample``: ``error`` raises the report, ``skip`` writes ``out_dir/skipped.jsonl``
    (``out_dir`` None: a scratch folder, for the ranks that do not own the run folder)."""
    import shutil
    import tempfile

    from entrain.data.check import screen_dataset

    scratch = tempfile.mkdtemp(prefix="entrain-screen-") if out_dir is None else None
    try:
        return screen_dataset(
            spec.data.dataset,
            on_bad=spec.data.on_bad_sample,
            out_dir=out_dir or scratch,
            image_root=spec.data.image_root,
            confine_images=spec.data.confine_images,
            tokenizer=tokenizer,
            vision=spec.data.vision(spec.model),
        )
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def load_data(spec: RunConfig, cost: CostModel, *, owner: bool = True, tokenizer=None) -> RunData:
    """Training and validation batches. A built-in generator: samples ``[i*B, (i+1)*B)`` for step
    ``i``, validation batches after the last step. A file: its last ``val_batches`` global batches
    are held out and the rest is an epoch stream (``entrain.runtime.accounting``). A LLaVA / Parquet
    file is screened first (``--on-bad-sample``); ``owner`` (rank 0) writes ``skipped.jsonl``."""
    from entrain.data.generators import is_builtin
    from entrain.data.workload_io import (
        detect_format,
        load_workload,
        read_raw_work_jsonl,
        read_workload_jsonl,
        resolve_dataset_file,
        sample_works,
    )

    num_val = spec.data.val_batches if spec.data.val_every > 0 else 0
    if is_builtin(spec.data.dataset):
        batches = list(
            load_workload(
                spec.data.dataset,
                cost,
                global_batch=spec.parallel.global_batch,
                iterations=spec.run.steps + num_val,
                seed=spec.data.seed,
                tp=spec.parallel.tp,
                image_root=spec.data.image_root,
                vision=spec.data.vision(spec.model),
            )
        )
        return RunData(batches[: spec.run.steps], batches[spec.run.steps :])
    path = resolve_dataset_file(spec.data.dataset)
    fmt = detect_format(path)
    records = skipped = None
    num_skipped = 0
    if fmt == "conversation":
        screened = screen(spec, spec.run.out if owner else None, tokenizer)
        works, records = sample_works(screened.samples, cost, tp=spec.parallel.tp), screened.records
        skipped = skipped_line(screened)
        if owner and skipped:
            print(f"entrain: {skipped}", file=sys.stderr, flush=True)
        num_skipped = screened.report.bad if skipped else 0
    elif fmt == "workload":
        works = sample_works(
            read_workload_jsonl(path, spec.data.vision(spec.model)), cost, tp=spec.parallel.tp
        )
    else:
        works = read_raw_work_jsonl(path)
    _check_meta(spec, works)
    train, val = split_validation(works, spec.parallel.global_batch, num_val)
    stream = EpochStream(tuple(train), spec.data.seed, spec.data.shuffle)
    return RunData(
        stream.batches(spec.parallel.global_batch, spec.run.steps), val, stream, records, skipped, num_skipped
    )


def skipped_line(screened) -> str | None:
    """``skipped N of M records; see PATH`` for a screening that left records out (None: none)."""
    report = screened.report
    if not report.bad or screened.skipped_path is None:
        return None
    return f"skipped {report.bad} of {report.records} records; see {screened.skipped_path}"


def record_source(spec: RunConfig, data: RunData, tokenizer=None):
    """The real samples (images and conversations) of a LLaVA / Parquet dataset; None for the built-in
    generators and workload files, whose samples are rendered from their metadata."""
    from entrain.runtime.data import RecordSource

    if data.records is None:
        return None
    return RecordSource(spec.data.dataset, spec.data.image_root, records=data.records, tokenizer=tokenizer)


FINGERPRINT_KEYS = fingerprint_keys()
"""What must match for ``--resume``: the config fields whose metadata says so (``entrain.config``; e.g.
``--steps`` may grow: the LR schedule then follows the new total)."""


def fingerprint(spec: RunConfig, system: str) -> dict:
    """The run's resume fingerprint, JSON-normalised (as stored in a checkpoint manifest)."""
    fp = {k: spec.flag_value(k) for k in FINGERPRINT_KEYS}
    for k in fingerprint_keys(when_set=True):
        if fp[k] is None or fp[k] is False:  # runs from before these flags stay resumable
            del fp[k]
    fp["dp"] = spec.parallel.dp_or_1
    fp["system"] = system
    fp.update(checkpoint_content(spec))  # the base checkpoint's content, not only its folder's name
    return json.loads(json.dumps(fp))


def stage_std_ms(records: Sequence[dict]) -> float:
    """Per (rank, stage) -- a stage of one replica --, the population std across microbatches of
    (forward + backward) ms summed over the microbatch's subs; mean over them."""
    per_stage: dict[tuple[int, int], dict[int, float]] = {}
    for r in records:
        mbs = per_stage.setdefault((r["rank"], r["stage"]), {})
        mbs[r["mb"]] = mbs.get(r["mb"], 0.0) + r["fwd_ms"] + r["bwd_ms"]
    stds = [statistics.pstdev(v.values()) for v in per_stage.values() if len(v) > 1]
    return statistics.fmean(stds) if stds else 0.0


def summary_line(s: SystemSummary) -> str:
    return (
        f"system={s.system} iter_ms={s.iter_ms:.1f} stage_std_ms={s.stage_std_ms:.1f} "
        f"loss={s.first_loss:.4f}->{s.last_loss:.4f}" + _replans_note(s.replans)
    )


def _replans_note(replans: Sequence[dict]) -> str:
    """`` replans=N (after step S: E.PP a / L.PP b -> E.PP c / L.PP d; ...)``; empty without re-plans."""
    if not replans:
        return ""

    def split(a: dict) -> str:
        return f"E.PP {a['encoder']['pp']} / L.PP {a['llm']['pp']}"

    each = [
        f"after step {r['iteration']}: {split(r['old_allocation'])} -> {split(r['new_allocation'])}"
        for r in replans
    ]
    return f" replans={len(replans)} ({'; '.join(each)})"


_PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "A40": 149.7e12, "L40S": 362e12, "A10": 125e12}


def _peak_flops(device: torch.device) -> float | None:
    env = os.environ.get("ENTRAIN_PEAK_TFLOPS")
    if env:
        return float(env) * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in _PEAK_FLOPS.items() if k in name), None)


def _model_flops(model, plan_it, renderer) -> float:
    """6 * params * tokens per component (dense estimate, attention excluded)."""
    from entrain.models.families.registry import build_stage, family_of

    def params(component: str) -> int:
        end = len(family_of(model).layer_names(renderer.cfg.shape, component))
        return sum(p.numel() for _, p in build_stage(model, component, 0, end).owned_parameters())

    vis, llm = params("encoder"), params("llm")
    ids = [s for rep in plan_it.microbatches for mb in rep for s in mb.llm_ids]
    patches = sum(t * h * w for s in ids for t, h, w in renderer.sample(s).grid_thw)
    tokens = sum(renderer.sample(s).num_tokens for s in ids)
    return 6.0 * (vis * patches + llm * tokens)


def run_systems(
    spec: RunConfig,
    env,
    memory_check: MemoryCheck | None = None,
    judge_factory: JudgeFactory | None = None,
    monitor_factory=None,
) -> list[SystemSummary]:
    """Train each of ``spec.schedule.systems`` in turn (fresh model each) on an initialised process group;
    ``memory_check``, ``judge_factory``: see ``entrain.runtime.planning.run_setups``; ``monitor_factory``:
    ``--replan auto``'s drift monitor (``entrain.runtime.replan``)."""
    from entrain.runtime.health import PeerWatch
    from entrain.runtime.model_source import model_config

    check_spec(spec, env.world_size)
    cost = spec.model.cost_model()
    if env.rank == 0:
        os.makedirs(spec.run.out, exist_ok=True)
    model_cfg, tokenizer = model_config(spec)
    data = load_data(spec, cost, owner=env.rank == 0, tokenizer=tokenizer)
    setups = run_setups(
        spec, cost, data.train, env.world_size // spec.parallel.tp, memory_check, judge_factory
    )
    for system, setup in setups.items():
        if setup.layout.world_size * spec.parallel.tp != env.world_size:
            need = setup.layout.world_size * spec.parallel.tp
            raise ConfigError(
                f"{system}: the planned layout ({setup.source}) runs on {need} processes, but "
                f"{env.world_size} were started; start {need} (--nproc) or fix the stages "
                "with --encoder-stages / --llm-stages"
            )
        _warn_below_b_min(spec, setup, env)
    watch = PeerWatch(env.rank, env.world_size, spec.run.timeout_s)  # one sequence of points for all systems
    if env.world_size > 1:  # checkpoints need one run folder that every node sees
        from entrain.runtime.checkpoint import check_shared_folder

        check_shared_folder(spec.run.out, env.rank, _agree(env, watch, "run folder: shared by every rank"))
    return [
        _run_one(
            spec,
            s,
            setups[s],
            cost,
            data,
            env,
            system_out(spec, s),
            watch,
            model_cfg,
            tokenizer,
            monitor_factory,
        )
        for s in setups
    ]


def _warn_below_b_min(spec: RunConfig, setup, env) -> None:
    """Rank 0 warns when the per-replica batch is below the planner's ``b_min`` (Algorithm 1)."""
    warning = below_b_min_warning(spec.parallel.global_batch, setup.layout.dp, setup.b_min)
    if env.rank == 0 and warning:
        print(warning, file=sys.stderr, flush=True)


def _agree(env, watch, what: str):
    """All-gather of one picklable value per rank (rank order), after every rank reached ``what``
    (a peer that does not get there is named)."""
    import torch.distributed as dist

    def gather(value):
        watch.gather_point(what)
        out = [None] * env.world_size
        _guarded(watch, 0, what, lambda: dist.all_gather_object(out, value))
        return out

    return gather


def _guarded(watch, step: int, what: str, fn):
    """Run collective ``fn`` at point ``what``; a failure names the peers that never got there."""
    from entrain.runtime.executor import CollectiveError

    watch.mark(what)
    try:
        return fn()
    except Exception as e:
        raise CollectiveError(watch.rank, step, what, e, watch.behind()) from e


def _say(env):
    def say(msg: str) -> None:
        if env.rank == 0:
            print(msg, file=sys.stderr, flush=True)

    return say


def _restarted() -> bool:
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0")


def _start_state(spec: RunConfig, system: str, env, out: str, data: RunData, watch):
    """The checkpoint to continue from (None: a fresh start). Resuming (``--resume`` or a torchrun
    restart) refuses a checkpoint of another configuration (the layout may differ: it is resharded);
    a fresh start clears stale checkpoints."""
    import shutil

    from entrain.runtime import checkpoint as ck

    # one decision for all ranks: agents may restart their workers with different restart counts
    if not any(
        _agree(env, watch, "checkpoint load: agree on resuming")(bool(spec.run.resume or _restarted()))
    ):
        stale = os.path.join(out, ck.CHECKPOINT_DIR)
        if env.rank == 0 and os.path.isdir(stale):
            _say(env)(f"entrain: a fresh run (no --resume): removing the old checkpoints in {stale}")
            shutil.rmtree(stale, ignore_errors=True)
        if env.rank == 0:  # and the old run's records: nothing of it is continued (--overwrite)
            _remove_old_records(out)
        return None
    ck.check_resumable(out, fingerprint(spec, system))
    agree = _agree(env, watch, "checkpoint load: verify the files")
    found = ck.select_checkpoint(out, rank=env.rank, agree=agree, say=_say(env), world_size=env.world_size)
    if found is None:
        _say(env)(f"entrain: no complete checkpoint in {out}; starting from step 0")
        return None
    saved = found.manifest.get("data")
    if saved != data.identity():
        raise ConfigError(
            f"--resume: the dataset {spec.data.dataset} changed since the checkpoint {found.folder} was written "
            f"(training samples and ids: {saved} then, {data.identity()} now); restore it or train into a new --out"
        )
    if found.step > spec.run.steps:
        raise ConfigError(
            f"--resume: the newest checkpoint in {out} is at step {found.step}, past --steps {spec.run.steps}; "
            f"pass --steps {found.step} or more"
        )
    _say(env)(f"entrain: resuming {system} from {found.folder} (step {found.step} of {spec.run.steps})")
    return found


def _remove_old_records(out: str) -> None:
    """A fresh start's folder: no record of an earlier run (its config, metrics, plan, re-plans) is left
    to mark it as holding a run before this one trained a step, or to be resumed from later."""
    import shutil

    from entrain.runtime.replan import REPLAN_DIR

    for name in ("config.json", METRICS, "plan.json"):
        if os.path.exists(path := os.path.join(out, name)):
            os.remove(path)
    shutil.rmtree(os.path.join(out, REPLAN_DIR), ignore_errors=True)


def _load_checkpoint(trainer, found, watch, fault) -> None:
    """Every rank reads its stages' tensors (resharded) and its RNG states."""
    from entrain.runtime import checkpoint as ck

    what = f"checkpoint load of step {found.step}: model and optimizer state"
    watch.gather_point(f"checkpoint load of step {found.step}: start")
    if fault is not None:
        fault.maybe_fire(watch.rank, found.step, "load")
    trainer.load_checkpoint(
        found.folder,
        found.step,
        load=lambda folder, state: _guarded(watch, found.step, what, lambda: ck.load_state(folder, state)),
    )
    ck.set_rng_state(found.rank_state["rng"])
    watch.gather_point(f"checkpoint load of step {found.step}: done")


def _save_checkpoint(
    spec: RunConfig, system: str, layout: Layout, env, out: str, trainer, data, step: int, fault=None
):
    """Every rank writes its rank state and (collectively) its tensors, then hashes the files it wrote;
    rank 0 merges the hashes into the manifest (written last) and prunes old checkpoints. A peer that dies or stalls in any phase fails the
    others within ``--timeout-s``, naming it and the phase."""
    from entrain.runtime import checkpoint as ck

    watch = trainer.watch
    folder = ck.step_dir(out, step)
    if env.rank == 0 and (folder / ck.MANIFEST).exists():  # the same step again (after a restart)
        (folder / ck.MANIFEST).unlink()
    phase = f"checkpoint save of step {step}"
    watch.gather_point(f"{phase}: start")
    if fault is not None:
        fault.maybe_fire(env.rank, step, "save")
    position = data.position(step, spec.parallel.global_batch).to_json()
    ck.write_rank_state(folder, env.rank, {"step": step, "rng": ck.rng_state(), "data_position": position})
    _guarded(
        watch,
        step,
        f"{phase}: model and optimizer state",
        lambda: ck.save_state(folder, trainer.checkpoint_state()),
    )
    # every rank hashes its own files at once; rank 0 merges the small results
    hashes = _agree(env, watch, f"{phase}: file hashes")(
        ck.own_file_entries(folder, env.rank, env.world_size)
    )
    if env.rank == 0:
        ck.write_manifest(
            folder,
            {
                "format": ck.FORMAT_VERSION,
                "step": step,
                "system": system,
                "model": spec.model.label(),
                "family": spec.model.family().name,
                "model_source": _model_source_json(spec),
                "world_size": env.world_size,
                "layout": layout.to_json(),
                "fingerprint": fingerprint(spec, system),
                "data_position": position,
                "data": data.identity(),
                "files": {name: entry for part in hashes for name, entry in part.items()},
            },
        )
        ck.prune(out, spec.run.keep_checkpoints)
    watch.gather_point(f"{phase}: manifest written")


def _pixel_ids(layout, rank: int, it: IterationPlan) -> list[str]:
    """Samples whose pixels ``rank`` processes in ``it``: its replica's encoder samples, in order,
    when it holds the first encoder stage; none otherwise (LLM-only ranks need ids only)."""
    replica, pp_rank = layout.replica_of(rank)
    if not layout.stages or layout.stages[0].component != "encoder" or layout.stages[0].pp_rank != pp_rank:
        return []
    return [s for mb in it.microbatches[replica] for s in mb.encoder_ids]


def _model_source_json(spec: RunConfig) -> dict | None:
    """A checkpoint model's folders (``entrain export`` rebuilds its configs from them); None for a preset."""
    source = spec.model.source()
    if not source.is_stock:
        return None
    out = {"vision_model": source.vision_model, "llm_model": source.llm_model, "tokenizer": source.tokenizer}
    return out if source.model_path is None else {**out, "model_path": source.model_path}


def _step_plans(spec: RunConfig, system: str, layout: Layout, batches, cost: CostModel, options):
    """Each training step's Plan, computed ahead by a background process while earlier steps train
    (``entrain.runtime.plan_prefetch``; ``ENTRAIN_PLAN_PREFETCH=thread`` or ``0``: a thread, in line)."""
    from entrain.runtime.plan_prefetch import StepPlanner, StepPlans, prefetch_mode

    planner = StepPlanner(system, layout, cost, options, list(batches[0]))
    return StepPlans(planner, batches[: spec.run.steps], mode=prefetch_mode())


def _gather_events(env, events: list[dict]) -> list[dict]:
    """Every rank's trace events of one step, on rank 0 (empty elsewhere)."""
    import torch.distributed as dist

    gathered = [None] * env.world_size if env.rank == 0 else None
    dist.gather_object(events, gathered, dst=0)
    return [e for part in gathered for e in part] if env.rank == 0 else []


def _own_stages(layout: Layout, rank: int) -> list[tuple[str, int, int]]:
    _, pp_rank = layout.replica_of(rank)
    return [(s.component, s.first_layer, s.end_layer) for s in layout.stages_of(pp_rank)]


def _run_one(
    spec: RunConfig,
    system: str,
    setup,
    cost: CostModel,
    data: RunData,
    env,
    out: str,
    watch,
    cfg=None,
    tokenizer=None,
    monitor_factory=None,
) -> SystemSummary:
    """Train ``system`` on this rank: its Plans, the run folder, the model (restored from a checkpoint
    when resuming), the step loop, then the summary."""
    layout, options = setup.layout, setup.options
    plans = _step_plans(spec, system, layout, data.train, cost, options)
    val_plan = make_plan(system, layout, data.val, cost, options) if data.val else None
    rank0 = env.rank == 0
    if rank0:
        os.makedirs(out, exist_ok=True)
    ckpt = _start_state(spec, system, env, out, data, watch)
    start = ckpt.step if ckpt is not None else 0
    plans.backfill(start)
    kept = history(os.path.join(out, METRICS), start) if rank0 else []
    run = _build_run(spec, system, layout, data, env, out, watch, cfg, tokenizer)
    run.plans, run.val_plan, run.setup = plans, val_plan, setup
    run.open_trace(start)
    run.fault = _restore(run.trainer, ckpt, watch)
    run.open_progress(start, kept)
    run.drift = step_monitor(monitor_factory, spec, system, setup, cost, data.train, out, start)
    ok = False
    try:
        replanned = run.train_steps(start)
        if rank0:  # every step's Plan (a resumed run's earlier ones were planned in the background)
            write_json(os.path.join(out, "plan.json"), plans.whole().to_json())
        ok = True
    finally:
        run.close(ok)
    if replanned is not None:
        raise replanned
    return run.series.summary(system, out, data, run.drift)


def _write_config(spec: RunConfig, system: str, setup, env, out: str, start: int) -> None:
    """Rank 0's ``config.json``: the run's configuration, where it runs and the step it starts at."""
    config = {
        "spec": spec.to_json(),
        "setup": setup.source,
        "flags": spec.run.flags,
        "system": system,
        "world_size": env.world_size,
        "device": str(env.device),
        "backend": env.backend,
        "layout": setup.layout.to_json(),
        "torch": torch.__version__,
        "resumed_from_step": start,
        "fingerprint": fingerprint(spec, system),
        "precision": resolve_precision(spec, env.device),
    }
    write_json(os.path.join(out, "config.json"), config)


def _build_model(spec: RunConfig, layout: Layout, env, cfg):
    """This rank's stages of the model (``--weights`` or a seeded init), with ``--freeze`` applied."""
    from entrain.models.families.registry import family_of

    family = family_of(cfg)
    model = family.build_model(
        cfg,
        seed=spec.data.seed,
        weights_dir=spec.model.weights,
        stages=_own_stages(layout, env.rank // spec.parallel.tp),
    )
    model.entrain_family = family.name
    parts = trainable_parts(spec.model.freeze)
    family.set_trainable(model, encoder="vit" in parts, merger="merger" in parts, llm="llm" in parts)
    return model


def _build_run(
    spec: RunConfig, system: str, layout: Layout, data: RunData, env, out: str, watch, cfg, tokenizer
):
    """The model, its sample renderer and the pipeline trainer of this rank (``cfg`` None: the
    run's model config and tokenizer, ``model_source.model_config``)."""
    from entrain.runtime.data import SampleRenderer
    from entrain.runtime.model_source import model_config
    from entrain.runtime.parallelize import StageParallelism
    from entrain.runtime.trainer import PipelineTrainer

    if cfg is None:
        cfg, tokenizer = model_config(spec)
    model = _build_model(spec, layout, env, cfg)
    metas = {w.id: w.meta for batch in data.train + data.val for w in batch}
    renderer = SampleRenderer(
        cfg, metas, seed=spec.data.seed, device=env.device, source=record_source(spec, data, tokenizer)
    )
    autocast = torch.bfloat16 if resolve_precision(spec, env.device) == "bf16" else None
    trainer = PipelineTrainer(
        layout=layout,
        model=model,
        env=env,
        renderer=renderer,
        optim=spec.optim,
        autocast_dtype=autocast,
        timeout_s=spec.run.timeout_s,
        watch=watch,
        parallel=StageParallelism(tp=spec.parallel.tp, fsdp=spec.parallel.fsdp),
    )
    return _SystemRun(spec, system, layout, data, env, out, model, renderer, trainer)


def _restore(trainer, ckpt, watch):
    """Load the checkpoint to continue from (if any) and arm the test fault of ``$ENTRAIN_FAULT``
    (``entrain.runtime.faults``), which the caller also hands to the checkpoint saves."""
    from entrain.runtime.faults import fault_from_env

    fault = fault_from_env(resumed=ckpt is not None)
    if ckpt is not None:
        _load_checkpoint(trainer, ckpt, watch, fault)
    if fault is not None:
        trainer.fault_hook = fault.maybe_fire
    return fault


@dataclass
class _Series:
    """The per-step numbers the summary is made of (a resumed run's earlier steps included)."""

    losses: list[float]
    times: list[float]
    tps: list[float]
    stds: list[float]

    @classmethod
    def of(cls, rows: Sequence[dict]) -> _Series:
        return cls(
            [r["loss"] for r in rows],
            [r["iteration_time_ms"] for r in rows],
            [r["tokens_per_s"] for r in rows],
            [stage_std_ms(r["stage_times"]) for r in rows],
        )

    def summary(self, system: str, out: str, data: RunData, drift) -> SystemSummary:
        """Medians over the steps after the first (a warm-up), or over the one step there is."""
        nan = float("nan")
        times, stds, tps = self.times, self.stds, self.tps
        warm = slice(1, None) if len(times) > 1 else slice(None)
        return SystemSummary(
            system=system,
            iter_ms=statistics.median(times[warm]) if times else nan,
            stage_std_ms=statistics.median(stds[warm]) if stds else 0.0,
            first_loss=self.losses[0] if self.losses else nan,
            last_loss=self.losses[-1] if self.losses else nan,
            tokens_per_s=statistics.median(tps[warm]) if tps else nan,
            out=out,
            skipped=data.skipped,
            replans=drift.replans() if drift is not None else [],
        )


@dataclass
class _SystemRun:
    """One system's training on this rank: the trainer, the step Plans, and the records rank 0 writes
    (metrics rows, TensorBoard scalars, the trace, the progress bar)."""

    spec: RunConfig
    system: str
    layout: Layout
    data: RunData
    env: object
    out: str
    model: object
    renderer: object
    trainer: object
    plans: object = None
    val_plan: object = None
    setup: object = None
    start: int = 0
    kept: list = field(default_factory=list)
    drift: object = None
    fault: object = None
    tracer: object = None
    trace_events: list = field(default_factory=list)
    scalars: object = None
    bar: object = None
    metrics: object = None
    series: _Series = field(default_factory=lambda: _Series([], [], [], []))

    @property
    def rank0(self) -> bool:
        return self.env.rank == 0

    def open_trace(self, start: int) -> None:
        """``--trace``'s action tracer (a resumed run keeps the earlier steps' events) and
        ``--tensorboard``'s scalar log (rank 0; later steps purged)."""
        if self.spec.run.trace:
            from entrain.runtime.trace import ActionTracer, read_trace

            self.tracer = self.trainer.executor.tracer = ActionTracer(self.env.rank)
            trace_path = os.path.join(self.out, "trace.json")
            if self.rank0 and start > 0 and os.path.exists(trace_path):
                self.trace_events = [e for e in read_trace(trace_path) if e["args"]["step"] < start]
        if self.spec.run.tensorboard and self.rank0:
            from entrain.runtime.tensorboard import ScalarLog

            self.scalars = ScalarLog(self.out, purge_step=start)

    def open_progress(self, start: int, kept: list[dict]) -> None:
        """The progress bar (rank 0) and the series continued from ``kept``; ``metrics.jsonl`` and
        ``config.json`` wait for the first step (``open_records``)."""
        if self.rank0 and self.spec.run.progress:
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.spec.run.steps,
                initial=start,
                desc=self.system,
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.5,
            )
        self.series = _Series.of(kept)
        self.start, self.kept = start, kept

    def open_records(self) -> None:
        """Rank 0, once the run's first step trained: ``config.json`` and ``metrics.jsonl`` (the ``kept``
        rows first), what makes the folder hold a run (``run_folder.RUN_MARKERS``): a start that fails
        before (a missing shard, a truncated weights file, a layout the system cannot run) leaves none,
        and the same command is accepted again once its input is fixed."""
        _write_config(self.spec, self.system, self.setup, self.env, self.out, self.start)
        self.metrics = open_metrics(os.path.join(self.out, METRICS), self.kept)

    def train_steps(self, start: int):
        """Steps ``start`` to ``--steps``, each with the next step's pixels processed while it runs;
        returns the ``ReplanRequested`` to raise after a re-plan's checkpoint (None: all steps ran)."""
        spec, plans = self.spec, self.plans
        plan_rank = self.trainer.place.plan_rank
        peak = _peak_flops(self.env.device)
        if start < spec.run.steps:
            self.renderer.prefetch(_pixel_ids(self.layout, plan_rank, plans.get(start)))
        for step in range(start, spec.run.steps):
            it = plans.get(step)
            if step + 1 < spec.run.steps:  # the next step's pixels are processed while this one runs
                self.renderer.prefetch(_pixel_ids(self.layout, plan_rank, plans.get(step + 1)))
            assignment_wait_ms = plans.take_wait_ms()
            if self.tracer is not None:
                self.tracer.step = step
            res = self.trainer.train_step(it)
            row = self.step_row(step, it, res, assignment_wait_ms, peak)
            self.record(step, row, res)
            done = step + 1
            if (
                done == spec.run.steps
                or "replan" in row
                or (spec.run.checkpoint_every > 0 and done % spec.run.checkpoint_every == 0)
            ):
                _save_checkpoint(
                    spec,
                    self.system,
                    self.layout,
                    self.env,
                    self.out,
                    self.trainer,
                    self.data,
                    done,
                    self.fault,
                )
            if "replan" in row and done < spec.run.steps:  # continue on the new layout (runtime.replan)
                return self.drift.hand_over(step, owner=self.rank0)
            self.show(res)
        return None

    def step_row(
        self, step: int, it: IterationPlan, res, assignment_wait_ms: float, peak: float | None
    ) -> dict:
        """The step's ``metrics.jsonl`` row: the step's result, its Plan and samples, MFU (on a known
        GPU), the validation loss when due and the drift monitor's re-plan when it decided one."""
        spec, data = self.spec, self.data
        row = {
            "step": step,
            "loss": res.loss,
            "iteration_time_ms": res.iteration_time_ms,
            "tokens_per_s": res.tokens_per_s,
            "lr": res.lr,
            "grad_norm": res.grad_norm,
            "cpu_ms": res.cpu_ms,
            "assignment_wait_ms": assignment_wait_ms,
            "plan_hash": plan_hash(it),
            "epoch": data.position(step, spec.parallel.global_batch).epoch,
            "sample_ids": [w.id for w in data.train[step]],
            "stage_times": res.records,
            "memory_per_rank": res.memory,
        }
        if peak:
            flops = _model_flops(self.model, it, self.renderer)
            row["mfu"] = flops / (res.iteration_time_ms / 1e3) / (peak * self.env.world_size)
        if self.val_plan is not None and (step + 1) % spec.data.val_every == 0:
            row["val_loss"] = statistics.fmean(self.trainer.evaluate(v) for v in self.val_plan.iterations)
        if self.drift is not None and (record := self.drift.observe(step, data.train[step])) is not None:
            row["replan"] = record
        return row

    def record(self, step: int, row: dict, res) -> None:
        """The step into the series, the trace, ``metrics.jsonl`` and TensorBoard."""
        series = self.series
        series.losses.append(res.loss)
        series.times.append(res.iteration_time_ms)
        series.tps.append(res.tokens_per_s)
        if self.tracer is not None:
            self.trace_events += _gather_events(self.env, self.tracer.drain())
        if self.rank0:
            series.stds.append(stage_std_ms(res.records))
            if self.metrics is None:
                self.open_records()
            self.metrics.write(json.dumps(row) + "\n")
            self.metrics.flush()
        if self.scalars is not None:
            self.scalars.write(
                step, {**row, "stage_std_ms": series.stds[-1], "skipped_samples": self.data.num_skipped}
            )

    def show(self, res) -> None:
        if self.bar is not None:
            self.bar.set_postfix(
                loss=f"{res.loss:.3f}",
                iter_ms=f"{res.iteration_time_ms:.0f}",
                tok_s=f"{res.tokens_per_s:.0f}",
            )
            self.bar.update(1)

    def close(self, ok: bool) -> None:
        """Stop the planner and the renderer, close the records (rank 0 writes the trace), and, after a
        clean run only, the trainer: after a failure the pending sends may never complete."""
        self.plans.close()
        self.renderer.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.scalars is not None:
            self.scalars.close()
        if self.tracer is not None and self.rank0 and self.trace_events:
            from entrain.runtime.trace import write_trace

            write_trace(os.path.join(self.out, "trace.json"), self.trace_events)
        if self.bar is not None:
            self.bar.close()
        if ok:
            self.trainer.close()
