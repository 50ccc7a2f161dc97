"""Video clips for ``entrain data synth``: the ``video`` workload's samples (docs/workloads.md: a video
of T frames drawn as T/2 temporal patches of one frame size) written as real videos instead of T/2
still images.

A clip is a shipped photo (``entrain.data.synth_photos``) covering a window 1.25 times the frame size,
the frame a crop that pans across it at constant speed: T frames of exactly the drawn ``(H, W)`` at
``SYNTH_FPS`` (2 frames a second, the rate Qwen's video processors sample at, so every frame is kept and
the video's grid has T/2 temporal patches), H.264 in 4:4:4 (any frame size, odd ones included) in an
MP4, written with PyAV. Its tokens are what the video processor makes of it (``entrain.data.video``):
the drawn images' tokens wherever the frame is within the video pixel limits (128 to 768 merged
tokens), a little fewer for a frame above them.

An ``omni`` video with its audio track (T/2 stills of one size and one clip, docs/workloads.md) is the
same pan with the clip as its track: 16-bit PCM at 16 kHz in a QuickTime MOV (H.264 + PCM), so the
track decodes to exactly the drawn mel frames (AAC would pad it to whole 1,024-sample frames)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from entrain.core.workload.samples import SampleMeta

__all__ = ["SYNTH_FPS", "VIDEO_DATASETS", "AUDIO_VIDEO_DATASETS", "is_video_sample", "write_clip"]

SYNTH_FPS = 2
VIDEO_DATASETS = ("video",)
"""Built-in generators whose every sample is a video (its T/2 temporal patches drawn as images of one
size); ``mixture`` and ``curriculum`` draw their videos the same way but among other multi-image
samples, which nothing tells apart, so they stay stills."""
AUDIO_VIDEO_DATASETS = ("omni",)
"""Built-in generators whose samples of two or more stills of one size and an audio clip are a video
with its audio track (their other samples have at most one image)."""
PAN = 1.25


def is_video_sample(name: str, target: SampleMeta) -> bool:
    """Whether ``data synth`` writes ``target`` as a video: a video generator's sample of two or more
    temporal patches of one size, or an audio-video generator's such sample with its clip (the track)."""
    if name in AUDIO_VIDEO_DATASETS and len(target.audio) != 1:
        return False
    return (
        name in (*VIDEO_DATASETS, *AUDIO_VIDEO_DATASETS)
        and len(target.images) >= 2
        and len(set(target.images)) == 1
    )


def write_clip(
    photo,
    frames: int,
    height: int,
    width: int,
    path: Path,
    rng: np.random.Generator,
    track: np.ndarray | None = None,
) -> None:
    """``frames`` frames of ``height x width`` panning across ``photo`` (a random direction), at
    ``SYNTH_FPS``, as H.264 at ``path`` (its container by its suffix); with ``track`` (16-bit mono
    samples at 16 kHz) an audio stream of exactly those samples (PCM)."""
    import av
    from PIL import Image

    from entrain.data.synth_photos import write_photo

    big_w, big_h = max(width + 2, round(width * PAN)), max(height + 2, round(height * PAN))
    path.parent.mkdir(parents=True, exist_ok=True)
    still = path.with_suffix(".canvas.png")  # the photo covering the panned window, read back
    write_photo(photo, big_h, big_w, still)
    with Image.open(still) as im:
        canvas = np.asarray(im.convert("RGB"))
    still.unlink()
    start, end = rng.random(2), rng.random(2)
    span = np.array([big_h - height, big_w - width])
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=SYNTH_FPS, options={"preset": "veryfast", "crf": "26"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv444p"
        audio = None if track is None else out.add_stream("pcm_s16le", rate=16_000, layout="mono")
        for i in range(frames):
            y, x = np.rint((start + (end - start) * i / max(1, frames - 1)) * span).astype(int)
            frame = np.ascontiguousarray(canvas[y : y + height, x : x + width])
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
        if audio is not None:
            clip = av.AudioFrame.from_ndarray(np.ascontiguousarray(track[None]), format="s16", layout="mono")
            clip.sample_rate = 16_000
            for packet in [*audio.encode(clip), *audio.encode()]:
                out.mux(packet)
