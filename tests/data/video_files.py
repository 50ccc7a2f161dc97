"""Small real video files for tests, written with PyAV (FFmpeg's MPEG-4 part 2 encoder, AAC audio):
a few frames of a moving pattern at a small size, optionally with a tone as its audio track."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_video(path: Path, *, frames: int = 8, fps: int = 4, size: tuple[int, int] = (48, 64),
                audio_seconds: float | None = None, seed: int = 0, container: str | None = None) -> Path:  # fmt: skip
    """An ``mp4`` (or ``container``) of ``frames`` frames of ``size`` (H, W) at ``fps``; with
    ``audio_seconds`` a 16-kHz mono tone track of that length."""
    import av

    rng = np.random.default_rng(seed)
    h, w = size
    with av.open(str(path), "w", format=container) as out:
        video = out.add_stream("mpeg4", rate=fps)
        video.width, video.height, video.pix_fmt = w, h, "yuv420p"
        audio = out.add_stream("aac", rate=16_000, layout="mono") if audio_seconds else None
        for i in range(frames):
            img = np.zeros((h, w, 3), np.uint8)
            img[..., 0] = (40 * i + 30 * seed) % 256
            img[:, : max(1, (i + 1) * w // (frames + 1)), 1] = 200
            img = (img + rng.integers(0, 50, img.shape)).astype(np.uint8)
            for packet in video.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
        if audio is not None:
            n = int(16_000 * audio_seconds)
            tone = (0.3 * np.sin(np.arange(n) * (0.03 + 0.01 * seed)) + 0.02 * rng.normal(size=n)).astype(
                np.float32
            )
            frame = av.AudioFrame.from_ndarray(tone[None], format="flt", layout="mono")
            frame.sample_rate = 16_000
            for packet in audio.encode(frame):
                out.mux(packet)
            for packet in audio.encode():
                out.mux(packet)
    return Path(path)


def write_truncated(path: Path, keep: float = 0.6) -> Path:
    """A video whose index comes first (``faststart``) cut after ``keep`` of its bytes: its stream
    declares more frames than decode."""
    import av

    full = Path(str(path) + ".full.mp4")
    with av.open(str(full), "w", options={"movflags": "faststart"}) as out:
        video = out.add_stream("mpeg4", rate=4)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        rng = np.random.default_rng(1)
        for _ in range(30):
            img = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
            for packet in video.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
    data = full.read_bytes()
    full.unlink()
    Path(path).write_bytes(data[: int(len(data) * keep)])
    return Path(path)


def write_frameless(path: Path) -> Path:
    """An AVI holding a video stream and no frame."""
    import av

    out = av.open(str(path), "w")
    video = out.add_stream("mpeg4", rate=4)
    video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
    out.start_encoding()
    out.close()
    return Path(path)


def write_bad_track(path: Path, fault: str) -> Path:
    """An MP4 (index first) of 8 whole frames at 4 fps whose 4-s AAC track, the file's tail, is cut at a
    packet's start so that its last 8 packets are gone (``fault="cut"``: FFmpeg decodes what is left
    without an error), or has every packet overwritten with 0xff bytes (``"corrupt"``)."""
    import av

    full = Path(str(path) + ".full.mp4")
    with av.open(str(full), "w", options={"movflags": "faststart"}) as out:
        video = out.add_stream("mpeg4", rate=4)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        audio = out.add_stream("aac", rate=16_000, layout="mono")
        for i in range(8):
            img = np.full((48, 64, 3), 20 * i, np.uint8)
            for packet in video.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
        tone = (0.3 * np.sin(np.arange(64_000) * 0.05)).astype(np.float32)
        frame = av.AudioFrame.from_ndarray(tone[None], format="flt", layout="mono")
        frame.sample_rate = 16_000
        for packet in [*audio.encode(frame), *audio.encode()]:
            out.mux(packet)
    with av.open(str(full)) as container:
        packets = [(p.pos, p.size) for p in container.demux(audio=0) if p.size]
    data = bytearray(full.read_bytes())
    full.unlink()
    if fault == "cut":
        data = data[: packets[-8][0]]
    else:
        for pos, size in packets:
            data[pos : pos + size] = b"\xff" * size
    Path(path).write_bytes(bytes(data))
    return Path(path)
