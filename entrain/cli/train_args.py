"""``entrain train``'s parsed flags turned into the run's ``RunConfig`` (``--demo``, ``--plan``, ``--dp``
inferred from the process count), and spelled out again for the worker processes torchrun starts."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from entrain.cli.common import apply_paper_entrain
from entrain.cli.plan_flags import apply_plan
from entrain.config import RunConfig
from entrain.core.errors import ConfigError
from entrain.core.systems import SYSTEMS, parse_systems
from entrain.runtime.launcher import launched_worker

DEMO = {
    "model": "tiny",
    "dataset": "skewed",
    "system": "entrain,1f1b",
    "encoder_stages": 1,
    "llm_stages": 1,
    "nproc": 2,
    "global_batch": 16,
    "microbatch_size": 1,
    "steps": 8,
    "lr": 3e-3,
    "out": "runs/demo",
}

DEFAULTS: dict = {}
"""Every train flag's default (filled by ``entrain.cli.train.add_parser``)."""
ACTIONS: list[argparse.Action] = []
"""The train parser's optional flags (filled by ``entrain.cli.train.add_parser``)."""


def spec_of(args: argparse.Namespace) -> RunConfig:
    """The run's configuration from the flags; with ``--plan``, the plan file's system, batch sizes and
    layout replace the flags'."""
    apply_paper_entrain(args)
    _tensorboard(args.tensorboard)
    if args.plan:
        worker = os.environ.get("RANK", "0") != "0" or launched_worker()
        apply_plan(args, DEFAULTS, ACTIONS, quiet=worker)
    whole = "--fsdp" if args.fsdp else "--ep" if (getattr(args, "ep", None) or 1) > 1 else None
    if whole and args.split_weight_grads != "off":  # the runtime does not split FSDP / EP backwards
        explicit = args.split_weight_grads == "on"
        if explicit and os.environ.get("RANK", "0") == "0" and not launched_worker():  # once, by the launcher
            print(
                f"entrain train: note: {whole} runs whole backwards (--split-weight-grads off)",
                file=sys.stderr,
            )
        args.split_weight_grads = "off"
    flags = run_flags(args)
    spec = RunConfig.from_args(args)  # no flag is read from args after this line (the config has them all)
    if spec.schedule.plan:
        spec = _with_plan_layout(spec)
        flags = {**flags, **_plan_flags(spec)}
    else:
        spec = _on_last_layout(spec)
    return replace(spec, run=replace(spec.run, flags=flags))


def _on_last_layout(spec: RunConfig) -> RunConfig:
    """``--resume`` of a run that re-planned (``--replan auto``): the layout it was last on, the newest
    re-plan's plan file at or before its newest checkpoint (``replan.last_plan``), as ``--plan`` would
    give it; every process of the run reads the same folder. The run's flags stay as given."""
    from entrain.runtime.checkpoint import latest_manifest
    from entrain.runtime.replan import last_plan
    from entrain.runtime.run_folder import system_out

    if not spec.run.resume or len(spec.schedule.systems) != 1:
        return spec
    out = system_out(spec, spec.schedule.systems[0])
    manifest = latest_manifest(out)
    path = last_plan(out, manifest["step"]) if manifest is not None else None
    if path is None:
        return spec
    _check_run_degrees(spec, out, path)
    if os.environ.get("RANK", "0") == "0" and not launched_worker():
        print(f"entrain train: note: --resume continues on the run's last layout, {path}", file=sys.stderr)
    return _with_plan_layout(replace(spec, schedule=replace(spec.schedule, plan=path)))


