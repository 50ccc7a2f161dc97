"""Routing statistics in ``metrics.jsonl`` (``expert_tokens``), from a real ``entrain train`` of the tiny
Qwen3-VL-MoE checkpoint on two forked ranks (encoder stage | LLM stage, several microbatches a step):
each step's row holds, per sparse layer, the tokens routed to each expert summed over the step's
microbatches, so each layer's counts sum to the step's LLM tokens times ``top_k``, and the first
step's are transformers' own routing of the step's samples at the checkpoint's weights; the summary
(``max`` / ``mean`` / ``imbalance``) is the counts'. With ``--ep 2`` (``dip``, two replicas sharing
the experts) each layer is reported once, for both replicas' tokens. ``entrain profile --from-trace``
reports the measured per-layer imbalance.
"""

from __future__ import annotations

import contextlib
import io
import json
from importlib import resources

import jsonschema
import pytest
import torch

from tests.models.qwen3_vl_moe_tiny import save_whole

from .cases import SEED
from .cli_ranks import run_ranks
from .families import FamilyModel

STEPS = 2
TOP_K = 2
SPARSE = [1, 2, 3]
"""The tiny checkpoint's sparse layers (layer 0 is dense, ``mlp_only_layers``)."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_whole(tmp_path_factory.mktemp("moe_routing") / "tiny")


def _train(folder, tmp, steps: int, *flags: str):
    out = tmp / "run"
    argv = ["train", "--model-path", str(folder), "--dataset", "skewed", "--hardware", "cpu-tiny",
            "--global-batch", "4", "--microbatch-size", "1", "--steps", str(steps), "--out", str(out),
            "--no-progress", "--seed", str(SEED), *flags]  # fmt: skip
    results = run_ranks(argv, 2, tmp / "ranks", timeout_s=60)
    assert [r.exitcode for r in results] == [0, 0], results[0].stderr[-3000:] + results[1].stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def run(folder, tmp_path_factory):
    """Two ranks, ``1f1b`` encoder | LLM, 4 samples a step in microbatches of 1, ``--trace``."""
    return _train(folder, tmp_path_factory.mktemp("pp"), STEPS, "--system", "1f1b", "--trace")


def _step_tokens(row: dict) -> int:
    """The step's LLM tokens (every replica's)."""
    return round(row["tokens_per_s"] * row["iteration_time_ms"] / 1e3)


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_each_layers_counts_sum_to_the_steps_tokens_times_top_k(run):
    rows = _rows(run)
    assert len(rows) == STEPS
    for row in rows:
        tokens = _step_tokens(row)
        microbatches = {(r["stage"], r["mb"]) for r in row["stage_times"]}
        assert len(microbatches) > 2, "the step must run several microbatches"
        entries = row["expert_tokens"]
        assert sorted(e["layer"] for e in entries) == SPARSE, entries
        for e in entries:
            counts = e["tokens_per_expert"]
            assert len(counts) == 4 and all(isinstance(c, int) and c >= 0 for c in counts)
            assert e["top_k"] == TOP_K and e["tokens"] == tokens, (e, tokens)
            assert sum(counts) == tokens * TOP_K, (e["layer"], sum(counts), tokens)
            assert e["ranks"] == [e["rank"]] == [1]  # the LLM stage's rank, no expert parallelism
            assert e["max"] == max(counts) and e["mean"] == pytest.approx(sum(counts) / 4)
            assert e["imbalance"] == pytest.approx(max(counts) / (sum(counts) / 4))


def test_first_steps_counts_are_transformers_routing(run, folder):
    """Each sample of step 0 alone through transformers' ``Qwen3VLMoeForConditionalGeneration``: the
    experts its routers choose (``gate``'s top-k indices), counted per sparse layer, equal the row's."""
    from entrain.core.workload.samples import SampleMeta
    from entrain.models.families.base import ModelSource
    from entrain.models.families.registry import family_of_source

    from .families import _image_inputs

    family = family_of_source(ModelSource(model_path=str(folder)))
    cfg, _ = family.runtime_config(ModelSource(model_path=str(folder)))
    rule = family.image_rule(cfg.shape, None, None)
    plan = json.loads((run / "plan.json").read_text())
    row = _rows(run)[0]
    metas = {s["id"]: SampleMeta.from_json(s["meta"], rule) for s in plan["samples"]}
    fm = FamilyModel("qwen3_vl_moe", family, cfg, None, {i: metas[i] for i in row["sample_ids"]})
    hf, renderer = fm.build(), fm.renderer()
    want = {i: torch.zeros(4, dtype=torch.int64) for i in SPARSE}
    layers = hf.model.language_model.layers

    def count(i: int):
        def hook(module, args, out) -> None:  # out: logits, top-k weights, top-k experts
            want[i].add_(torch.bincount(out[2].reshape(-1), minlength=4))

        return hook

    for i in SPARSE:
        layers[i].mlp.gate.register_forward_hook(count(i))
    with torch.no_grad():
        for sid in row["sample_ids"]:
            hf(input_ids=renderer.sample(sid).input_ids[None], **_image_inputs(fm, renderer, sid, hf))
    got = {e["layer"]: e["tokens_per_expert"] for e in row["expert_tokens"]}
    assert got == {i: w.tolist() for i, w in want.items()}


def test_ep2_reports_each_layer_once_with_both_replicas_tokens(folder, tmp_path):
    """``dip`` on 2 ranks: two replicas, each an encoder and an LLM stage on one rank, ``--ep 2``: each
    expert computes the tokens of both, so each layer's counts are the EP group's, reported by rank 0."""
    (row,) = _rows(_train(folder, tmp_path, 1, "--system", "dip", "--dp", "2", "--ep", "2"))
    tokens = _step_tokens(row)
    entries = row["expert_tokens"]
    assert sorted(e["layer"] for e in entries) == SPARSE, entries
    for e in entries:
        assert e["rank"] == 0 and e["ranks"] == [0, 1] and e["tokens"] == tokens, (e, tokens)
        assert sum(e["tokens_per_expert"]) == tokens * TOP_K


def test_profile_from_trace_reports_each_layers_measured_imbalance(run, tmp_path):
    from entrain.cli.main import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert (
            main(["profile", "--from-trace", str(run), "--out", str(tmp_path / "refit.json"), "--json"]) == 0
        )
    doc = json.loads(buf.getvalue())
    jsonschema.validate(
        doc, json.loads(resources.files("entrain").joinpath("schemas/profile.json").read_text())
    )
    want: dict[int, list[float]] = {}
    for row in _rows(run):  # busiest expert's tokens / mean tokens per expert, from the counts
        for e in row["expert_tokens"]:
            counts = e["tokens_per_expert"]
            want.setdefault(e["layer"], []).append(max(counts) * len(counts) / sum(counts))
    got = doc["from_trace"]["expert_imbalance"]
    assert [g["layer"] for g in got] == SPARSE
    for g in got:
        v = want[g["layer"]]
        assert g["entries"] == len(v) == STEPS
        assert g["imbalance"] == pytest.approx(sum(v) / len(v)) and g["max_imbalance"] == pytest.approx(
            max(v)
        )
        assert g["imbalance"] > 1.0  # 4 experts never get exactly equal shares here
