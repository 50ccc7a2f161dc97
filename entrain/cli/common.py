"""Flags shared by the planner/simulator commands (docs/contract.md, "Flags every planning command shares")
and their resolution into samples, per-sample work and a cost model. Every subcommand uses these helpers, so
flag names and meanings are defined once."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from entrain.cli.argtypes import POSITIVE
from entrain.config import ModelConfig, RunConfig, parse_ramp
from entrain.core.costs.costmodel import CostModel, precision_mismatch
from entrain.core.costs.memory import MEMORY_CHECK_ITERATIONS
from entrain.core.costs.presets import HARDWARE_PRESETS
from entrain.core.errors import ConfigError
from entrain.core.model.architectures import PRECISIONS
from entrain.core.model.shape import ModelShape
from entrain.core.planning.setups import DECISION_MARGIN, ENTRAIN_LAYOUTS, LAYOUT_MARGIN
from entrain.core.schedules.common import ASSIGNMENTS
from entrain.core.workers import default_jobs
from entrain.core.workload.samples import DEFAULT_VISION, ImageTokenRule, pixel_limits
from entrain.core.workload.work import SampleWork
from entrain.models.families.base import ModelSource
from entrain.models.families.registry import family_of_source, preset_names


class _Presets:
    """``--model``'s choices: every registered family's presets, read when a parser checks a value or
    prints its help (so a family registered after import, e.g. by a test, is accepted)."""

    def __contains__(self, name: object) -> bool:
        return name in preset_names()

    def __iter__(self):
        return iter(preset_names())

    def __len__(self) -> int:
        return len(preset_names())

    def __getitem__(self, i):
        return preset_names()[i]


MODEL_PRESETS = _Presets()


@dataclass(frozen=True)
class FlagSpec:
    """One flag shared by several commands: its names, help and argparse options (default, choices ...),
    defined once here; ``add_shared_flags`` adds it to each command that takes it."""

    names: tuple[str, ...]
    help: str
    options: dict

    @property
    def dest(self) -> str:
        return self.options.get("dest") or self.names[0].lstrip("-").replace("-", "_")


def _flag(*names: str, help: str, **options) -> FlagSpec:
    return FlagSpec(names, help, options)


SHARED_FLAGS: dict[str, FlagSpec] = {
    spec.dest: spec
    for spec in (
        _flag("--dataset", "--work-file", dest="dataset", default="synthchartnet",
              help="built-in generator name, workload JSONL, raw-work JSONL (not entrain train or data stats), LLaVA "
                   "JSON/JSONL/Parquet dataset, or a folder of Parquet or WebDataset .tar shards or of a Hugging "
                   "Face save_to_disk dataset"),
        _flag("--image-root", default=None,
              help="folder that LLaVA image paths are relative to (default: the dataset file's folder)"),
        _flag("--model", default="qwen25vl-llama3-1b", choices=MODEL_PRESETS,
              help="model preset to price (entrain train: to build and train; entrain profile: to time; "
                   "entrain data check: whose family's rules count the image tokens, default Qwen2.5-VL's)"),
        _flag("--hardware", default=None, choices=HARDWARE_PRESETS,
              help="cost-model preset to plan with (default: cpu-tiny for tiny, a40-paper otherwise)"),
        _flag("--profile", default=None, metavar="FILE",
              help="measured profile (entrain profile) replacing the preset"),
        _flag("--gpus", type=int, default=64, help="GPUs to plan for"),
        _flag("--dp", type=int, default=None,
              help="data-parallel replicas (default: chosen by the planner; entrain train with fixed stages: "
                   "processes / stages)"),
        _flag("--tp", type=int, default=1,
              help="tensor-parallel degree of both components (entrain train: inside every stage, each "
                   "pipeline rank becomes --tp processes)"),
        _flag("--ep", type=POSITIVE, default=None, metavar="N",
              help="expert parallelism: shard each mixture-of-experts layer's experts over N ranks of each "
                   "stage's data-parallel group, tokens dispatched and combined by all-to-all (N divides --dp and "
                   "the experts; entrain train: default 1; entrain plan / simulate: default searched with the "
                   "other degrees on a model with experts, 1 otherwise)"),
        _flag("--cp", type=int, default=1,
              help="context parallel degree (entrain plan: 0 = search {1, 2}; the training runtime supports 1)"),
        _flag("--global-batch", type=int, default=512,
              help="samples per iteration (one optimiser step) over all replicas (entrain train --plan sets it)"),
        _flag("--microbatch-size", type=int, default=4,
              help="samples per microbatch (entrain train --plan sets it)"),
        _flag("--seed", type=int, default=0,
              help="seed of the samples drawn, of the planner's draws and (entrain train, entrain profile) of "
                   "the weights' init"),
        _flag("--iterations", type=int, default=MEMORY_CHECK_ITERATIONS, help="global batches (iterations) to draw"),
        _flag("--shuffle", action="store_true", help="shuffle a file's samples with the seed first"),
        _flag("--freeze", default="", help="comma list of frozen parts: encoder, vit (tower without merger), llm"),
        _flag("--json", action="store_true", help="print one JSON object on stdout"),
        _flag("--precision", choices=PRECISIONS, default=None,
              help="compute precision, as entrain train computes (entrain profile: times the layers so): bf16 "
                   "runs every forward under bf16 autocast over fp32 weights, with fp32 master weights and "
                   "AdamW state (default: bf16 on CUDA, fp32 on CPU)"),
        _flag("--confine-images", action="store_true",
              help="an image path resolving outside the dataset root is an error (entrain train: makes its "
                   "record bad) (default: a warning)"),
        _flag("--jobs", type=int, default=default_jobs(),
              help="worker processes; the results are the same for any number (bench paper: the cases run in "
                   "them; entrain plan: reading and the simulations of the decisions and the memory check, from "
                   "a global batch of 2048) (default: 2 or the CPU count if lower)"),
        _flag("--overwrite", action="store_true",
              help="replace what an existing --out holds (without it such a folder is refused; entrain train: "
                   "or --resume; entrain export: never the run itself or the base checkpoint it was trained "
                   "from)"),
    )
}  # fmt: skip
"""Every flag that two or more ``entrain`` commands share, with one help and one default (a command's own
default only in ``COMMAND_DEFAULTS``, with its reason; a flag of the same name defined per command only
in ``COMMAND_MEANINGS`` / ``COMMAND_OWN``, with its reason)."""

COMMAND_DEFAULTS: dict[str, dict[str, tuple[object, str]]] = {
    "train": {
        "dataset": ("skewed", "train runs for real, on CPU by default: the fixed CPU benchmark set"),
        "model": ("tiny", "train builds the model: the preset a CPU trains in seconds"),
        "global_batch": (16, "a batch the tiny model trains on a CPU in seconds, not the paper's 512"),
        "microbatch_size": (2, "K = 8 microbatches of the CPU-sized batch on one replica"),
    },
    "profile": {"model": ("tiny", "profile runs the model for real: the preset a CPU times in seconds")},
    "data check": {
        "model": (None, "no model: Qwen2.5-VL's image rules count the tokens (vision_limits without --model)")
    },
}
"""``{command: {dest: (default, why)}}``: a shared flag whose default differs in one command, and why."""

COMMAND_MEANINGS: dict[str, str] = {
    "out": "a different thing per command: plan's output file (plan.json), train's run folder, profile's "
    "JSON, export's folder, bench paper's report, plot-trace's image, data synth's dataset folder",
    "device": "profile times on one device (cpu or cuda, default cuda when there is one); train places its "
    "processes (auto, cuda or cpu: NCCL or gloo, default auto or $ENTRAIN_DEVICE)",
    "tokenizer": "train: the AutoTokenizer of a stock --llm-model (default its folder's); data check: the one "
    "counting text tokens (default the offline Qwen2 one)",
    "step": "export: the step whose checkpoint is exported (default the newest); plot-trace: the traced step "
    "drawn (default the last traced one)",
    "num_samples": "data stats: samples drawn or a file's first N (optional); data synth: the samples written "
    "(required)",
    "system": "plan carries one system's layout; train takes one system or a comma list trained in turn",
    "systems": "assign's default is one system per distinct batcher (the others repeat an assignment)",
}
"""Flags of the same name that are defined per command on purpose, and why."""

COMMAND_OWN: dict[str, dict[str, str]] = {
    "data synth": {
        "dataset": "names only a built-in generator whose samples are written out (required, no --work-file "
        "alias), not a dataset to read"
    },
}
"""``{command: {dest: why}}``: one command's own flag named like a shared one, and why it is its own."""


