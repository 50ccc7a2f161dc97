"""Before any process starts: does a checkpoint's tokenizer write the model's vision tokens?

A checkpoint folder holds two statements of the vision token ids: the model config's (``image_token_id``,
``vision_start_token_id``, ...; what the model looks for, ``ModelFamily.token_ids``) and the tokenizer's
(what its chat template writes for ``<image>``). When they disagree every real sample is refused at
render time, on the ranks, after launch; ``check_vision_tokens`` renders one probe conversation through
the family's own ``format_chat`` and refuses the mismatch up front, naming the ids on both sides.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from entrain.core.errors import ConfigError

__all__ = ["check_vision_tokens", "PROBE_TURNS", "PROBE_ROWS"]

PROBE_TURNS = (("user", "<image>\nWhat does the chart show?"), ("assistant", "Sales by year."))
"""One user turn with one image, one assistant answer (``Record.turns``' form)."""
PROBE_ROWS = 7
"""The probe image's feature rows: placeholder tokens the chat must hold for it."""
_ONCE_PER_IMAGE = ("image_start", "image_end")


def _expected(ids: dict[str, int]) -> dict[str, tuple[int, int]]:
    """``{role: (model token id, occurrences one probe image needs)}`` of the roles the model uses."""
    want = {"image": (ids.get("image", -1), PROBE_ROWS)}
    want.update({role: (ids.get(role, -1), 1) for role in _ONCE_PER_IMAGE})
    return {role: (tid, n) for role, (tid, n) in want.items() if tid is not None and tid >= 0}


def check_vision_tokens(family: Any, cfg: Any, tokenizer: Any) -> None:
    """ConfigError unless ``tokenizer``, through ``family``'s chat template, writes the model's image
    token once per feature row and its start / end markers once per image (``family.token_ids``).
    ``tokenizer`` None (a preset: the built-in tokenizer, remapped by ``map_token_id``): nothing to check."""
    if tokenizer is None:
        return
    ids, _ = family.format_chat(cfg, PROBE_TURNS, [PROBE_ROWS], tokenizer)
    counts = Counter(int(i) for i in ids)
    wrong = [
        f"{role} token id {tid} written {counts[tid]} time(s) where one image of {PROBE_ROWS} rows needs {n}"
        for role, (tid, n) in _expected(family.token_ids(cfg)).items()
        if counts[tid] != n
    ]
    if not wrong:
        return
    pad = [i for i, c in counts.items() if c == PROBE_ROWS]
    wrote = f"; it writes the image as id {pad[0]}" if len(pad) == 1 else ""
    folder = getattr(cfg, "folder", None)
    where = f"{folder}/config.json" if folder else "the model config"
    name = getattr(tokenizer, "name", None) or getattr(tokenizer, "name_or_path", "the tokenizer")
    raise ConfigError(
        f"{where}: the tokenizer {name} does not write the model's vision tokens ({'; '.join(wrong)}{wrote}): "
        "the config's token ids and the tokenizer's must be the same tokens; fix one of them, or pass the "
        "checkpoint's own tokenizer with --tokenizer DIR"
    )
