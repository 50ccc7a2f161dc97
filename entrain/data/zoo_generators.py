"""The workload zoo beyond the paper's datasets (names in docs/contract.md; distributions and sources
in docs/workloads.md): document pages, multi-image, video, text-heavy, long-context, their mixture,
AnyRes-sized images and audio (``omni``). Pure numpy; ``entrain.data.generators`` draws them."""

from __future__ import annotations

import math

import numpy as np

from entrain.data.generator_draws import (
    Gen,
    Rows,
    choice,
    join_samples,
    lognormal,
    one_image,
    qa_text,
    rows_from,
    split_samples,
    tokens,
    with_template,
)
from entrain.data.paper_generators import coco_images, synthchart_images

DOC_LONG_SIDE_PX = (800, 3500)
"""Scanned pages' long side (docs/workloads.md): fax/low-DPI, 200-DPI and 300-DPI letter/A4 scans."""
DOC_OCR_SHARE = 0.6
"""Share of document samples whose prompt carries the page's OCR text [assumed]."""


def _docvqa(rng: np.random.Generator, n: int) -> Rows:
    scan = choice(rng, [0.30, 0.45, 0.25], n)  # ~100 DPI / 200 DPI / 300 DPI letter-size scans
    long_side = np.choose(
        scan, [rng.uniform(800, 1300, n), rng.normal(2200, 150, n), rng.uniform(2900, 3500, n)]
    )
    long_side = np.clip(long_side, *DOC_LONG_SIDE_PX)
    short_side = long_side * np.where(rng.random(n) < 0.7, 8.5 / 11, 1 / math.sqrt(2))  # letter / A4
    landscape = rng.random(n) < 0.1
    heights = np.where(landscape, short_side, long_side).astype(np.int64)
    widths = np.where(landscape, long_side, short_side).astype(np.int64)
    turns = np.minimum(12, 1 + rng.poisson(2.9, n))  # ~3.9 questions per page
    qa = qa_text(rng, n, turns, q_mean=13, a_mean=5, a_sigma=0.7)
    ocr = np.where(rng.random(n) < DOC_OCR_SHARE, np.clip(tokens(lognormal(rng, 700, 0.7, n)), 64, 4096), 0)
    return one_image(with_template(qa + ocr, np.ones(n, dtype=np.int64)), (heights, widths))


MULTI_IMAGE_COUNT_WEIGHTS = [0.22, 0.20, 0.14, 0.12, 0.10, 0.08, 0.07, 0.07]
"""P(1..8 images) of an interleaved / multi-image instruction sample [assumed; mean ~3.4]."""