def add_shared_flags(p: argparse.ArgumentParser, command: str, *dests: str) -> None:
    """Add the ``SHARED_FLAGS`` named by ``dests`` to ``command``'s parser ``p``, in that order."""
    own = COMMAND_DEFAULTS.get(command, {})
    for dest in dests:
        spec = SHARED_FLAGS[dest]
        options = {**spec.options, **({"default": own[dest][0]} if dest in own else {})}
        p.add_argument(*spec.names, help=spec.help, **options)


def add_common_args(p: argparse.ArgumentParser, command: str, *, systems_default: str | None = None) -> None:
    """docs/contract.md's common flags of the planner/simulator commands (``command``: the parser's name)."""
    add_shared_flags(p, command, "dataset", "model")
    add_model_source_args(p)
    add_pixel_args(p)
    add_shared_flags(p, command, "hardware", "profile")
    add_attention_arg(p)
    add_shared_flags(p, command, "gpus", "dp", "tp", "global_batch", "microbatch_size", "seed", "iterations")
    add_shared_flags(p, command, "shuffle", "image_root")
    if systems_default is not None:
        p.add_argument("--systems", default=systems_default, help="comma list of systems")
    add_shared_flags(p, command, "json")


def add_model_source_args(p: argparse.ArgumentParser) -> None:
    """``--vision-model DIR`` / ``--llm-model DIR``: stock Hugging Face folders replacing ``--model``
    (shapes from their config.json; ``entrain.models.families.composition.spec``);
    ``--model-path DIR``: one whole checkpoint of a registered family (``family_of_folder``)."""
    p.add_argument(
        "--model-path",
        default=None,
        metavar="DIR",
        help="one whole Hugging Face vision-language checkpoint folder, replacing --model / --vision-model / "
        f"--llm-model; its config.json picks the family (`entrain data families` lists them): {_families_help()}",
    )
    p.add_argument(
        "--vision-model",
        default=None,
        metavar="DIR",
        help="a Qwen2-VL / Qwen2.5-VL checkpoint folder (whole model or vision-only): its vision tower "
        "and merger; with --llm-model, replaces --model",
    )
    p.add_argument(
        "--llm-model",
        default=None,
        metavar="DIR",
        help="a causal-LM checkpoint folder: a decoder-only transformer with RMSNorm, GQA attention and a gated "
        "MLP (its config.json has num_hidden_layers, hidden_size, intermediate_size, num_attention_heads, "
        "vocab_size)",
    )


