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

Output: ``DIR/data.json`` (an array, one record per line), ``DIR/images/<id>.png|.jpg`` and, for
audio, ``DIR/audio/<id>.wav``.
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
from entrain.data.tokenizer import TextTokenizer, default_tokenizer

__all__ = ["CHART_DATASETS", "PHOTOS", "SynthResult", "synth_dataset"]

CHART_DATASETS = frozenset({"synthchartnet", "synthchartnet-fv", "chartqa"})


# --- photos shipped in wheels ---------------------------------------------------------------------


@dataclass(frozen=True)
class Photo:
    package: str  # "skimage" or "sklearn"
    file: str
    caption: str
    subject: str
    qa: tuple[tuple[str, str], ...]
    facts: tuple[str, ...]


PHOTOS: tuple[Photo, ...] = (
    Photo("skimage", "astronaut.png", "Color image of the astronaut Eileen Collins.", "the astronaut",
          (("what is the color of the spacesuit", "orange"), ("what is the astronaut resting her arm on", "helmet"),
           ("what flag hangs behind the astronaut", "american flag"), ("what model stands behind her", "space shuttle")),
          ("The astronaut Eileen Collins wears an orange spacesuit.", "An American flag hangs on the left.",
           "A model of the space shuttle stands behind her on the right.", "She rests her arm on a white helmet.",
           "She smiles at the camera.", "Mission patches are sewn onto the suit.")),
    Photo("skimage", "coffee.png", "Coffee cup.", "the coffee cup",
          (("what is on the saucer", "cup"), ("what color is the saucer", "red"), ("what lies next to the cup", "spoon"),
           ("what is the cup standing on", "wooden table")),
          ("A red cup of coffee sits on a matching red saucer.", "A small silver spoon lies on the saucer.",
           "The saucer stands on a wooden table.", "The coffee has a light brown crema on top.",
           "The photo is taken from above at an angle.")),
    Photo("skimage", "chelsea.png", "Chelsea the cat.", "the cat",
          (("what animal is shown", "cat"), ("what color are the eyes of the cat", "green"),
           ("what is the name of the cat", "chelsea"), ("what pattern does the fur have", "stripes")),
          ("Chelsea is a tabby cat with striped fur.", "The cat looks straight at the camera.",
           "Her eyes are green and wide open.", "Long white whiskers spread from her nose.",
           "The background is out of focus.")),
    Photo("skimage", "rocket.jpg", "Launch photo of DSCOVR on Falcon 9 by SpaceX.", "the rocket",
          (("what stands on the launch pad", "rocket"), ("what time of day is it", "night"),
           ("what surrounds the launch pad", "towers"), ("which company built the rocket", "spacex")),
          ("A Falcon 9 rocket stands on the launch pad at dusk.", "The rocket carries the DSCOVR satellite.",
           "Tall lightning towers surround the pad.", "Bright lights shine along the ground.",
           "The sky is deep blue.")),
    Photo("skimage", "motorcycle_left.png", "A red motorcycle parked in a workshop.", "the motorcycle",
          (("what vehicle is shown", "motorcycle"), ("what color is the motorcycle", "red"),
           ("where is the motorcycle parked", "workshop"), ("what stands behind the motorcycle", "shelves")),
          ("A red motorcycle is parked inside a workshop.", "Shelves with cardboard boxes stand behind it.",
           "The motorcycle has chrome exhaust pipes.", "The floor is grey concrete.",
           "A wooden bench is visible on the left.")),
    Photo("skimage", "hubble_deep_field.jpg", "Hubble eXtreme Deep Field.", "the deep field",
          (("what does the image show", "galaxies"), ("what color is the background", "black"),
           ("which telescope took the image", "hubble")),
          ("Thousands of distant galaxies glow against the black sky.", "The image was taken by the Hubble Space Telescope.",
           "Some galaxies look red and others blue.", "It is one of the deepest views of the universe.")),
    Photo("skimage", "retina.jpg", "Human retina.", "the retina",
          (("what part of the body is shown", "eye"), ("what color is the retina", "orange"),
           ("what branches across the retina", "blood vessels")),
          ("The photo shows the back of a human eye.", "Blood vessels branch out from the optic disc.",
           "The optic disc is the bright spot on the left.", "The fovea is the darker spot in the middle.",
           "A black border surrounds the round field of view.")),
    Photo("skimage", "ihc.png", "Immunohistochemical (IHC) staining with hematoxylin counterstaining.", "the tissue",
          (("what kind of image is this", "microscopy"), ("what color is the stain", "brown"),
           ("what colors the nuclei blue", "hematoxylin")),
          ("The tissue is stained brown by immunohistochemistry.", "Hematoxylin counterstaining colors the nuclei blue.",
           "Several gland-like structures fill the view.", "The image was taken through a microscope.")),
    Photo("sklearn", "china.jpg", "A Chinese pagoda on a hill above a lake.", "the pagoda",
          (("what building is shown", "pagoda"), ("what lies behind the pagoda", "lake"),
           ("what grows around the building", "trees")),
          ("A tall Chinese pagoda with red pillars stands on a hill.", "Trees grow around the building.",
           "A lake stretches out in the background.", "The sky is pale and hazy.")),
    Photo("sklearn", "flower.jpg", "An orange dahlia flower.", "the flower",
          (("what is shown in the picture", "flower"), ("what color is the flower", "orange"),
           ("what color are the leaves", "green")),
          ("An orange dahlia blooms in front of dark green leaves.", "Its petals are arranged in tight rings.",
           "A second flower is visible at the bottom.", "The background is blurred.")),
)  # fmt: skip


