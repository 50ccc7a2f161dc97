"""``entrain data synth``: a real LLaVA-format dataset shaped like a built-in generator.

For each sample of ``generate_samples(name, n, seed)`` this writes one image of exactly the drawn
``(H, W)`` and a conversation whose chat-formatted length equals the drawn text-token count (same
Qwen2 tokens as ``read_metadata`` counts; only targets below the shortest possible conversation
come out longer):

- chart datasets (``synthchartnet``, ``synthchartnet-fv``, ``chartqa``): a Matplotlib bar, line or
  pie chart of seeded numbers, with questions answered from those numbers (ChartQA style) or the
  chart's table in OTSL (SynthChartNet style);
- photo datasets (``cocoqa``, ``llava150k``, ``skewed``): a real photo shipped in scikit-image /
  scikit-learn (CC0 / CC-BY, see their READMEs), cropped and resized, with questions and answers
  written from the photo's caption and facts.

- ``omni``: a synthesised sound (``entrain.data.synth_audio``: speech-like syllables, birdsong, rain,
  a bell, an engine) with questions and a caption written from its description, or a photo with a
  spoken (speech-like) question clip; each clip a 16-kHz WAV of exactly the drawn mel frames.

The photos are in ``entrain.data.synth_photos``, the charts in ``entrain.data.synth_charts``; this
module fits the text to the drawn token counts and writes the dataset.

- ``video``: each video sample (T/2 temporal patches drawn as stills of one size) a real clip of T
  frames panning across a photo (``entrain.data.synth_video``), one ``<video>`` in its question;
  ``omni``'s videos the same with their clip as the audio track (a synthesised sound, PCM in a MOV)
  and ``"use_audio_in_video": true``.

Output: ``DIR/data.json`` (an array, one record per line), ``DIR/images/<id>.png|.jpg``, for audio
``DIR/audio/<id>.wav`` and for video ``DIR/videos/<id>.mp4`` (``.mov`` with an audio track).
Deterministic in ``(name, n, seed)``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from entrain.core.errors import ConfigError
from entrain.core.workload.samples import DEFAULT_VISION, SampleMeta, VisionTokenConfig
from entrain.data.check import DEFAULT_MAX_TOKENS
from entrain.data.generators import canonical_name, generate_samples
from entrain.data.processing import count_text_tokens
from entrain.data.synth_charts import (
    CHARTQA_CLOSERS,
    CHARTQA_SUFFIX,
    Chart,
    chart_qa,
    draw_chart,
    otsl_rows_for,
    otsl_table,
    render_chart,
)
from entrain.data.synth_photos import PHOTOS, Photo, write_photo
from entrain.data.synth_video import is_video_sample
from entrain.data.tokenizer import TextTokenizer, default_tokenizer

__all__ = ["CHART_DATASETS", "SynthResult", "synth_dataset"]

CHART_DATASETS = frozenset({"synthchartnet", "synthchartnet-fv", "chartqa"})


# --- text fitting ---------------------------------------------------------------------------------


def _join(text: str, piece: str) -> str:
    return f"{text} {piece}" if text else piece


def _fill(
    pieces, budget: int, tok: TextTokenizer, text: str = "", closers: tuple[str, ...] = (), words: bool = True
) -> str:
    """``text`` extended by whole ``pieces`` (sentences) while it stays within ``budget`` tokens; the
    rest is closed with the longest fitting ``closers`` (short sentences), then (with ``words``)
    single words of the next piece. Never cuts a word; may end below ``budget``."""
    for piece in pieces:
        cand = _join(text, piece)
        n = tok.count(cand)
        if n <= budget:
            text = cand
            if n == budget:
                return text
            continue
        text = _close(text, budget, tok, closers)
        for word in piece.split() if words else ():
            cand = _join(text, word)
            if tok.count(cand) > budget:
                break
            text = cand
        return text
    return text


def _close(text: str, budget: int, tok: TextTokenizer, closers: tuple[str, ...]) -> str:
    """Append the longest closers that still fit, longest first, until none does."""
    for closer in sorted(closers, key=lambda c: (-tok.count(c), c)):
        cand = _join(text, closer)
        if tok.count(cand) <= budget:
            text = cand
    return text


def _phrase(options: list[str], budget: int, tok: TextTokenizer) -> str:
    """The longest of ``options`` (shortest first) within ``budget`` tokens, else the first."""
    best = options[0]
    for opt in options:
        if tok.count(opt) <= budget:
            best = opt
    return best


def _short_answers(answer: str) -> list[str]:
    return [
        answer,
        f"{answer}.",
        f"It is {answer}.",
        f"The answer is {answer}.",
        f"I think the answer is {answer}.",
    ]


def _cycle_sentences(sentences, rng: np.random.Generator) -> Iterator[str]:
    connectives = ("", "In addition,", "Also,", "Notably,", "Overall,", "Looking closer,")
    for k in itertools.count():
        for s in rng.permutation(len(sentences)).tolist():
            c = connectives[(k + s) % len(connectives)] if k else ""
            text = sentences[s]
            yield f"{c} {text[0].lower()}{text[1:]}" if c else text


@dataclass(frozen=True)
class _Style:
    q_mean: float
    a_mean: float
    max_turns: int


_STYLES = {
    "chartqa": _Style(22.1, 4.8, 3),
    "cocoqa": _Style(14.4, 2.7, 4),
    "llava150k": _Style(12.0, 58.0, 10),
    "synthchartnet": _Style(4.3, 134.8, 1),
    "synthchartnet-fv": _Style(4.3, 134.8, 1),
    "skewed": _Style(10.0, 30.0, 1),
    # the workload zoo (docs/workloads.md); docvqa's questions carry the page's OCR text
    "docvqa": _Style(180.0, 5.0, 12),
    "multi-image": _Style(30.0, 90.0, 3),
    "video": _Style(15.0, 25.0, 2),
    "text-heavy": _Style(45.0, 340.0, 3),
    "long-context": _Style(6000.0, 400.0, 1),
    "mixture": _Style(60.0, 150.0, 3),
    "omni": _Style(10.0, 32.0, 2),
}
_SYSTEM = 11
_PER_IMAGE = 2 + 1
"""Vision start/end and the newline after each ``<image>``."""
_TURN = 10


def _turn_budgets(
    name: str, text_tokens: int, rng: np.random.Generator, num_images: int = 1
) -> list[tuple[int, int]]:
    """``(question, answer)`` token budgets summing (with the template) to ``text_tokens``."""
    style = _STYLES[name]
    body = max(_TURN + 2, text_tokens - _SYSTEM - _PER_IMAGE * num_images)
    per_turn = _TURN + style.q_mean + style.a_mean
    if name == "llava150k" and body > 2 * per_turn and rng.random() < 0.5:
        k = 1  # a detail / complex-reasoning sample: one long answer
    else:
        k = int(np.clip(round(body / per_turn), 1, style.max_turns))
    k = max(1, min(k, body // (_TURN + 2)))
    share = body / k - _TURN
    q = int(np.clip(round(share * style.q_mean / (style.q_mean + style.a_mean)), 1, round(3 * style.q_mean)))
    budgets = [(q, max(1, round(share) - q)) for _ in range(k)]
    used = sum(_TURN + a + b for a, b in budgets)
    last_q, last_a = budgets[-1]
    budgets[-1] = (last_q, max(1, last_a + body - used))
    return budgets


_PHOTO_REQUESTS = (
    "Please be specific.",
    "Mention the main objects and their colors.",
    "Describe the background as well.",
    "Keep the answer factual.",
    "Explain what makes the scene interesting.",
)
_PHOTO_CLOSERS = (
    "Thanks.",
    "Please.",
    "Look closely.",
    "Be specific.",
    "Use the picture.",
    "Answer from the image.",
)


def _qa_turns(budgets, next_pair, request_pool, closers, tok, context=()) -> list[tuple[str, str]]:
    """Fit each ``(question, answer)`` from ``next_pair(answer_budget)`` to its budgets; an answer's
    unused budget moves to its question, a question's to the next question. A long question is
    filled from ``request_pool`` then from ``context`` (an iterator of sentences, e.g. a document)."""
    turns, carry = [], 0
    for q_budget, a_budget in budgets:
        question, answer = next_pair(a_budget)
        q_budget = q_budget + a_budget - tok.count(answer) + carry
        q_text = _fill(itertools.chain(request_pool, context), q_budget, tok, question, closers)
        carry = q_budget - tok.count(q_text)
        turns.append((q_text, answer))
    if carry > 0:  # the last question takes what is left, word by word
        q_text, answer = turns[-1]
        budget = tok.count(q_text) + carry
        turns[-1] = (_fill(iter(_TOP_UP), budget, tok, q_text), answer)
    return turns


_TOP_UP = ("Please look at the image carefully and answer the question as well as you can.",)


def _photo_turns(photo: Photo, budgets, rng, tok, with_image: bool = True) -> list[tuple[str, str]]:
    short = itertools.cycle([(f"{q[0].upper()}{q[1:]}?", a) for q, a in photo.qa])
    about = (f"What can you tell me about {photo.subject}?", f"Write a few paragraphs on {photo.subject}.")
    about_image = ("Describe the image in detail.", "What is happening in this picture?")
    long_questions = itertools.cycle(
        (about_image[0], about[0], about_image[1], f"Why might someone take a photo of {photo.subject}?")
        if with_image
        else about
    )
    sentences = (photo.caption, *photo.facts)

    def next_pair(a_budget: int) -> tuple[str, str]:
        if a_budget <= 8:
            question, answer = next(short)
            return question, _phrase(_short_answers(answer), a_budget, tok)
        return next(long_questions), _fill(
            _cycle_sentences(sentences, rng), a_budget, tok, closers=sentences, words=False
        )

    context = _cycle_sentences(sentences, rng)
    return _qa_turns(budgets, next_pair, _PHOTO_REQUESTS, _PHOTO_CLOSERS, tok, context)


def _chart_turns(name: str, chart: Chart, budgets, rng, tok) -> list[tuple[str, str]]:
    if name.startswith("synthchartnet"):
        ((q_budget, a_budget),) = budgets
        question = _phrase(
            ["Table?", "Chart to table.", "Convert chart to table.", "Convert the chart to a table."],
            q_budget,
            tok,
        )
        return [(question, otsl_table(chart, a_budget + q_budget - tok.count(question), rng, tok))]
    qa = chart_qa(chart, rng)

    def next_pair(a_budget: int) -> tuple[str, str]:
        question, answer = next(qa)
        return question, _phrase(_short_answers(answer), a_budget, tok)

    return _qa_turns(budgets, next_pair, CHARTQA_SUFFIX, CHARTQA_CLOSERS, tok)


def _conversation(
    pairs: list[tuple[str, str]], num_images: int = 1, num_clips: int = 0, num_videos: int = 0
) -> list[tuple[str, str]]:
    turns = []
    lead = "<image>\n" * num_images + "<video>\n" * num_videos + "<audio>\n" * num_clips
    for i, (q, a) in enumerate(pairs):
        turns.append(("user", lead + q if i == 0 else q))
        turns.append(("assistant", a))
    return turns


def _write_clips(target: SampleMeta, audio_dir: Path, sound, rng: np.random.Generator) -> list[str] | str:
    """``target``'s audio clips as WAV files of exactly its mel frames (``entrain.data.synth_audio``):
    ``sound`` for a sound alone, else a spoken question (speech); their record paths."""
    from entrain.data.synth_audio import SOUNDS, write_sound

    speech = next(s for s in SOUNDS if s.kind == "speech")
    paths = []
    for k, frames in enumerate(target.audio):
        name = f"{target.id}.wav" if len(target.audio) == 1 else f"{target.id}-{k}.wav"
        write_sound(sound or speech, frames, rng, audio_dir / name)
        paths.append(f"audio/{name}")
    return paths[0] if len(paths) == 1 else paths


# --- public API -----------------------------------------------------------------------------------


@dataclass
class SynthResult:
    """What ``synth_dataset`` wrote: ``targets`` are the generator's samples (ids are record ids)."""

    path: Path
    targets: list[SampleMeta]
    text_token_diffs: list[int]
    capped: list[str] = dataclasses.field(default_factory=list)
    """Ids of the generator's samples cut to ``max_tokens`` (text shortened or images scaled down)."""
    name: str = ""
    """The generator (its canonical name)."""


