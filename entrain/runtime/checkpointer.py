"""One system's checkpoints on this rank: where a run starts (``--resume`` or a torchrun restart: the
newest complete checkpoint of the same configuration, its fingerprint and dataset checked; a fresh start
clears stale ones), the restore of the model, AdamW and RNG states, and the saves every
``checkpoint_every`` steps and at the end. The files themselves are ``entrain.runtime.checkpoint``'s;
every rank agrees on each decision (``agree``) and a collective that fails names the peers that never
reached it (``guarded``)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from entrain.config import RunConfig, fingerprint_keys
from entrain.core.errors import ConfigError
from entrain.core.ir.plan import Layout
from entrain.runtime.model_source import checkpoint_content
from entrain.runtime.run_data import RunData
from entrain.runtime.run_folder import METRICS

if TYPE_CHECKING:
    from entrain.runtime.checkpoint import Checkpoint
    from entrain.runtime.distributed import DistEnv
    from entrain.runtime.faults import Fault
    from entrain.runtime.health import PeerWatch
    from entrain.runtime.trainer import PipelineTrainer

__all__ = ["FINGERPRINT_KEYS", "Checkpointer", "agree", "fingerprint", "guarded"]

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


def agree(env, watch, what: str):
    """All-gather of one picklable value per rank (rank order), after every rank reached ``what``
    (a peer that does not get there is named)."""
    import torch.distributed as dist

    def gather(value):
        watch.gather_point(what)
        out = [None] * env.world_size
        guarded(watch, 0, what, lambda: dist.all_gather_object(out, value))
        return out

    return gather


def guarded(watch, step: int, what: str, fn):
    """Run collective ``fn`` at point ``what``; a failure names the peers that never got there."""
    from entrain.runtime.step_errors import CollectiveError

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


def _remove_old_records(out: str) -> None:
    """A fresh start's folder: no record of an earlier run (its config, metrics, plan, re-plans) is left
    to mark it as holding a run before this one trained a step, or to be resumed from later."""
    import shutil

    from entrain.runtime.replan import REPLAN_DIR

    for name in ("config.json", METRICS, "plan.json"):
        if os.path.exists(path := os.path.join(out, name)):
            os.remove(path)
    shutil.rmtree(os.path.join(out, REPLAN_DIR), ignore_errors=True)


def _model_source_json(spec: RunConfig) -> dict | None:
    """A checkpoint model's folders (``entrain export`` rebuilds its configs from them); None for a preset."""
    source = spec.model.source()
    if not source.is_stock:
        return None
    out = {"vision_model": source.vision_model, "llm_model": source.llm_model, "tokenizer": source.tokenizer}
    return out if source.model_path is None else {**out, "model_path": source.model_path}