def _photo_path(photo: Photo) -> Path:
    try:
        if photo.package == "skimage":
            import skimage

            return Path(skimage.__file__).parent / "data" / photo.file
        import sklearn

        return Path(sklearn.__file__).parent / "datasets" / "images" / photo.file
    except ModuleNotFoundError:
        raise ConfigError(
            "synthesising photo datasets needs the packages 'scikit-image' and 'scikit-learn' "
            "(they ship the photos): pip install scikit-image scikit-learn"
        ) from None


def _cover(im, width: int, height: int):
    """``im`` scaled to cover ``width x height`` and centre-cropped to exactly that size."""
    from PIL import Image

    scale = max(width / im.width, height / im.height)
    w, h = max(width, round(im.width * scale)), max(height, round(im.height * scale))
    im = im.resize((w, h), Image.Resampling.BICUBIC)
    left, top = (w - width) // 2, (h - height) // 2
    return im.crop((left, top, left + width, top + height))


def _write_photo(photo: Photo, height: int, width: int, path: Path) -> None:
    from PIL import Image

    with Image.open(_photo_path(photo)) as src:
        _cover(src.convert("RGB"), width, height).save(path, quality=90)


# --- charts ---------------------------------------------------------------------------------------

_TOPICS = (
    ("Annual revenue", "billion U.S. dollars"),
    ("Share of respondents", "percent"),
    ("Number of visitors", "millions"),
    ("Average temperature", "degrees Celsius"),
    ("Unemployment rate", "percent"),
    ("Smartphone shipments", "million units"),
    ("Household savings", "thousand euros"),
)
_COUNTRIES = (
    "United States", "China", "Germany", "Japan", "India", "Brazil", "France", "Canada", "Italy",
    "Mexico", "Spain", "Kenya", "Chile", "Norway", "Poland", "Egypt", "Vietnam", "Peru",
)  # fmt: skip


@dataclass(frozen=True)
class Chart:
    title: str
    unit: str
    kind: str  # "bar", "line" or "pie"
    labels: tuple[str, ...]
    values: tuple[float, ...]


def _chart(rng: np.random.Generator, num_rows: int) -> Chart:
    title, unit = _TOPICS[int(rng.integers(len(_TOPICS)))]
    if num_rows <= len(_COUNTRIES) and rng.random() < 0.4:
        labels = tuple(str(c) for c in rng.choice(_COUNTRIES, num_rows, replace=False))
        kind = "pie" if num_rows <= 6 and rng.random() < 0.4 else "bar"
    else:
        start = int(rng.integers(1950, 2024 - min(num_rows, 70)))
        labels = tuple(str(start + i) for i in range(num_rows))
        kind = "line" if num_rows > 12 or rng.random() < 0.5 else "bar"
    level = float(rng.uniform(5, 90))
    steps = rng.normal(0, level * 0.08, num_rows)
    values = tuple(round(max(0.1, level + float(s)), 1) for s in np.cumsum(steps))
    return Chart(title, unit, kind, labels, values)