def _check_run_degrees(spec: RunConfig, out: str, path: str) -> None:
    """ConfigError when ``--resume`` of a run that re-planned gives ``--tp`` or ``--microbatch-size``
    another value than both the run's own (before its first re-plan: ``replan/state.json``) and the last
    re-plan's (``path``): a change the user asked for, which the re-plan's layout would silently replace."""
    from entrain.core.planning.plan_file import load_plan_dict
    from entrain.runtime.replan import read_state

    first = ((read_state(out) or {}).get("replans") or [None])[0]
    if first is None or first.get("old_microbatch_size") is None:  # a state written before these fields
        return
    plan = load_plan_dict(path)
    values = (
        ("--tp", spec.parallel.tp, first["old_allocation"]["llm"]["tp"], plan["layout"]["components"]["llm"]["tp"]),
        ("--microbatch-size", spec.parallel.microbatch_size, first["old_microbatch_size"], plan["microbatch_size"]),
    )  # fmt: skip
    for flag, given, own, replanned in values:
        if given not in (own, replanned):
            raise ConfigError(
                f"--resume: the run in {out} was started with {flag} {own} and re-planned to {flag} {replanned} "
                f"({path}), but {flag} {given} was given: resume with the run's flags, or train into a new --out"
            )


def _plan_flags(spec: RunConfig) -> dict:
    """The flag values ``--plan`` gave the run (its system, degrees and batch sizes), recorded as flags:
    config.json and the workers' argv show the run that trains, not the defaults it replaced."""
    p = spec.parallel
    return {"system": spec.schedule.systems[0], "dp": p.dp, "tp": p.tp, "cp": p.cp,
            "global_batch": p.global_batch, "microbatch_size": p.microbatch_size,
            **({"ep": p.ep} if p.ep_or_1 > 1 else {})}  # fmt: skip


def _with_plan_layout(spec: RunConfig) -> RunConfig:
    """``--plan``: the plan file's system, degrees (the LLM's expert parallelism included) and batch
    sizes (its stages are the layout's)."""
    from entrain.runtime.planning import plan_file

    system, setup = plan_file(spec)
    layout = setup.layout
    ep = layout.components["llm"].ep
    enc = layout.components[layout.stages[0].component_key]  # the (first) encoder's degrees
    return replace(
        spec,
        parallel=replace(
            spec.parallel,
            dp=layout.dp,
            tp=enc.tp,
            cp=enc.cp,
            ep=ep if ep > 1 else spec.parallel.ep,
            encoder_stages=None,
            llm_stages=None,
            global_batch=layout.global_batch,
            microbatch_size=layout.microbatch_size,
        ),
        schedule=replace(spec.schedule, systems=(system,)),
    )


def _tensorboard(wanted: bool) -> bool:
    """``--tensorboard``, refused before any launch when the package is missing."""
    if wanted:
        from entrain.runtime.tensorboard import check_tensorboard

        check_tensorboard()
    return wanted


NOT_RECORDED = {
    "nproc": "the launcher's own: the workers it starts are the processes",
    "demo": "its values are recorded as the flags it sets",
    "config": "the file's values are recorded as the flags they set",
    "paper_entrain": "recorded as the four extension flags it sets",
}
"""``train`` flags that ``config.json`` does not record (every other flag is: ``run_flags``), and why."""

NOT_IN_CONFIG = {
    **dict.fromkeys(
        ("nproc", "demo", "config", "paper_entrain"), "a launcher flag: its effect is other flags"
    ),
    "allow_other_dataset": "with --plan: the dataset actually run is fingerprinted (--dataset)",
}
"""``train`` flags without a ``RunConfig`` field (so outside the resume fingerprint), and why."""


def run_flags(args: argparse.Namespace) -> dict:
    """The resolved flags of a run (what config.json records for ``--config``)."""
    return {a.dest: getattr(args, a.dest) for a in ACTIONS if a.dest not in NOT_RECORDED}


def recorded_flags(spec: RunConfig) -> argparse.Namespace:
    """The run's flags as ``config.json`` records them (``spec.run.flags``), the others at their
    defaults: what the launcher forwards to its workers."""
    return argparse.Namespace(**{**DEFAULTS, **spec.run.flags})


def apply_demo(args: argparse.Namespace) -> None:
    """Demo values for every flag the user did not give (on the command line or by ``--config``)."""
    from entrain.cli.plan_flags import given_dests

    given = given_dests(args, DEFAULTS, ACTIONS)
    for key, value in DEMO.items():
        if key not in given:
            setattr(args, key, value)


