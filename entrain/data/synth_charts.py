"""The charts ``entrain data synth`` draws for its chart datasets: a Matplotlib bar, line or pie
chart of seeded numbers (``draw_chart``, ``render_chart`` at an exact pixel size), questions answered
from those numbers (ChartQA style, ``chart_qa``) and the chart's table in OTSL (SynthChartNet style,
``otsl_table``)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from entrain.data.tokenizer import TextTokenizer

__all__ = [
    "CHARTQA_CLOSERS",
    "CHARTQA_SUFFIX",
    "Chart",
    "chart_qa",
    "draw_chart",
    "otsl_rows_for",
    "otsl_table",
    "render_chart",
]

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


def draw_chart(rng: np.random.Generator, num_rows: int) -> Chart:
    """A chart of ``num_rows`` seeded values: countries (bar or pie) or a run of years (line or bar)."""
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


def render_chart(chart: Chart, height: int, width: int, path: Path) -> None:
    """``chart`` drawn with Matplotlib into a PNG of exactly ``height x width`` pixels at ``path``."""
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


def chart_qa(chart: Chart, rng: np.random.Generator) -> Iterator[tuple[str, str]]:
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


CHARTQA_SUFFIX = (
    "Answer the question using a single word or phrase.",
    "Read the values from the chart.",
    "Give only the final answer.",
)
"""Requests a ChartQA question grows by to fill its token budget."""
CHARTQA_CLOSERS = (
    "Be precise.",
    "Thanks.",
    "Please.",
    "Use the chart.",
    "Answer briefly.",
    "Answer with a number or a label.",
)
"""Short sentences that close a ChartQA question within its budget."""


def otsl_table(chart: Chart, budget: int, rng: np.random.Generator, tok: TextTokenizer) -> str:
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


def otsl_rows_for(budget: int) -> int:
    """More rows than a two-column OTSL table of ``budget`` tokens can hold (rows cost >= 9 tokens)."""
    return max(2, math.ceil(budget / 9) + 2)