def add_pixel_args(p: argparse.ArgumentParser) -> None:
    """``--min-pixels`` / ``--max-pixels``: the image processor's limits (Qwen's ``smart_resize``)."""
    p.add_argument(
        "--min-pixels",
        type=int,
        default=None,
        help=f"smallest resized image area (default {DEFAULT_VISION.min_pixels})",
    )
    p.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help=f"largest resized image area (default {DEFAULT_VISION.max_pixels})",
    )


def vision_limits(args: argparse.Namespace) -> ImageTokenRule:
    """The model family's image rule (``ModelFamily.image_rule``) within ``--min-pixels`` /
    ``--max-pixels`` (the family's defaults otherwise; Qwen's for a command without ``--model``)."""
    lo, hi = getattr(args, "min_pixels", None), getattr(args, "max_pixels", None)
    if not names_a_model(args):
        return pixel_limits(lo, hi)
    source = model_source_of(args)
    family = family_of_source(source)
    return family.image_rule(family.shape(source), lo, hi)


def _families_help() -> str:
    from entrain.models.families.registry import families

    return "; ".join(f"{f.name} ({f.description})" for f in families())


def names_a_model(args: argparse.Namespace) -> bool:
    """Whether the command line names a model: ``--model``, ``--model-path`` or the stock folders."""
    return any(
        getattr(args, k, None) is not None for k in ("model", "model_path", "vision_model", "llm_model")
    )


