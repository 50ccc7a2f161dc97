"""PeerWatch: a collective point that a peer never reaches names the peer and what it did last."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from entrain.runtime.health import PeerError, PeerWatch

from .harness import run_workers


def _wait_for(path: Path, limit_s: float = 50.0) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _stall_at_second_point(env, folder):
    # phase one: both ranks get there however loaded the machine is (a 60 s allowance costs nothing
    # when they do); phase two: rank 1 stays away until rank 0 has given up after its 1 s timeout
    watch = PeerWatch(env.rank, env.world_size, timeout_s=60.0)
    watch.gather_point("phase one")
    watch.timeout_s = 1.0
    gave_up = Path(folder) / "rank0-gave-up"
    if env.rank == 1:
        _wait_for(gave_up)
        return None
    try:
        watch.gather_point("phase two")
    except PeerError as e:
        return str(e)
    finally:
        gave_up.touch()
    return None


def _die_after_first_point(env):
    watch = PeerWatch(env.rank, env.world_size, timeout_s=60.0)
    watch.gather_point("phase one")
    if env.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    watch.mark("phase two")
    return watch.behind()


def test_gather_point_names_the_peer_that_does_not_arrive(tmp_path):
    results = run_workers(_stall_at_second_point, 2, tmp_path, str(tmp_path), clean_shutdown=False)
    assert results[1] is None
    assert "rank 0: phase two failed: peer rank(s) [1] did not get there" in results[0], results[0]
    assert "rank 1 last reached 'phase one'" in results[0], results[0]


def test_a_dead_peer_stays_behind_on_the_board(tmp_path):
    with pytest.raises(AssertionError, match="rank 1 produced no result"):
        run_workers(_die_after_first_point, 2, tmp_path, timeout_s=30, clean_shutdown=False)
    # rank 0's result was written before the parent noticed rank 1
    import pickle

    status, behind = pickle.loads((tmp_path / "rank0.pkl").read_bytes())
    assert status == "ok" and behind == {1: "phase one"}
