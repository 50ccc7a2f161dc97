"""Decoding a video leaves no FFmpeg thread behind: a process forked after a decode (a DataLoader worker,
a forked rank) can deadlock on a lock such a thread held, as forked ranks did under PyAV 18.1.1 with the
converters' threads left at FFmpeg's choice. Counted in a fresh interpreter (the suite's own process
runs other threads), without a garbage collection between the decode and the count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.data.video_files import write_video

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")

SCRIPT = """
import json, os, sys
import numpy as np
from entrain.data.video import audio_track, probe_video, read_frames
threads = lambda: len(os.listdir("/proc/self/task"))
path = sys.argv[1]
np.ones(4) @ np.ones(4)  # numpy's own threads start before the count
before = threads()
probe_video(path)
frames = read_frames(path, [0, 2, 5])
samples = audio_track(path)
print(json.dumps({"before": before, "after": threads(), "frames": frames.shape, "samples": len(samples)}))
"""


def test_probe_read_and_audio_leave_no_thread_behind(tmp_path):
    path = write_video(tmp_path / "clip.mp4", frames=8, size=(96, 128), audio_seconds=1.0)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True, env=env,
                         timeout=60, check=True).stdout  # fmt: skip
    got = json.loads(out.strip().splitlines()[-1])
    assert got["frames"] == [3, 96, 128, 3] and got["samples"] > 15_000
    assert got["after"] == got["before"], got


def test_one_converter_thread_gives_ffmpegs_own_pixels(tmp_path):
    """``read_frames`` (one converter thread) gives the pixels of FFmpeg's default conversion."""
    import av

    from entrain.data.video import read_frames

    path = write_video(tmp_path / "clip.mp4", frames=6, size=(96, 128))
    with av.open(str(path)) as container:
        want = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    np.testing.assert_array_equal(read_frames(path, range(6)), want)