def model_source_of(args: argparse.Namespace) -> ModelSource:
    """The ``ModelSource`` of ``--model`` / ``--vision-model`` + ``--llm-model`` / ``--model-path``."""
    if getattr(args, "model_path", None) and (
        getattr(args, "vision_model", None) or getattr(args, "llm_model", None)
    ):
        raise ConfigError("--model-path is a whole checkpoint: pass it without --vision-model / --llm-model")
    return ModelSource(
        preset=args.model,
        vision_model=getattr(args, "vision_model", None),
        llm_model=getattr(args, "llm_model", None),
        model_path=getattr(args, "model_path", None),
        tokenizer=getattr(args, "tokenizer", None),
    )


def model_arch_of(args: argparse.Namespace) -> ModelShape:
    """The model's shape from its family (``ModelFamily.shape``): the preset ``--model``'s, or the
    checkpoint folders' config.json."""
    source = model_source_of(args)
    return family_of_source(source).shape(source)


def model_label(args: argparse.Namespace) -> str:
    """``--model``'s name, or the stock model's (``hf:VISION+LLM``) for reports."""
    return model_arch_of(args).name


def warn_profile_precision(
    command: str, path: str | None, cost: CostModel, precision: str, run: str
) -> str | None:
    """Print (one stderr line) and return the warning when the ``--profile`` at ``path`` was timed in
    another precision than ``run`` computes in (``precision``); None when it was not."""
    line = precision_mismatch(path, cost, precision, run) if path else None
    if line:
        print(f"entrain {command}: warning: {line}", file=sys.stderr, flush=True)
    return line


def add_attention_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--attention",
        default=None,
        metavar="IMPL",
        help="attention the preset is priced with: flash, eager, or encoder=IMPL,llm=IMPL "
        "(default: the hardware preset's: encoder=eager,llm=flash for a40-fig4, flash otherwise)",
    )


def add_entrain_extension_args(p: argparse.ArgumentParser) -> None:
    """Entrain's own extensions beyond the paper (``plan``, ``simulate`` and ``train`` share them and
    their defaults: each on where the cost model predicts it helps)."""
    p.add_argument("--ramp-microbatches", type=_ramp, default="auto",
                   help="Entrain extension (not in the paper): cut the first and last N microbatches into 2 "
                        "sub-microbatches so the pipeline fills and drains faster; 'auto' (default): on only where "
                        "it simulates faster by more than --decision-margin, then kept per replica where the "
                        "cost model predicts a shorter makespan; 0 = off")  # fmt: skip
    p.add_argument("--entrain-layout", choices=ENTRAIN_LAYOUTS, default="auto",
                   help="Entrain extension (not in the paper): 'shared' lets the rank where encoder and LLM "
                        "meet hold the last encoder and the first LLM stage (one min-max partition of the "
                        f"concatenated layers); 'auto' (default) uses it only when it simulates more than {LAYOUT_MARGIN * 100:g} %% "
                        "faster than the disjoint stages on the planner's draws; "
                        "'disjoint' = the paper's E.PP:L.PP stages")  # fmt: skip
    p.add_argument("--split-weight-grads", choices=("auto", "on", "off"), default="auto",
                   help="Entrain extension (not in the paper): run every backward as input gradients (sent "
                        "upstream at once) then weight gradients; 'auto' (default): only where it simulates "
                        "faster by more than --decision-margin (a split costs its own extra where the cost "
                        "model says so, e.g. cpu-tiny)")  # fmt: skip
    p.add_argument("--assignment", choices=ASSIGNMENTS, default="auto",
                   help="Entrain's per-iteration assignment: 'paper' (Algorithm 3, stratified on encoder work), "
                        "'two-resource' (extension: balances encoder and LLM work together, then deferral), "
                        "'auto' (default: the paper's, the two-resource or the per-iteration choice, whichever "
                        "simulates faster by more than --decision-margin; per-iteration: per replica, whichever "
                        "the cost model predicts faster)")  # fmt: skip
    p.add_argument("--decision-margin", dest="decision_margin_pct", type=float, default=None, metavar="PCT",
                   help="every automatic choice (layout, ramp, assignment, DP re-split, split backward, "
                        "sub-microbatches, "
                        "recompute, ties among Algorithm 2 configurations) departs from the paper's default "
                        "only when a candidate simulates more than PCT %% faster on the planner's draws "
                        f"(default {DECISION_MARGIN * 100:g}, from the simulator's measured error on such "
                        "decisions, docs/planner.md)")  # fmt: skip
    p.add_argument(
        "--paper-entrain",
        action="store_true",
        help="Entrain exactly as the paper: same as --ramp-microbatches 0 --entrain-layout disjoint "
        "--split-weight-grads off --assignment paper",
    )


