"""``entrain data check PATH``: validate a LLaVA JSON/JSONL or FineVision Parquet dataset
(docs/contract.md ``entrain data``). Exit 0 iff no finding has severity ``error``, else 1 (``warning``
and ``converted`` findings are not bad)."""

from __future__ import annotations

import argparse

from entrain.cli.common import (
    add_model_source_args,
    add_shared_flags,
    emit_json,
    model_source_of,
    names_a_model,
    vision_limits,
)
from entrain.core.workload.samples import ImageTokenRule
from entrain.data.check import DEFAULT_MAX_TOKENS, check_dataset
from entrain.data.processing import ProcessImages
from entrain.data.tokenizer import load_tokenizer
from entrain.models.families.registry import DEFAULT_FAMILY, family_of_source, get_family
from entrain.models.families.token_check import check_vision_tokens


def add_check_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``check`` on the ``entrain data`` sub-subcommands."""
    p = subparsers.add_parser("check", help="validate a LLaVA JSON/JSONL or Parquet dataset and its images")
    p.add_argument(
        "path",
        metavar="PATH",
        help="LLaVA JSON (array), JSONL or Parquet file, or a folder of Parquet or WebDataset .tar shards or of a "
        "Hugging Face save_to_disk dataset (shards checked in parallel processes)",
    )
    add_shared_flags(p, "data check", "image_root")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="max LLM tokens per sample")
    p.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="local tokenizer folder or tokenizer.json (default: offline Qwen2)")  # fmt: skip
    p.add_argument("--no-processor", action="store_true",
                   help="decode images but skip running the model family's image processor on them")  # fmt: skip
    add_shared_flags(p, "data check", "confine_images", "model", "json")
    add_model_source_args(p)
    p.set_defaults(func=run_check)


def image_processing(args: argparse.Namespace, rule: ImageTokenRule) -> ProcessImages | None:
    """The model family's image processor for ``rule`` (``ModelFamily.image_processing``; the default
    family's without ``--model``); None with ``--no-processor``."""
    if args.no_processor:
        return None
    family = family_of_source(model_source_of(args)) if names_a_model(args) else get_family(DEFAULT_FAMILY)
    return family.image_processing(rule)


def _tokenizer(args: argparse.Namespace):
    """``--tokenizer``; else a ``--model-path`` checkpoint's own (its family's runtime tokenizer, the
    one ``train`` uses); else the built-in Qwen2 tokenizer. With ``--model-path`` the tokenizer must
    write the checkpoint's vision tokens (``check_vision_tokens``, as ``train`` checks before launch)."""
    if args.model_path is None:
        return load_tokenizer(args.tokenizer)
    source = model_source_of(args)
    family = family_of_source(source)
    cfg, tok = family.runtime_config(source)  # None: train remaps the built-in one's ids (map_token_id)
    check_vision_tokens(family, cfg, tok)
    return tok if tok is not None else load_tokenizer(None)


def run_check(args: argparse.Namespace) -> int:
    vision = vision_limits(args)
    report = check_dataset(
        args.path,
        image_root=args.image_root,
        tokenizer=_tokenizer(args),
        max_tokens=args.max_tokens,
        vision=vision,
        processor=image_processing(args, vision),
        confine_images=args.confine_images,
    )
    if args.json:
        emit_json(report.to_json())
    else:
        print(report.format_text())
    return 0 if report.ok else 1