@dataclass
class Checkpointer:
    """The checkpoints of ``system`` in its run folder ``out``, as this rank sees them."""

    spec: RunConfig
    system: str
    layout: Layout
    env: DistEnv
    out: str
    data: RunData
    watch: PeerWatch
    fault: Fault | None = None
    """The test fault of ``$ENTRAIN_FAULT`` (``entrain.runtime.faults``), armed by ``restore``."""

    def start_state(self) -> Checkpoint | None:
        """The checkpoint to continue from (None: a fresh start). Resuming (``--resume`` or a torchrun
        restart) refuses a checkpoint of another configuration (the layout may differ: it is resharded);
        a fresh start clears stale checkpoints."""
        import shutil

        from entrain.runtime import checkpoint as ck

        spec, system, env, out, data, watch = (
            self.spec,
            self.system,
            self.env,
            self.out,
            self.data,
            self.watch,
        )
        # one decision for all ranks: agents may restart their workers with different restart counts
        if not any(
            agree(env, watch, "checkpoint load: agree on resuming")(bool(spec.run.resume or _restarted()))
        ):
            stale = os.path.join(out, ck.CHECKPOINT_DIR)
            if env.rank == 0 and os.path.isdir(stale):
                _say(env)(f"entrain: a fresh run (no --resume): removing the old checkpoints in {stale}")
                shutil.rmtree(stale, ignore_errors=True)
            if env.rank == 0:  # and the old run's records: nothing of it is continued (--overwrite)
                _remove_old_records(out)
            return None
        ck.check_resumable(out, fingerprint(spec, system))
        verify = agree(env, watch, "checkpoint load: verify the files")
        found = ck.select_checkpoint(
            out, rank=env.rank, agree=verify, say=_say(env), world_size=env.world_size
        )
        if found is None:
            _say(env)(f"entrain: no complete checkpoint in {out}; starting from step 0")
            return None
        saved = found.manifest.get("data")
        if saved != data.identity():
            raise ConfigError(
                f"--resume: the dataset {spec.data.dataset} changed since the checkpoint {found.folder} was "
                f"written (training samples and ids: {saved} then, {data.identity()} now); restore it or "
                "train into a new --out"
            )
        if found.step > spec.run.steps:
            raise ConfigError(
                f"--resume: the newest checkpoint in {out} is at step {found.step}, past --steps "
                f"{spec.run.steps}; pass --steps {found.step} or more"
            )
        _say(env)(f"entrain: resuming {system} from {found.folder} (step {found.step} of {spec.run.steps})")
        return found

    def restore(self, trainer: PipelineTrainer, found: Checkpoint | None) -> None:
        """Load the checkpoint to continue from (if any) and arm the test fault of ``$ENTRAIN_FAULT``
        (``entrain.runtime.faults``), which the checkpoint saves also fire."""
        from entrain.runtime.faults import fault_from_env

        self.fault = fault_from_env(resumed=found is not None)
        if found is not None:
            self._load(trainer, found)
        if self.fault is not None:
            trainer.fault_hook = self.fault.maybe_fire

    def _load(self, trainer: PipelineTrainer, found: Checkpoint) -> None:
        """Every rank reads its stages' tensors (resharded) and its RNG states."""
        from entrain.runtime import checkpoint as ck

        watch, fault = self.watch, self.fault
        what = f"checkpoint load of step {found.step}: model and optimizer state"
        watch.gather_point(f"checkpoint load of step {found.step}: start")
        if fault is not None:
            fault.maybe_fire(watch.rank, found.step, "load")
        trainer.load_checkpoint(
            found.folder,
            found.step,
            load=lambda folder, state: guarded(watch, found.step, what, lambda: ck.load_state(folder, state)),
        )
        ck.set_rng_state(found.rank_state["rng"])
        watch.gather_point(f"checkpoint load of step {found.step}: done")

    def save(self, trainer: PipelineTrainer, step: int) -> None:
        """Every rank writes its rank state and (collectively) its tensors, then hashes the files it wrote;
        rank 0 merges the hashes into the manifest (written last) and prunes old checkpoints. A peer that
        dies or stalls in any phase fails the others within ``--timeout-s``, naming it and the phase."""
        from entrain.runtime import checkpoint as ck

        spec, env, out, data, fault = self.spec, self.env, self.out, self.data, self.fault
        watch = trainer.watch
        folder = ck.step_dir(out, step)
        if env.rank == 0 and (folder / ck.MANIFEST).exists():  # the same step again (after a restart)
            (folder / ck.MANIFEST).unlink()
        phase = f"checkpoint save of step {step}"
        watch.gather_point(f"{phase}: start")
        if fault is not None:
            fault.maybe_fire(env.rank, step, "save")
        position = data.position(step, spec.parallel.global_batch).to_json()
        ck.write_rank_state(
            folder, env.rank, {"step": step, "rng": ck.rng_state(), "data_position": position}
        )
        guarded(
            watch,
            step,
            f"{phase}: model and optimizer state",
            lambda: ck.save_state(folder, trainer.checkpoint_state()),
        )
        # every rank hashes its own files at once; rank 0 merges the small results
        hashes = agree(env, watch, f"{phase}: file hashes")(
            ck.own_file_entries(folder, env.rank, env.world_size)
        )
        if env.rank == 0:
            ck.write_manifest(folder, self._manifest(step, position, hashes))
            ck.prune(out, spec.run.keep_checkpoints)
        watch.gather_point(f"{phase}: manifest written")

    def _manifest(self, step: int, position: dict, hashes: list[dict]) -> dict:
        from entrain.runtime import checkpoint as ck

        spec, system = self.spec, self.system
        return {
            "format": ck.FORMAT_VERSION,
            "step": step,
            "system": system,
            "model": spec.model.label(),
            "family": spec.model.family().name,
            "model_source": _model_source_json(spec),
            "world_size": self.env.world_size,
            "layout": self.layout.to_json(),
            "fingerprint": fingerprint(spec, system),
            "data_position": position,
            "data": self.data.identity(),
            "files": {name: entry for part in hashes for name, entry in part.items()},
        }