def _render_chart(chart: Chart, height: int, width: int, path: Path) -> None:
    from matplotlib.figure import Figure

    dpi = 100
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    ax = fig.add_subplot()
    small = 7 if min(width, height) < 400 else 9
    x = np.arange(len(chart.values))
    if chart.kind == "pie":
        ax.pie(chart.values, labels=chart.labels, autopct="%1.1f%%", textprops={"fontsize": small})
    elif chart.kind == "line":
        ax.plot(x, chart.values, marker="o" if len(x) <= 30 else None, color="#1f77b4")
    else:
        bars = ax.bar(x, chart.values, color="#2f6db5")
        if len(x) <= 12:
            ax.bar_label(bars, fmt="%.1f", fontsize=small)
    if chart.kind != "pie":
        step = max(1, math.ceil(len(x) / 10))
        ax.set_xticks(x[::step], chart.labels[::step], rotation=45 if len(x) > 6 else 0, fontsize=small)
        ax.set_ylabel(chart.unit, fontsize=small)
        ax.tick_params(axis="y", labelsize=small)
    ax.set_title(chart.title, fontsize=small + 1)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    _exact_size(path, width, height)


def _exact_size(path: Path, width: int, height: int) -> None:
    from PIL import Image

    with Image.open(path) as im:
        if im.size == (width, height) and im.mode == "RGB":
            return
        fixed = im.convert("RGB").resize((width, height), Image.Resampling.BICUBIC)
    fixed.save(path)


def _chart_qa(chart: Chart, rng: np.random.Generator) -> Iterator[tuple[str, str]]:
    """Endless questions about ``chart`` with answers computed from its numbers."""
    topic = chart.title.lower()
    vals = np.array(chart.values)
    while True:
        i, j = (int(k) for k in rng.choice(len(vals), 2, replace=len(vals) < 2))
        yield from (
            (f"What is the {topic} in {chart.labels[i]}?", f"{vals[i]:g}"),
            (f"Which label has the highest {topic}?", chart.labels[int(vals.argmax())]),
            (
                "What is the difference between the highest and the lowest value?",
                f"{vals.max() - vals.min():.1f}",
            ),
            ("How many labels are shown in the chart?", str(len(vals))),
            (
                f"Is the value in {chart.labels[i]} greater than in {chart.labels[j]}?",
                "Yes" if vals[i] > vals[j] else "No",
            ),
            (f"What is the average {topic} across all labels?", f"{vals.mean():.2f}"),
        )


_CHARTQA_SUFFIX = (
    "Answer the question using a single word or phrase.",
    "Read the values from the chart.",
    "Give only the final answer.",
)
_CHARTQA_CLOSERS = (
    "Be precise.",
    "Thanks.",
    "Please.",
    "Use the chart.",
    "Answer briefly.",
    "Answer with a number or a label.",
)


def _otsl(chart: Chart, budget: int, rng: np.random.Generator, tok: TextTokenizer) -> str:
    """The chart's table in OTSL (SynthChartNet's target format), as many rows as fit ``budget``
    tokens; the last value gets extra decimal digits (one token each) to reach ``budget`` exactly."""
    header = f"<fcel>Label<fcel>{chart.title} ({chart.unit})<nl>"
    rows = [f"<fcel>{lab}<fcel>{v:g}<nl>" for lab, v in zip(chart.labels, chart.values)]
    text, used = header, tok.count(header)
    for row in rows:
        n = tok.count(row)
        if used + n > budget:
            break
        text, used = text + row, used + n
    slack = budget - tok.count(text)
    if slack > 0 and text.endswith("<nl>"):
        last = text[: -len("<nl>")]
        digits = "".join(str(int(d)) for d in rng.integers(0, 10, slack))
        extra = digits if "." in last.rsplit("<fcel>", 1)[-1] else "." + digits[:-1]
        text = last + extra + "<nl>"
    return text