def child_argv(args: argparse.Namespace) -> list[str]:
    """The resolved flags (every one that differs from the parser's own default), spelled out for the
    torchrun children, which build the same ``RunConfig`` from them. A ``--config`` file's values are
    defaults of the front process's parser only: they are compared with ``DEFAULTS``, never with the
    parser's current defaults, and the spelled-out flags must parse back to the values they spell."""
    out = []
    for action in ACTIONS:
        value = getattr(args, action.dest)
        if action.dest in NOT_RECORDED or value == DEFAULTS[action.dest]:
            continue
        flag = action.option_strings[0]
        out += [flag] if action.nargs == 0 else [flag, str(value)]
    _check_spelled(args, out)
    return out


def _check_spelled(recorded: argparse.Namespace, argv: list[str]) -> None:
    """RuntimeError when ``argv`` parsed by a fresh ``train`` parser (no ``--config`` defaults) gives
    any recorded flag another value than ``recorded`` holds: the workers would train another run."""
    from entrain.cli.main import build_parser

    back = build_parser().parse_args(["train", *argv])
    wrong = [
        f"{a.dest}: {getattr(recorded, a.dest)!r} became {getattr(back, a.dest)!r}"
        for a in ACTIONS
        if a.dest not in NOT_RECORDED and getattr(back, a.dest) != getattr(recorded, a.dest)
    ]
    if wrong:
        raise RuntimeError(f"the worker processes' flags would differ from the run's: {'; '.join(wrong)}")


def infer_dp(args: argparse.Namespace, world: int | None) -> None:
    """``--dp`` from the process count (``--nproc`` or torchrun's WORLD_SIZE) when the stages are fixed
    by flags and ``--dp`` is not given (the planner chooses it otherwise)."""
    fixed = args.encoder_stages is not None or args.llm_stages is not None
    if args.dp is not None or world is None or not fixed or args.plan:
        return
    enc, llm = args.encoder_stages or 1, args.llm_stages or 1
    per_replica = max(SYSTEMS[s].ranks_per_replica(enc, llm) for s in parse_systems(args.system))
    per_replica *= max(1, args.tp)
    if world % per_replica:
        lower = max(per_replica, world // per_replica * per_replica)
        unit, tp_note = ("processes", f" x --tp {args.tp}") if args.tp > 1 else ("pipeline ranks", "")
        raise ConfigError(
            f"{world} processes cannot form whole replicas of {per_replica} {unit} ({enc} encoder + {llm} LLM "
            f"stages{tp_note}): start a multiple of {per_replica} processes (e.g. "
            f"--nproc {lower} or {lower + per_replica}) or change --encoder-stages / --llm-stages"
        )
    args.dp = world // per_replica


def relaunch_args(args: argparse.Namespace, spec: RunConfig) -> argparse.Namespace:
    """The flags of the worker group after a re-plan (``entrain.runtime.replan``): the new plan file,
    resumed from the re-plan's checkpoint (resharded onto the new layout), with the plan's TP and
    microbatch size (``--replan-degrees`` may change them; ``--plan`` refuses a flag beside it with
    another value)."""
    from entrain.core.errors import EntrainError
    from entrain.core.planning.plan_file import load_plan_dict
    from entrain.runtime.replan import read_state
    from entrain.runtime.run_folder import system_out

    state = read_state(system_out(spec, spec.schedule.systems[0]))
    if state is None:
        raise EntrainError(f"a worker asked for a re-plan but {spec.run.out} holds no re-plan state")
    print(
        f"entrain train: re-plan after step {state['step'] - 1}: restarting on {state['plan']}",
        file=sys.stderr,
        flush=True,
    )
    plan = load_plan_dict(state["plan"])
    return argparse.Namespace(
        **{**vars(args), "plan": state["plan"], "resume": True, "overwrite": False,
           "encoder_stages": None, "llm_stages": None, "dp": None,
           "tp": plan["layout"]["components"]["llm"]["tp"], "microbatch_size": plan["microbatch_size"]},
    )  # fmt: skip