def _web_photos(rng: np.random.Generator, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Web images: long side lognormal (mean 700 px) in [224, 1536], 4:3 / 3:2 / 16:9 / square."""
    long_side = np.clip(lognormal(rng, 700, 0.4, shape), 224, 1536)
    aspect = np.array([0.75, 2 / 3, 0.5625, 1.0])[choice(rng, [0.4, 0.25, 0.2, 0.15], shape[0] * shape[1])]
    short_side = long_side * aspect.reshape(shape)
    portrait = rng.random(shape) < 0.25
    heights = np.where(portrait, long_side, short_side).astype(np.int64)
    widths = np.where(portrait, short_side, long_side).astype(np.int64)
    return heights, widths


def _multi_image(rng: np.random.Generator, n: int) -> Rows:
    counts = 1 + choice(rng, MULTI_IMAGE_COUNT_WEIGHTS, n)
    heights, widths = _web_photos(rng, (n, len(MULTI_IMAGE_COUNT_WEIGHTS)))
    turns = 1 + choice(rng, [0.6, 0.3, 0.1], n)
    text = with_template(qa_text(rng, n, turns, q_mean=30, a_mean=90, a_sigma=0.7), counts)
    return rows_from(counts, heights, widths, text)


VIDEO_FRAMES = (4, 32)
"""Frames a video sample (docs/workloads.md); even, as Qwen2.5-VL's temporal patch spans 2 frames."""
VIDEO_FRAME_MAX_PIXELS = 768 * 28 * 28
"""qwen_vl_utils' per-frame pixel cap for video (VIDEO_MAX_PIXELS)."""
_VIDEO_SOURCES = [((640, 360), 0.30), ((854, 480), 0.35), ((1280, 720), 0.30), ((1920, 1080), 0.05)]
"""(W, H) of the source clips: 360p / 480p / 720p / 1080p [assumed weights]."""


def _video_frames(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(heights, widths)`` of ``n`` videos' frames: ``_VIDEO_SOURCES`` (10% portrait), each frame
    within ``VIDEO_FRAME_MAX_PIXELS``."""
    src = choice(rng, [p for _, p in _VIDEO_SOURCES], n)
    w = np.array([s[0] for s, _ in _VIDEO_SOURCES])[src].astype(float)
    h = np.array([s[1] for s, _ in _VIDEO_SOURCES])[src].astype(float)
    scale = np.minimum(1.0, np.sqrt(VIDEO_FRAME_MAX_PIXELS / (w * h)))
    portrait = rng.random(n) < 0.1
    fh, fw = np.where(portrait, w, h) * scale, np.where(portrait, h, w) * scale
    return fh.astype(np.int64), fw.astype(np.int64)


def _video(rng: np.random.Generator, n: int) -> Rows:
    """A video of T frames is T/2 temporal patches; each is priced as one image of the frame size
    (Qwen2.5-VL's ViT attends within each temporal patch, and the LLM sees T/2 x (H'/28)(W'/28) tokens)."""
    fixed = np.array([8, 16, 32])[choice(rng, [0.45, 0.35, 0.20], n)]  # uniform-budget sampling
    fps2 = 2 * np.rint(lognormal(rng, 8, 0.6, n)).astype(np.int64)  # 2 fps over a clip of ~8 s
    frames = np.clip(np.where(rng.random(n) < 0.6, fixed, fps2), *VIDEO_FRAMES)
    frames = frames - frames % 2
    fh, fw = _video_frames(rng, n)
    width = VIDEO_FRAMES[1] // 2
    counts = frames // 2
    heights = np.repeat(fh[:, None], width, axis=1)
    widths = np.repeat(fw[:, None], width, axis=1)
    turns = 1 + (rng.random(n) < 0.3)
    text = with_template(
        qa_text(rng, n, turns, q_mean=15, a_mean=25, a_sigma=0.8), np.ones(n, dtype=np.int64)
    )
    return rows_from(counts, heights, widths, text)


TEXT_ONLY_SHARE = 0.5
"""Share of ``text-heavy`` samples without an image (docs/workloads.md: about half)."""


def _text_heavy(rng: np.random.Generator, n: int) -> Rows:
    text_only = rng.random(n) < TEXT_ONLY_SHARE
    turns = 1 + choice(rng, [0.55, 0.3, 0.15], n)
    only = qa_text(rng, n, turns, q_mean=60, a_mean=420, a_sigma=0.7, a_max=4096)
    with_image = qa_text(rng, n, turns, q_mean=25, a_mean=250, a_sigma=0.6, a_max=4096)
    counts = (~text_only).astype(np.int64)
    text = with_template(np.where(text_only, only, with_image), counts)
    heights, widths = coco_images(rng, n)
    return rows_from(counts, heights[:, None], widths[:, None], text)


LONG_CONTEXT_TOKENS = (2048, 16384)
"""Text tokens of a ``long-context`` sample (docs/workloads.md), log-uniform."""
LONG_CONTEXT_IMAGE_SHARE = 0.4
"""Share of long-context samples with their one small image [assumed]."""


def _long_context(rng: np.random.Generator, n: int) -> Rows:
    lo, hi = LONG_CONTEXT_TOKENS
    text = np.clip(np.rint(np.exp(rng.uniform(math.log(lo), math.log(hi), n))), lo, hi).astype(np.int64)
    counts = (rng.random(n) < LONG_CONTEXT_IMAGE_SHARE).astype(np.int64)
    long_side = rng.uniform(224, 448, n)
    short_side = long_side * np.array([1.0, 0.75, 0.5625])[choice(rng, [0.4, 0.4, 0.2], n)]
    return rows_from(counts, short_side[:, None], long_side[:, None], text)


MIXTURE_WEIGHTS = {
    "docvqa": 0.15,
    "multi-image": 0.20,
    "video": 0.15,
    "text-heavy": 0.30,
    "long-context": 0.20,
}
"""Per-sample source of ``mixture`` (i.i.d. in data order) [assumed]."""


def _mixture(rng: np.random.Generator, n: int) -> Rows:
    source = choice(rng, list(MIXTURE_WEIGHTS.values()), n)
    parts = [ZOO_GENERATORS[name](rng, n) for name in MIXTURE_WEIGHTS]
    per_sample = [split_samples(rows) for rows in parts]
    picked = [per_sample[s][i] for i, s in enumerate(source.tolist())]
    return join_samples(picked)


ANYRES_SOURCE_WEIGHTS = [0.35, 0.20, 0.25, 0.20]
"""Per-sample source of ``anyres``: web photos, charts, document pages, screenshots [assumed]."""
_SCREENSHOTS = [((1920, 1080), 0.35), ((2560, 1440), 0.15), ((1080, 2400), 0.30), ((800, 3000), 0.20)]
"""(W, H) of screenshots: desktop 1080p / 1440p, phone, long infographics [assumed weights]."""


def _screenshots(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    pick = choice(rng, [p for _, p in _SCREENSHOTS], n)
    return (np.array([s[1] for s, _ in _SCREENSHOTS])[pick], np.array([s[0] for s, _ in _SCREENSHOTS])[pick])


def _anyres(rng: np.random.Generator, n: int) -> Rows:
    """One image a sample of very different sizes and aspect ratios (LLaVA-OneVision's single-image
    stage: photos, charts, pages, screenshots), so AnyRes tiles it into 2..37 tiles."""
    source = choice(rng, ANYRES_SOURCE_WEIGHTS, n)
    photo_h, photo_w = _web_photos(rng, (n, 1))
    chart_h, chart_w = synthchart_images(rng, n)
    _, page_h, page_w, _ = _docvqa(rng, n)
    shot_h, shot_w = _screenshots(rng, n)
    heights = np.choose(source, [photo_h[:, 0], chart_h, page_h, shot_h]).astype(np.int64)
    widths = np.choose(source, [photo_w[:, 0], chart_w, page_w, shot_w]).astype(np.int64)
    turns = 1 + np.minimum(7, rng.poisson(1.2, n))
    qa = qa_text(rng, n, turns, q_mean=18, a_mean=60, a_sigma=0.9)
    text = with_template(qa, np.ones(n, dtype=np.int64))
    return one_image(text, (heights, widths))


OMNI_SOURCE_WEIGHTS = {"speech-qa": 0.35, "audio-caption": 0.25, "image-audio": 0.25, "video-audio": 0.15}
"""Per-sample source of ``omni`` (i.i.d.) [assumed]: a spoken passage with questions about it, a sound
to caption, a photo with a spoken question about it, a video with its audio track and questions about
both."""
SPEECH_MEAN_SECONDS = 12.0
"""Mean speech-QA clip (docs/workloads.md: LibriSpeech's utterances average about 12 s)."""
AUDIOCAPS_SHARE = 0.7
"""Captioning clips of AudioCaps' fixed 10 s (AudioSet segments); the rest Clotho's 15-30 s [assumed share]."""
CLOTHO_SECONDS = (15.0, 30.0)
SPOKEN_QUESTION_MEAN_SECONDS = 4.0
"""Mean spoken question about an image [assumed]."""
MEL_FRAMES_PER_SECOND = 100
"""Whisper's 10-ms hop (160 samples at 16 kHz); a clip is cut at 30 s (3,000 frames) as the processor does."""
AV_TEN_SECOND_SHARE = 0.7
"""Videos with their audio track of VGGSound's fixed 10 s (the clips AVQA asks about) [assumed share]."""
AV_SECONDS = (2, 30)
"""The other videos' whole seconds, uniform: at least a temporal patch pair (4 frames, the video
processor's minimum), at most the audio window (30 s) [assumed range]."""
AV_FPS = 2
"""Frames a second the video processor samples (Qwen2.5-Omni's 2 fps): a T-second clip is 2T frames, T
temporal patches, and its track 100 T mel frames."""


def _omni_with_audio(rng: np.random.Generator, n: int) -> tuple[Rows, list[tuple[int, ...]]]:
    """Rows of ``omni`` and each sample's one audio clip (mel frames); audio markers count as a
    visual item's (``<|audio_bos|>`` / ``<|audio_eos|>``). A video with its audio track is its T/2
    temporal patches as stills of one frame size (as ``video``'s) and the track as its clip."""
    source = choice(rng, list(OMNI_SOURCE_WEIGHTS.values()), n)
    speech = np.clip(lognormal(rng, SPEECH_MEAN_SECONDS, 0.5, n), 1.0, 30.0)
    caption = np.where(rng.random(n) < AUDIOCAPS_SHARE, 10.0, rng.uniform(*CLOTHO_SECONDS, n))
    question = np.clip(lognormal(rng, SPOKEN_QUESTION_MEAN_SECONDS, 0.5, n), 1.0, 15.0)
    av_seconds = np.where(
        rng.random(n) < AV_TEN_SECOND_SHARE, 10, rng.integers(AV_SECONDS[0], AV_SECONDS[1] + 1, n)
    )
    seconds = np.choose(source, [speech, caption, question, av_seconds])
    frames = np.clip(np.rint(seconds * MEL_FRAMES_PER_SECOND), 1, 30 * MEL_FRAMES_PER_SECOND).astype(np.int64)
    video = source == 3
    counts = np.where(video, av_seconds * AV_FPS // 2, (source == 2)).astype(np.int64)
    photo_h, photo_w = _web_photos(rng, (n, 1))
    frame_h, frame_w = _video_frames(rng, n)
    width = AV_SECONDS[1] * AV_FPS // 2
    heights = np.repeat(np.where(video, frame_h, photo_h[:, 0])[:, None], width, axis=1)
    widths = np.repeat(np.where(video, frame_w, photo_w[:, 0])[:, None], width, axis=1)
    turns = 1 + (rng.random(n) < 0.3)
    speech_qa = qa_text(rng, n, turns, q_mean=12, a_mean=30, a_sigma=0.6)
    captions = qa_text(rng, n, np.ones(n, dtype=np.int64), q_mean=8, a_mean=18, a_sigma=0.4)
    image_qa = qa_text(rng, n, turns, q_mean=10, a_mean=45, a_sigma=0.6)
    video_qa = qa_text(rng, n, turns, q_mean=14, a_mean=12, a_sigma=0.8)
    items = (source >= 2).astype(np.int64) + 1  # the image or video's markers, the clip's
    text = with_template(np.choose(source, [speech_qa, captions, image_qa, video_qa]), items)
    return rows_from(counts, heights, widths, text), [(int(f),) for f in frames.tolist()]


def _omni(rng: np.random.Generator, n: int) -> Rows:
    return _omni_with_audio(rng, n)[0]


WITH_AUDIO = {"omni": _omni_with_audio}
"""The generators whose samples carry audio clips: ``(rng, n) -> (rows, audio per sample)``."""

ZOO_GENERATORS: dict[str, Gen] = {
    "docvqa": _docvqa,
    "multi-image": _multi_image,
    "video": _video,
    "text-heavy": _text_heavy,
    "long-context": _long_context,
    "mixture": _mixture,
    "anyres": _anyres,
    "omni": _omni,
}
"""The zoo's generators by name."""
ZOO: tuple[str, ...] = tuple(ZOO_GENERATORS)
"""The workload zoo (beyond the paper's four datasets)."""