MAX_SHRINKS = 32
"""Rounds of scaling a sample's images down (each to about the room left; two or three suffice)."""


def _scaled(images: tuple[tuple[int, int], ...], factor: float) -> tuple[tuple[int, int], ...]:
    return tuple((max(1, int(h * factor)), max(1, int(w * factor))) for h, w in images)


def cap_tokens(target: SampleMeta, max_tokens: int) -> SampleMeta:
    """``target`` within ``max_tokens`` LLM tokens (``entrain data check``'s limit): the room its audio
    clips (and videos) leave shared by text and images, text cut to what the images leave when they
    take at most half of it, else text to half and the images scaled down (a sample whose images at
    their smallest still exceed the room stays over, for data check to name)."""
    if target.llm_tokens <= max_tokens:
        return target
    room = max_tokens - target.audio_tokens - target.video_tokens  # what text and images share
    text = room - target.image_tokens if target.image_tokens <= room // 2 else None
    capped = target
    if text is None:
        text = min(target.text_tokens, room // 2)
        for _ in range(MAX_SHRINKS):
            if capped.image_tokens <= room - text:
                break
            shrink = math.sqrt(max(1, room - text) / capped.image_tokens) * 0.98
            capped = dataclasses.replace(capped, images=_scaled(capped.images, shrink))
    answer = target.answer_tokens if target.answer_tokens is None else min(target.answer_tokens, text)
    return dataclasses.replace(capped, text_tokens=text, answer_tokens=answer)


def _sample(
    name: str, target: SampleMeta, index: int, seed: int, images_dir: Path, tok: TextTokenizer
) -> tuple[dict, int]:
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5717, index]))
    if is_video_sample(name, target):
        return _video_sample(name, target, rng, images_dir, tok)
    budgets = _turn_budgets(name, target.text_tokens, rng, len(target.images) + len(target.audio))
    if target.audio and not target.images:  # a sound alone: questions about the sound
        from entrain.data.synth_audio import SOUNDS

        sound = SOUNDS[int(rng.integers(len(SOUNDS)))]
        images = []
        pairs = _photo_turns(sound, budgets, rng, tok, with_image=False)
    elif name in CHART_DATASETS:
        ((height, width),) = target.images
        rows = otsl_rows_for(budgets[0][1]) if name.startswith("synthchartnet") else int(rng.integers(4, 13))
        chart = draw_chart(rng, min(rows, 400))
        pairs = _chart_turns(name, chart, budgets, rng, tok)
        if name.startswith("synthchartnet"):  # draw exactly the rows the table holds
            kept = max(1, pairs[0][1].count("<nl>") - 1)
            chart = dataclasses.replace(chart, labels=chart.labels[:kept], values=chart.values[:kept])
        images = [images_dir / f"{target.id}.png"]
        render_chart(chart, height, width, images[0])
    else:
        photo = PHOTOS[int(rng.integers(len(PHOTOS)))]
        suffixes = [""] if len(target.images) == 1 else [f"-{k}" for k in range(len(target.images))]
        images = [images_dir / f"{target.id}{suffix}.jpg" for suffix in suffixes[: len(target.images)]]
        for (height, width), image in zip(target.images, images):
            write_photo(photo, height, width, image)
        pairs = _photo_turns(photo, budgets, rng, tok, with_image=bool(images))
    turns = _conversation(pairs, len(images), len(target.audio))
    diff = count_text_tokens(turns, tok) - target.text_tokens
    record: dict = {"id": target.id}
    if images:
        paths = [f"images/{image.name}" for image in images]
        record["image"] = paths[0] if len(paths) == 1 else paths
    if target.audio:
        record["audio"] = _write_clips(
            target, images_dir.parent / "audio", sound if not images else None, rng
        )
    record["conversations"] = [{"from": "human" if r == "user" else "gpt", "value": t} for r, t in turns]
    return record, diff