def apply_paper_entrain(args: argparse.Namespace) -> None:
    """``--paper-entrain``: every extension off."""
    if args.paper_entrain:
        args.ramp_microbatches, args.entrain_layout, args.split_weight_grads = 0, "disjoint", "off"
        args.assignment = "paper"


def _ramp(text: str) -> int | str:
    try:
        return parse_ramp(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def hardware_label(args: argparse.Namespace) -> str:
    """``ModelConfig.hardware_label`` of a data command's flags (no RunConfig to build)."""
    return ModelConfig.from_args(args).hardware_label()


def resolve_cost_model(args: argparse.Namespace) -> CostModel:
    """The cost model of a data command's flags (no RunConfig to build): ``ModelConfig.cost_model``,
    the one adapter over the one resolver ``entrain.core.costs.presets.resolve_cost_model``."""
    return ModelConfig.from_args(args).cost_model()


@dataclass
class WorkloadSource:
    """Per-iteration global batches of ``SampleWork`` for a ``--dataset`` value."""

    name: str
    cost: CostModel
    seed: int
    tp: int = 1
    cp: int = 1
    shuffle: bool = False
    image_root: str | None = None
    vision: ImageTokenRule = DEFAULT_VISION

    def batches(self, global_batch: int, iterations: int) -> Iterator[list[SampleWork]]:
        from entrain.data.workload_io import load_workload

        yield from load_workload(
            self.name,
            self.cost,
            global_batch=global_batch,
            iterations=iterations,
            seed=self.seed,
            tp=self.tp,
            cp=self.cp,
            shuffle=self.shuffle,
            image_root=self.image_root,
            vision=self.vision,
        )


def workload_source(args: argparse.Namespace, cost: CostModel) -> WorkloadSource:
    return WorkloadSource(
        args.dataset,
        cost,
        args.seed,
        tp=args.tp,
        shuffle=args.shuffle,
        image_root=getattr(args, "image_root", None),
        vision=vision_limits(args),
    )


def config_workload(config: RunConfig, cost: CostModel) -> WorkloadSource:
    """``workload_source`` of a built ``RunConfig``."""
    data = config.data
    return WorkloadSource(data.dataset, cost, data.seed, tp=config.parallel.tp, shuffle=data.shuffle,
                          image_root=data.image_root, vision=data.vision(config.model))  # fmt: skip


def config_sampler(config: RunConfig):
    """The planner's i.i.d. draws from the run's dataset (``entrain.data.sampling.dataset_sampler``)."""
    from entrain.data.sampling import dataset_sampler

    data = config.data
    return dataset_sampler(
        data.dataset, data.seed, image_root=data.image_root, vision=data.vision(config.model)
    )


def emit_json(obj: dict) -> None:
    json.dump(obj, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")