def _otsl_rows_for(budget: int) -> int:
    """More rows than a two-column OTSL table of ``budget`` tokens can hold (rows cost >= 9 tokens)."""
    return max(2, math.ceil(budget / 9) + 2)


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
        return [(question, _otsl(chart, a_budget + q_budget - tok.count(question), rng, tok))]
    qa = _chart_qa(chart, rng)

    def next_pair(a_budget: int) -> tuple[str, str]:
        question, answer = next(qa)
        return question, _phrase(_short_answers(answer), a_budget, tok)

    return _qa_turns(budgets, next_pair, _CHARTQA_SUFFIX, _CHARTQA_CLOSERS, tok)


def _conversation(
    pairs: list[tuple[str, str]], num_images: int = 1, num_clips: int = 0
) -> list[tuple[str, str]]:
    turns = []
    for i, (q, a) in enumerate(pairs):
        turns.append(("user", "<image>\n" * num_images + "<audio>\n" * num_clips + q if i == 0 else q))
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


MAX_SHRINKS = 32
"""Rounds of scaling a sample's images down (each to about the room left; two or three suffice)."""


def _scaled(images: tuple[tuple[int, int], ...], factor: float) -> tuple[tuple[int, int], ...]:
    return tuple((max(1, int(h * factor)), max(1, int(w * factor))) for h, w in images)


def cap_tokens(target: SampleMeta, max_tokens: int) -> SampleMeta:
    """``target`` within ``max_tokens`` LLM tokens (``entrain data check``'s limit): text cut to what
    the images leave when they take at most half, else text to half and the images scaled down (a
    sample whose images at their smallest still exceed the room stays over, for data check to name)."""
    if target.llm_tokens <= max_tokens:
        return target
    text = max_tokens - target.image_tokens if target.image_tokens <= max_tokens // 2 else None
    capped = target
    if text is None:
        text = min(target.text_tokens, max_tokens // 2)
        for _ in range(MAX_SHRINKS):
            if capped.image_tokens <= max_tokens - text:
                break
            shrink = math.sqrt((max_tokens - text) / capped.image_tokens) * 0.98
            capped = dataclasses.replace(capped, images=_scaled(capped.images, shrink))
    answer = target.answer_tokens if target.answer_tokens is None else min(target.answer_tokens, text)
    return dataclasses.replace(capped, text_tokens=text, answer_tokens=answer)


def _sample(
    name: str, target: SampleMeta, index: int, seed: int, images_dir: Path, tok: TextTokenizer
) -> tuple[dict, int]:
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5717, index]))
    budgets = _turn_budgets(name, target.text_tokens, rng, len(target.images) + len(target.audio))
    if target.audio and not target.images:  # a sound alone: questions about the sound
        from entrain.data.synth_audio import SOUNDS

        sound = SOUNDS[int(rng.integers(len(SOUNDS)))]
        images = []
        pairs = _photo_turns(sound, budgets, rng, tok, with_image=False)
    elif name in CHART_DATASETS:
        ((height, width),) = target.images
        rows = _otsl_rows_for(budgets[0][1]) if name.startswith("synthchartnet") else int(rng.integers(4, 13))
        chart = _chart(rng, min(rows, 400))
        pairs = _chart_turns(name, chart, budgets, rng, tok)
        if name.startswith("synthchartnet"):  # draw exactly the rows the table holds
            kept = max(1, pairs[0][1].count("<nl>") - 1)
            chart = dataclasses.replace(chart, labels=chart.labels[:kept], values=chart.values[:kept])
        images = [images_dir / f"{target.id}.png"]
        _render_chart(chart, height, width, images[0])
    else:
        photo = PHOTOS[int(rng.integers(len(PHOTOS)))]
        suffixes = [""] if len(target.images) == 1 else [f"-{k}" for k in range(len(target.images))]
        images = [images_dir / f"{target.id}{suffix}.jpg" for suffix in suffixes[: len(target.images)]]
        for (height, width), image in zip(target.images, images):
            _write_photo(photo, height, width, image)
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
    return SynthResult(path, targets, diffs, capped)
