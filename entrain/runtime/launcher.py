"""How a training process started by a launcher ends: its exit status and its error file.

``entrain train --nproc N`` starts torchrun (``entrain.cli.launch``) with ``$ENTRAIN_ERROR_DIR`` set:
each worker writes its Entrain error message to a file there instead of stderr, and the parent
prints each distinct message once. A worker leaves with ``ERROR_EXIT`` after an Entrain error,
``INTERRUPTED_EXIT`` after Ctrl-C and ``REPLAN_EXIT`` (``entrain.runtime.replan``) after a re-plan's
checkpoint, for the launcher to start the group again on the new plan.
"""

from __future__ import annotations

import os
import sys
import time

from entrain.core.errors import EntrainError

ERROR_EXIT = 2
INTERRUPTED_EXIT = 130
ERROR_DIR_ENV = "ENTRAIN_ERROR_DIR"
"""Set by the parent for its torchrun workers: each writes its Entrain error message to
``<time_ns>-rank<N>.txt`` there instead of stderr, and the parent prints each distinct message once."""


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launched_worker() -> bool:
    """A worker of ``entrain train --nproc N`` (not of the user's own torchrun)."""
    return bool(os.environ.get(ERROR_DIR_ENV))


def record_worker_error(error: EntrainError) -> None:
    """Write a worker's error for the parent, named by the time it happened: the cause is written
    before this rank leaves the process group, so before any peer can fail on its absence."""
    folder = os.environ.get(ERROR_DIR_ENV)
    if not folder:
        return
    path = os.path.join(folder, f"{time.time_ns()}-rank{os.environ['RANK']}.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(str(error))


def worker_errors(folder: str) -> list[str]:
    """The first error a worker wrote (the cause; a peer's failure follows it), with a count of the
    later distinct ones on the same line."""
    out: dict[str, None] = {}
    for name in sorted(os.listdir(folder), key=lambda n: int(n.split("-")[0])):  # time_ns-rank<N>.txt
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            out[f.read().strip()] = None
    messages = [m for m in out if m]
    if len(messages) > 1:
        return [f"{messages[0]} (then {len(messages) - 1} later error(s) on other ranks)"]
    return messages


def quiet_exit(code: int) -> None:
    """Leave a worker at once, without the interpreter's teardown: gloo's threads racing C++ static
    destructors abort ~1 launch in 10 with "terminate called without an active exception"
    (cpu-feasibility.md section 6.8), failing a finished run."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def leave_for_replan(under_torchrun: bool) -> None:
    """After a re-plan's checkpoint: leave the process group with ``REPLAN_EXIT`` (the launcher restarts
    the group on the new plan); a run without a launcher cannot restart itself and says how to continue."""
    from entrain.runtime.distributed import shutdown
    from entrain.runtime.replan import REPLAN_EXIT

    shutdown()
    how = "continue with --resume --plan OUT/replan/plan-<step>.json (entrain train --nproc N does it by itself)"
    if not under_torchrun:
        raise EntrainError(f"the drift monitor re-planned: {how}")
    if not launched_worker() and os.environ.get("RANK") == "0":
        print(f"entrain: the drift monitor re-planned; {how}", file=sys.stderr)
    quiet_exit(REPLAN_EXIT)