def _video_sample(
    name: str, target: SampleMeta, rng: np.random.Generator, images_dir: Path, tok: TextTokenizer
) -> tuple[dict, int]:
    """A video sample (``entrain.data.synth_video``): its T/2 drawn frames of one size as a clip of T
    frames in ``DIR/videos/``, one ``<video>`` (one visual item, as the generator counts its text);
    with an audio clip (``omni``) the clip as its audio track (a MOV) and ``use_audio_in_video``."""
    from entrain.data.synth_video import write_clip
    from entrain.data.video import AUDIO_IN_VIDEO_FIELD
    from entrain.data.video_records import expand_videos, video_text

    markers = 2 * len(target.audio)  # a track's <|audio_bos|> / <|audio_eos|> inside the video's markers
    budgets = _turn_budgets(name, target.text_tokens - markers, rng, 1)
    photo = PHOTOS[int(rng.integers(len(PHOTOS)))]
    (height, width), patches = target.images[0], len(target.images)
    track = None
    if target.audio:  # its audio track: a sound of the clip's mel frames, asked about beside the picture
        from entrain.data.synth_audio import SOUNDS, sound_samples

        sound = SOUNDS[int(rng.integers(len(SOUNDS)))]
        track = sound_samples(sound, target.audio[0], rng)
        photo = dataclasses.replace(
            photo,
            caption=f"{photo.caption} {sound.caption}",
            qa=photo.qa + sound.qa,
            facts=photo.facts + sound.facts,
        )
    path = images_dir.parent / "videos" / f"{target.id}.{'mp4' if track is None else 'mov'}"
    write_clip(photo, 2 * patches, height, width, path, rng, track)
    turns = _conversation(_photo_turns(photo, budgets, rng, tok), 0, num_videos=1)
    counted = expand_videos(turns, [video_text(tok, None, audio_tokens=None if track is None else 0)])
    diff = count_text_tokens(counted, tok) - target.text_tokens
    record = {"id": target.id, "video": f"videos/{path.name}"}
    if track is not None:
        record[AUDIO_IN_VIDEO_FIELD] = True
    record["conversations"] = [{"from": "human" if r == "user" else "gpt", "value": t} for r, t in turns]
    return record, diff


def synth_dataset(
    name: str,
    num_samples: int,
    out_dir: str | Path,
    seed: int = 0,
    *,
    tokenizer: TextTokenizer | None = None,
    vision: VisionTokenConfig = DEFAULT_VISION,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> SynthResult:
    """Write ``out_dir/data.json`` + ``out_dir/images/`` following generator ``name``, each sample
    capped to ``max_tokens`` LLM tokens so that ``entrain data check`` passes it (``cap_tokens``)."""
    name = canonical_name(name)
    if num_samples < 1:
        raise ConfigError(f"--num-samples must be >= 1, got {num_samples}")
    tok = tokenizer if tokenizer is not None else default_tokenizer()
    generated = generate_samples(name, num_samples, seed, vision=vision)
    targets = [cap_tokens(t, max_tokens) for t in generated]
    capped = [t.id for t, c in zip(generated, targets) if t is not c]
    out = Path(out_dir)
    images_dir = out / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    records, diffs = [], []
    for i, target in enumerate(targets):
        record, diff = _sample(name, target, i, seed, images_dir, tok)
        records.append(record)
        diffs.append(diff)
    path = out / "data.json"
    with open(path, "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n]\n")
    return SynthResult(path, targets, diffs, capped, name)
