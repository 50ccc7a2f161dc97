"""How a training process started by a launcher ends: its exit status and its error file.

``entrain train --nproc N`` starts torchrun (``entrain.cli.launch``) with ``$ENTRAIN_ERROR_DIR`` set:
each worker writes its Entrain error message to a file there instead of stderr, and the parent
prints each distinct message once. A worker leaves with ``ERROR_EXIT`` after an Entrain error,
``INTERRUPTED_EXIT`` after Ctrl-C and ``REPLAN_EXIT`` (``entrain.runtime.replan``) after a re-plan's
checkpoint, for the launcher to start the group again on the new plan.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from entrain.core.errors import EntrainError

ERROR_EXIT = 2
INTERRUPTED_EXIT = 130
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOPPED_EXITS = {128 + s: how for s, how in zip(STOP_SIGNALS, ("interrupted", "terminated", "hung up"))}
"""The launcher's exit status after each of ``STOP_SIGNALS`` (the shell's ``128 + N``) and its word."""
STOP_WAIT_S = 30.0
"""How long the processes of a stopped run get to end on the forwarded signal before SIGKILL."""
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
    (docs/design.md §6.7), failing a finished run."""
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


TERMINATED_EXIT = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's ``KeyboardInterrupt`` would be: the run stops the same way."""


def _raise_terminated(signum: int, frame) -> None:
    raise Terminated()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within: SIGTERM raises ``Terminated`` (a ``KeyboardInterrupt``) in the main thread, so a run in
    this process stops as on Ctrl-C (its records closed, one line) instead of dying mid-write."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Stopped(Exception):  # noqa: N818 - a signal, not an error
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def stop_on_signals(start: Callable[[], subprocess.Popen]) -> int:
    """``start()`` a child (in its own session) and wait for it: its exit status, or, when this process
    gets one of ``STOP_SIGNALS``, ``128 + N`` once the signal was forwarded to the child and every
    process it started (workers in sessions of their own included) and each of them has ended (SIGKILL
    after ``STOP_WAIT_S``). Off the main thread no handler can be set: a plain wait."""
    if threading.current_thread() is not threading.main_thread():
        return start().wait()
    stopping: list[int] = []
    started: list[subprocess.Popen] = []

    def handler(signum: int, frame) -> None:
        stopping.append(signum)
        if len(stopping) == 1 and started:  # once: a second Ctrl-C while the tree stops changes nothing
            raise _Stopped(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        started.append(start())
        if stopping:  # the signal came while the child was being started
            raise _Stopped(stopping[0])
        return started[0].wait()
    except _Stopped as e:
        stop_tree(started[0], e.signum, STOP_WAIT_S)
        return 128 + e.signum
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def stop_tree(proc: subprocess.Popen, signum: int, wait_s: float) -> None:
    """Send ``signum`` to ``proc`` and all its descendants, wait up to ``wait_s`` for every one of them
    to end, then SIGKILL those left. A process is known by its pid and start time, so a pid reused by
    another process meanwhile is never signalled."""
    tree = set(descendants(proc.pid))
    proc.send_signal(signum)
    _send(tree, signum)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is None:
            tree |= set(descendants(proc.pid))
        elif not tree:
            break
        tree = {p for p in tree if _running(p)}
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    _send(tree, signal.SIGKILL)
    proc.wait()


Process = tuple[int, str]
"""A process: its pid and start time (``/proc/PID/stat``'s ``starttime``)."""


def _send(processes: set[Process], signum: int) -> None:
    for process in processes:
        if _running(process):
            try:
                os.kill(process[0], signum)
            except ProcessLookupError:
                pass


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state, ppid, ...); None when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> list[Process]:
    """Every process below ``pid`` (children, their children, ...; Linux ``/proc``; none elsewhere)."""
    if not os.path.isdir("/proc"):
        return []
    children: dict[int, list[Process]] = {}
    for name in os.listdir("/proc"):
        stat = _proc_stat(int(name)) if name.isdigit() else None
        if stat is not None:
            children.setdefault(int(stat[1]), []).append((int(name), stat[19]))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += [k[0] for k in kids]
    return out


def _running(process: Process) -> bool:
    """Whether ``process`` still runs (a zombie, ended but not yet reaped by its parent, does not)."""
    stat = _proc_stat(process[0])
    return stat is not None and stat[19] == process[1] and stat[0] != "Z"
