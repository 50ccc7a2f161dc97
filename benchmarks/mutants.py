"""Mutation check: does the fast suite catch the bugs users would pay for?

Each mutant is one small textual edit of the library (a search string that must occur exactly once
in its file, and its replacement). The script copies the working tree (tracked and untracked, not
ignored files) to a scratch folder, checks that the tests named below pass there unmutated, then
for each mutant: applies it, runs the tests that should kill it (``-x``, slow tests excluded),
restores the file. A mutant whose search string is gone or ambiguous stops the run with
"mutant X no longer applies": update its edit to the refactored code rather than drop it.

    python benchmarks/mutants.py [--only NAME,...] [--out benchmarks/results/mutants.md]
    python benchmarks/mutants.py --fast     # what .ci/run runs after the suite

``--fast`` skips the unmutated baseline (the suite has just passed), runs only each mutant's
``fast`` node ids (the tests that killed it in a full run), writes no report unless ``--out`` is
given, and exits 1 when any mutant survives.

The real tree is never modified. ``tests/test_mutants.py`` checks that every mutant still applies.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    path: str
    find: str
    replace: str
    tests: tuple[str, ...]
    """pytest node ids expected to kill it (all in the fast suite)."""
    fast: tuple[str, ...] = ()
    """``--fast``: the node ids that killed it in the last full run (default: ``tests``)."""


EXACT_2 = "tests/runtime/test_exact_gradients.py::test_gradients_match_reference[2]"
EXACT_EXT = "tests/runtime/test_exact_gradients_extensions.py"
QUALITY = "tests/core/test_assignment_quality.py"
PROPERTIES = "tests/core/test_assignment_properties.py"
GOLDEN = "tests/sim/test_golden.py"
RESUME = "tests/runtime/test_resume_multirank.py"
DP_BALANCE = "tests/core/test_dp_split_balance.py"
PLANNER = "tests/core/test_planner.py"
COSTMODEL = "tests/core/test_costmodel.py"
SIM_EXECUTOR = "tests/sim/test_simulator.py"
STAGE_PARALLEL = "tests/runtime/test_stage_parallel.py::test_tp_and_fsdp_gradients_match_tp1_and_plain_dp"
RESUME_CRASH = "tests/runtime/test_checkpoint.py::test_exact_resume_after_a_crash_is_bitwise_the_straight_run"
MROPE = "tests/models/test_mrope_positions_vs_transformers.py"
ONEVISION = "tests/models/test_llava_onevision.py"
ONEVISION_RULES = "tests/models/test_llava_onevision_rules.py"
INTERNVL_TILES = "tests/models/test_internvl.py::test_tiles_per_image_are_the_image_processors"
QWEN_EXPORT = (
    "tests/models/test_qwen2_vl_family.py::test_export_loads_in_transformers_with_the_trained_logits"
)
P2P = "tests/core/test_p2p.py"
P2P_RULES = "tests/core/test_p2p_nccl_rules.py"
REGRESSION = "tests/benchmarks/test_regression.py"
TRACE_LINE = "tests/sim/test_trace_fit_line.py"
TRACE_SPLIT = "tests/sim/test_trace_fit_split_share.py"
DRIFT = "tests/sim/test_drift.py"
DEGREES = "tests/sim/test_replan_degrees.py"
SHARDS = "tests/data/test_shards.py"
ORDERED_MAP = "tests/core/test_ordered_map_processes.py"

MUTANTS = (
    Mutant(
        "dp-gradient-scaling",
        "the DP all-reduce result divided by dp (a mean on top of the label-count normalisation)",
        "entrain/runtime/grad_buckets.py",
        "g.copy_(b.flat[offset : offset + g.numel()].view_as(g))",
        "g.copy_(b.flat[offset : offset + g.numel()].view_as(g) / dist.get_world_size(self.group))",
        (EXACT_2, "tests/runtime/test_grad_buckets.py"),
    ),
    Mutant(
        "loss-normalisation",
        "the loss scaled by dp / global label count (per-replica mean instead of the global one)",
        "entrain/runtime/trainer.py",
        "scale = 1.0 / max(1, self._global_labels(it))\n        if self.fault_hook",
        "scale = self.layout.dp / max(1, self._global_labels(it))\n        if self.fault_hook",
        (EXACT_2,),
    ),
    Mutant(
        "no-coarse-fine-split",
        "stratified assignment LPTs all samples in encoder order (no coarse set first)",
        "entrain/core/assignment/stratified.py",
        "return lpt_assign(coarse + fine, k_eff)",
        "return lpt_assign(sorted(samples, key=lambda s: (-s.encoder, s.id)), k_eff)",
        (QUALITY,),
        (f"{QUALITY}::test_coarse_set_is_lpt_balanced_against_brute_force",),
    ),
    Mutant(
        "deferral-off",
        "pairwise deferral matches pairs but moves no sample",
        "entrain/core/assignment/hierarchical.py",
        "moved = cand.deferred(row, col) if defers else ()",
        "moved = ()",
        (QUALITY,),
        (f"{QUALITY}::test_strategies_draw_hard_cases",),
    ),
    Mutant(
        "swapped-execution-order",
        "each pair runs UL before OL (the deferred samples then wait on a microbatch that ran earlier)",
        "entrain/core/assignment/hierarchical.py",
        "order = [m for ol, ul, _ in pairs for m in (ol, ul)]",
        "order = [m for ol, ul, _ in pairs for m in (ul, ol)]",
        (PROPERTIES, GOLDEN),
        (f"{PROPERTIES}::test_deferral_only_from_ol_to_the_partner_run_right_after",),
    ),
    Mutant(
        "sub-microbatch-routing-off-by-one",
        "the first LLM stage routes an encoder message's rows by the ids of the previous sub",
        "entrain/runtime/executor.py",
        "ids = [sid for sid in self._ids(stage - 1, mb, sub) if sid in own]",
        "ids = [sid for sid in self._ids(stage - 1, mb, sub - 1) if sid in own]",
        (EXACT_2,),
    ),
    Mutant(
        "skipped-rng-restore",
        "resume does not restore the Python / numpy / torch generator states",
        "entrain/runtime/checkpointer.py",
        'ck.set_rng_state(found.rank_state["rng"])',
        "pass",
        (RESUME,),
        (f"{RESUME}::test_multirank_entrain_resume_is_bitwise_the_straight_run",),
    ),
    Mutant(
        "skipped-optimizer-restore",
        "resume restores the parameters but not AdamW's moments and step counts",
        "entrain/runtime/trainer.py",
        "load(folder, {k: v for k, v in state.items() if k in saved})",
        'load(folder, {k: v for k, v in state.items() if k in saved and not k.startswith("optim/")})',
        (RESUME,),
        (f"{RESUME}::test_multirank_entrain_resume_is_bitwise_the_straight_run",),
    ),
    Mutant(
        "schedule-action-late",
        "1F1B-over-units emits the last warm-up forward one slot late (after the first backward)",
        "entrain/core/schedules/common.py",
        "    w = max(0, min(warmup, n))\n    out = [a for unit in fwd[:w] for a in unit]",
        "    w = max(0, min(warmup - 1, n))\n    out = [a for unit in fwd[:w] for a in unit]",
        (GOLDEN,),
        (f"{GOLDEN}::test_golden_file[1f1b.txt]",),
    ),
    # This round's mutants
    Mutant(
        "dp-split-replica-0-leftovers",
        "the DP split: replica 0 takes one sample, then only what the other replicas leave",
        "entrain/core/assignment/dp_split.py",
        "heapq.heappush(heap, (load + s.llm, r))",
        'heapq.heappush(heap, (load + s.llm if r else float("inf"), r))',
        (DP_BALANCE,),
        (f"{DP_BALANCE}::test_max_llm_load_within_graham_bound_of_the_exhaustive_optimum",),
    ),
    Mutant(
        "wrong-deferral-partner",
        "pairwise deferral moves an OL microbatch's samples to another UL microbatch than its match",
        "entrain/core/assignment/hierarchical.py",
        "pairs.append((cand.ol[row], cand.ul[col], moved))",
        "pairs.append((cand.ol[row], cand.ul[-1 - col], moved))",
        (QUALITY,),
        (f"{QUALITY}::test_deferral_makespan_equals_brute_force_optimum",),
    ),
    Mutant(
        "b-min-first-size",
        "Algorithm 1 stops at the first batch size whether or not its GPU split is stable",
        "entrain/core/planning/bmin.py",
        "if trials[n].stable:",
        "if True:",
        (PLANNER,),
        (f"{PLANNER}::test_b_min_doubles_until_stable_and_is_deterministic",),
    ),
    Mutant(
        "memory-always-fits",
        "the planner's memory check passes every configuration",
        "entrain/core/planning/config_search.py",
        "mem_ok = all(m <= limit",
        "mem_ok = True or all(m <= limit",
        (PLANNER,),
        (f"{PLANNER}::test_memory_check_rejects",),
    ),
    Mutant(
        "no-quadratic-term",
        "the cost model drops the a*x^2 (attention) term of a layer's time",
        "entrain/core/costs/layer_costs.py",
        "return self.a * x * x + self.b * x",
        "return self.b * x",
        (COSTMODEL,),
        (f"{COSTMODEL}::test_layer_time_is_per_unit_quadratic_plus_per_call_constant",),
    ),
    Mutant(
        "sim-no-p2p-time",
        "the simulator delivers every point-to-point message instantly",
        "entrain/sim/executor.py",
        "return self.costs.message_ms(",
        "return 0.0 * self.costs.message_ms(",
        (SIM_EXECUTOR,),
        (f"{SIM_EXECUTOR}::test_p2p_latency_adds_on_the_critical_path",),
    ),
    Mutant(
        "sim-no-dp-allreduce-time",
        "the simulator's iteration ends before the DP gradient all-reduce",
        "entrain/sim/executor.py",
        "t = max(t, last + allreduce[r])",
        "t = max(t, last)",
        (SIM_EXECUTOR,),
        (f"{SIM_EXECUTOR}::test_dp_allreduce_is_added_after_the_last_backward",),
    ),
    Mutant(
        "sim-no-step-end",
        "the simulator's iteration ends at the last rank's all-reduce, without the end-of-step phase",
        "entrain/sim/executor.py",
        "return IterationRun(runs, t + tail, allreduce, tail)",
        "return IterationRun(runs, t, allreduce, tail)",
        ("tests/sim/test_step_end.py::test_the_end_of_step_is_priced_once_after_the_all_reduce",),
    ),
    Mutant(
        "predict-free-remote-gradient",
        "the predicted makespan delays a gradient only between stages of one rank, not across ranks",
        "entrain/core/schedules/predict.py",
        "if rank[sources[0][0]] != rank[s] else 0.0",
        "if rank[sources[0][0]] == rank[s] else 0.0",
        ("tests/sim/test_extensions.py::test_chain_layouts_with_ramp_are_valid_and_predicted_exactly",),
    ),
    Mutant(
        "step-end-fit-counts-allreduce",
        "the end-of-step fit keeps the DP gradient all-reduce the simulator already prices (counted twice)",
        "entrain/sim/step_end_fit.py",
        "out.append(iteration[step] - (end - start) - priced)",
        "out.append(iteration[step] - (end - start))",
        ("tests/sim/test_step_end.py::test_the_fit_finds_both_terms_without_the_all_reduce",),
    ),
    Mutant(
        "tp-skipped-allreduce",
        "the LLM attention output projection under --tp returns each rank's partial sum (no all-reduce)",
        "entrain/models/families/composition/tp.py",
        'plan["self_attn.o_proj"] = RowwiseParallel()',
        'plan["self_attn.o_proj"] = RowwiseParallel(output_layouts=__import__("torch").distributed.tensor.Partial())',
        (STAGE_PARALLEL,),
    ),
    Mutant(
        "fsdp-param-left-out",
        "--fsdp leaves the final norm's weight out of the stage's FSDP root (never reduced over DP)",
        "entrain/runtime/parallelize.py",
        "owned = {id(p) for _, p in stage.owned_parameters()}",
        'owned = {id(p) for n, p in stage.owned_parameters() if not n.endswith("model.norm.weight")}',
        (STAGE_PARALLEL,),
    ),
    Mutant(
        "resume-one-step-early",
        "--resume restarts at the step before the checkpoint's (that step then runs twice)",
        "entrain/runtime/session.py",
        "start = ckpt.step if ckpt",
        "start = ckpt.step - 1 if ckpt",
        (RESUME_CRASH,),
    ),
    # journeys, not only units: the families, point-to-point programs, drift / re-plan, trace fit, shard
    # readers, planning workers and the regression guard
    Mutant(
        "mrope-image-run-not-checked",
        "M-RoPE positions accept an image whose placeholder tokens a text token cuts in two",
        "entrain/models/families/qwen2_vl/positions.py",
        "if not n or int(run[-1]) - int(run[0]) != n - 1:",
        "if not n:",
        (f"{MROPE}::test_an_image_cut_by_text_is_refused_not_given_positions",),
    ),
    Mutant(
        "mrope-positions-off-by-one",
        "each packed sample's M-RoPE ids start at 1 instead of transformers' 0",
        "entrain/models/families/qwen2_vl/positions.py",
        "[grids[i] for i in inside], vids) + offset",
        "[grids[i] for i in inside], vids) + offset + 1",
        (f"{MROPE}::test_packed_ids_are_transformers_per_sample",),
    ),
    Mutant(
        "mrope-adjacent-images-overlap",
        "the second of two adjacent images starts on the first one's largest id",
        "entrain/models/families/qwen2_vl/positions.py",
        "offset = int(part.max()) + 1 if part.numel() else offset",
        "offset = int(part.max()) if part.numel() else offset",
        (f"{MROPE}::test_adjacent_images_continue_as_after_one_separating_token",),
    ),
    Mutant(
        "tiling-patch-rows-transposed",
        "LLaVA-OneVision tiles are cut into patch rows column by column (a transposed tile)",
        "entrain/models/families/tiled_model.py",
        "x = x.reshape(n, c, side, patch_px, side, patch_px).permute(0, 2, 4, 1, 3, 5)",
        "x = x.reshape(n, c, side, patch_px, side, patch_px).permute(0, 4, 2, 1, 3, 5)",
        (f"{ONEVISION}::test_patch_rows_drop_only_what_the_patch_conv_drops",),
    ),
    Mutant(
        "tiling-best-resolution-last-tie",
        "AnyRes takes the last grid that keeps as many pixels, not the one that wastes the fewest",
        "entrain/models/families/llava_onevision/processing.py",
        "if kept > best_kept or (kept == best_kept and wasted < best_wasted):",
        "if kept >= best_kept:",
        (f"{ONEVISION_RULES}::test_7b_geometry_matches_transformers",),
    ),
    Mutant(
        "internvl-tile-tie-first",
        "InternVL keeps the first grid of an equally close aspect ratio even for an image large enough for more",
        "entrain/models/families/internvl/processing.py",
        "elif diff == best_diff and area > 0.5 * rules.tile_px * rules.tile_px * cols * rows:",
        "elif False:",
        (INTERNVL_TILES,),
    ),
    Mutant(
        "internvl-thumbnail-always",
        "InternVL adds the thumbnail tile to a one-tile image too",
        "entrain/models/families/internvl/processing.py",
        "return cols * rows + 1 if cols * rows > 1 else 1",
        "return cols * rows + 1",
        (INTERNVL_TILES,),
    ),
    Mutant(
        "export-keeps-tied-config",
        "a Qwen2.5-VL export keeps the source's tied lm_head in its config (trained apart from the embedding)",
        "entrain/models/families/qwen2_vl/export.py",
        '    untie(config)\n    with torch.device("meta"):',
        '    with torch.device("meta"):',
        (f"{QWEN_EXPORT}[qwen2_5_vl]",),
    ),
    Mutant(
        "p2p-forward-receive-without-header",
        "a forward receive posts its data with its header (its size unknown until the header is read)",
        "entrain/core/ir/p2p.py",
        "if not receive_needs_header(msg):",
        "if True:",
        (f"{P2P}::test_a_forward_receive_reads_its_header_before_posting_the_data",),
    ),
    Mutant(
        "p2p-checker-ignores-part",
        "the NCCL replay pairs operations by message only (a data receive matched with a header send)",
        "entrain/core/ir/p2p_check.py",
        "return (op.message, op.part, op.tensor)",
        "return op.message",
        (f"{P2P}::test_a_data_receive_posted_before_its_header_is_a_mismatch",),
    ),
    Mutant(
        "p2p-no-channel-order",
        "a receive posts only its own message, not the earlier ones its sender sent first (FIFO matching)",
        "entrain/core/ir/p2p.py",
        "return self.orders[peer][first : pos + 1]",
        "return self.orders[peer][pos : pos + 1]",
        (f"{P2P}::test_receives_follow_the_senders_order_per_channel",),
    ),
    Mutant(
        "p2p-deadlock-unreported",
        "the NCCL replay stops quietly where no rank can move (a deadlock passes the check)",
        "entrain/core/ir/p2p_check.py",
        "                self._deadlock()",
        "                return",
        (f"{P2P}::test_one_communicator_deadlocks_1f1b_with_the_error_grid",),
    ),
    Mutant(
        "p2p-lazy-connect-ignored",
        "the NCCL replay lets a host post past a first operation whose peer has not connected",
        "entrain/core/ir/p2p_check.py",
        "if self.rules.lazy_connect and self._unconnected(g, first):",
        "if False:",
        (f"{P2P_RULES}::test_a_first_send_blocks_the_host_until_the_peer_posts_on_the_pair",),
    ),
    Mutant(
        "p2p-shared-queue-ignored",
        "under CUDA_DEVICE_MAX_CONNECTIONS=1 the replay still runs each communicator's queue on its own",
        "entrain/core/ir/p2p_check.py",
        "if i is None or (self.rules.shared_queue and i != r.queue[0]):",
        "if i is None:",
        (f"{P2P_RULES}::test_one_gpu_queue_holds_a_rank_behind_its_waiting_send",),
    ),
    Mutant(
        "regression-error-case-ok",
        "the regression guard passes a case that fails now (or fails otherwise than in the baseline)",
        "benchmarks/regression.py",
        'return "ok" if same else "missing"',
        'return "ok" if base is not None else "missing"',
        (f"{REGRESSION}::test_a_case_that_errors_is_ok_only_with_the_baselines_same_error",),
    ),
    Mutant(
        "regression-tolerance-doubled",
        "the regression guard lets Entrain be 1 % slower (twice the tolerance)",
        "benchmarks/regression.py",
        "if c > b * (1.0 + tol):",
        "if c > b * (1.0 + 2 * tol):",
        (f"{REGRESSION}::test_verdict",),
    ),
    Mutant(
        "trace-fit-input-share-from-w",
        "the trace fit reads a split backward's W time as its I share",
        "entrain/sim/trace_fit.py",
        '[kind == "W"] += e["dur"]',
        '[kind == "I"] += e["dur"]',
        (TRACE_SPLIT,),
    ),
    Mutant(
        "trace-fit-corner-split",
        "the joint trace fit keeps its groups' split of layers no traced cut separates (a corner of the fit)",
        "entrain/sim/trace_joint_fit.py",
        "    fitted |= _split_by_prior(base, layers, spans, fitted)\n",
        "",
        (
            "tests/sim/test_trace_joint_refit.py::"
            "test_layers_no_traced_cut_separates_split_their_fitted_total_as_the_base_does",
        ),
    ),
    Mutant(
        "trace-fit-keeps-warmup",
        "the trace fit keeps the run's first (warm-up) step",
        "entrain/sim/trace_fit.py",
        'return [e for e in events if e["args"]["step"] != min(steps)]',
        "return events",
        (f"{TRACE_LINE}::test_the_warmup_step_is_not_fitted",),
    ),
    Mutant(
        "trace-fit-scale-drops-constant",
        "sizes too alike for a slope: the trace fit scales the base line's slope but drops its constant",
        "entrain/sim/trace_fit.py",
        "return s, s * constant_ms",
        "return s, 0.0",
        (f"{TRACE_LINE}::test_sizes_alike_scale_the_base_line",),
    ),
    Mutant(
        "drift-encoder-only",
        "the drift monitor watches the encoder's work only (an LLM-side drift never opens the gate)",
        "entrain/sim/drift.py",
        "return max(abs(math.log(encoder_ratio)), abs(math.log(llm_ratio)))",
        "return abs(math.log(encoder_ratio))",
        (f"{DRIFT}::test_drift_is_the_larger_of_the_encoder_and_llm_moves",),
    ),
    Mutant(
        "replan-cost-new-shard-twice",
        "the re-plan cost prices the checkpoint write on the new layout (its shard twice + restart)",
        "entrain/sim/drift.py",
        "return _shard_ms(old, cost) + restart_ms + _shard_ms(new, cost)",
        "return 2 * _shard_ms(new, cost) + restart_ms",
        (f"{DRIFT}::test_re_plan_cost_writes_the_old_layouts_shards_and_reads_the_new_ones",),
    ),
    Mutant(
        "replan-gain-one-iteration-more",
        "the re-plan gain counts the current iteration among those left on the new layout",
        "entrain/sim/drift.py",
        "left = self.total_iterations - iteration - 1",
        "left = self.total_iterations - iteration",
        (f"{DRIFT}::test_a_drift_with_a_gain_re_plans_after_a_full_window",),
    ),
    Mutant(
        "replan-choice-ignores-switch-cost",
        "the monitor takes the re-planner's fastest finalist on the window, not the cheapest net of its switch",
        "entrain/sim/drift.py",
        "best = min(fits, key=lambda i: scored[i][0] * left + scored[i][1], default=None)",
        "best = min(fits, key=lambda i: scored[i][0], default=None)",
        (f"{DEGREES}::test_the_monitor_takes_the_finalist_cheapest_net_of_its_switch_and_records_it",),
    ),
    Mutant(
        "degree-candidates-keep-the-runs-degrees",
        "a re-plan's other-degree candidates include the run's own (DP, TP, microbatch size)",
        "entrain/sim/adaptive.py",
        "if c.memory_ok and key != current and key not in best:",
        "if c.memory_ok and key not in best:",
        (f"{DEGREES}::test_degree_candidates_are_other_dp_tp_microbatch_sizes_of_the_same_run",),
    ),
    Mutant(
        "webdataset-lexical-image-order",
        "a tar sample's images sorted as text (.10 before .2)",
        "entrain/data/webdataset.py",
        'return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in ext.split("."))',
        "return (ext,)",
        (f"{SHARDS}::test_a_tar_samples_images_are_in_their_index_order_past_nine",),
    ),
    Mutant(
        "webdataset-key-at-last-dot",
        "a tar member's sample key ends at its last dot (k.0.png and k.1.png become two samples)",
        "entrain/data/webdataset.py",
        'stem, dot, ext = base.partition(".")',
        'stem, dot, ext = base.rpartition(".")',
        (f"{SHARDS}::test_a_tar_samples_images_are_in_their_index_order_past_nine",),
    ),
    Mutant(
        "parquet-row-in-group-stuck",
        "a Parquet image's location names row 0 of its row group for every row",
        "entrain/data/parquet.py",
        "row_in_group += 1",
        "row_in_group += 0",
        (f"{SHARDS}::test_kept_records_read_their_images_by_location[parquet]",),
    ),
    Mutant(
        "shards-metadata-misordered",
        "the shards scanned afresh give their metadata back in reverse shard order",
        "entrain/data/shards.py",
        "todo = [s for s, c in zip(shards, cached, strict=True) if c is None]",
        "todo = [s for s, c in zip(shards, cached, strict=True) if c is None][::-1]",
        (f"{SHARDS}::test_metadata_is_cached_per_shard",),
    ),
    Mutant(
        "shards-workers-ignore-ranks",
        "every rank of a node scans with all the node's CPUs (not its share)",
        "entrain/data/shards.py",
        "min((os.cpu_count() or 1) // ranks, MAX_DEFAULT_WORKERS)",
        "min((os.cpu_count() or 1), MAX_DEFAULT_WORKERS)",
        (f"{SHARDS}::test_scan_workers_share_the_cpus_among_the_ranks_of_a_node",),
    ),
    Mutant(
        "workers-results-reversed",
        "the planner's worker pool returns the items' results in reverse order",
        "entrain/core/workers.py",
        "return pool.map(_call, range(len(items)), chunksize=1)",
        "return pool.map(_call, range(len(items))[::-1], chunksize=1)",
        ("tests/sim/test_workers.py::test_ordered_map_keeps_the_order_and_raises_the_error",),
    ),
    Mutant(
        "workers-never-fork",
        "--jobs N plans in the calling process only (no worker process)",
        "entrain/core/workers.py",
        "jobs = min(_jobs, len(items))",
        "jobs = 1",
        (ORDERED_MAP,),
    ),
    Mutant(
        "worker-forks-again",
        "a planning worker's own ordered_map tries to fork a pool of its own",
        "entrain/core/workers.py",
        "_jobs = 1  # a worker never forks again",
        "pass  # a worker forks again",
        (ORDERED_MAP,),
    ),
    Mutant(
        "no-fit-decisions-kept-on-inf",
        "a schedule-option decision none of whose candidates fits on the plain check keeps its default"
        " (inf against inf) instead of asking the memory check a command deploys with",
        "entrain/core/planning/extensions.py",
        "    judge = _fitting_judge(judge)\n",
        "",
        ("tests/sim/test_no_fit_decisions.py",),
    ),
)


class MutantDoesNotApply(RuntimeError):
    pass


def mutated_text(m: Mutant, root: Path) -> tuple[str, str]:
    """(original, mutated) text of ``m.path`` under ``root``; raises MutantDoesNotApply unless the
    search string occurs exactly once."""
    path = root / m.path
    if not path.exists():
        raise MutantDoesNotApply(f"mutant {m.name} no longer applies: {m.path} does not exist")
    text = path.read_text()
    count = text.count(m.find)
    if count != 1:
        raise MutantDoesNotApply(
            f"mutant {m.name} no longer applies: {m.path} holds its search string {count} times, "
            f"not once: {m.find!r}"
        )
    return text, text.replace(m.find, m.replace)


def _scratch_copy() -> Path:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    scratch = Path(tempfile.mkdtemp(prefix="entrain-mutants-"))
    for f in filter(None, files):
        src, dst = ROOT / os.fsdecode(f), scratch / os.fsdecode(f)
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return scratch


def _env(scratch: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(scratch), CI="true", PYTHONDONTWRITEBYTECODE="1")


def _pytest(scratch: Path, tests: tuple[str, ...]) -> tuple[int, list[str], float, str]:
    """(exit code, failed node ids, seconds, output tail) of the fast tests ``tests`` in ``scratch``."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-rf",
        "-p",
        "no:cacheprovider",
        "-m",
        "not slow",
        *tests,
    ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=scratch, env=_env(scratch), capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    out = done.stdout + done.stderr
    failed = re.findall(r"^FAILED (\S+?)(?: - |$)", out, flags=re.MULTILINE)
    return done.returncode, failed, seconds, out[-3000:]


def _check_imports_from(scratch: Path) -> None:
    where = subprocess.run(
        [sys.executable, "-c", "import entrain; print(entrain.__file__)"],
        cwd=scratch,
        env=_env(scratch),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not Path(where).resolve().is_relative_to(scratch.resolve()):
        raise SystemExit(f"the scratch copy imports entrain from {where}, not from {scratch}")


def _commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    )
    return head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


def _run_mutant(m: Mutant, scratch: Path, fast: bool) -> dict:
    """Apply ``m`` in ``scratch``, run its tests (``m.fast`` ones when ``fast``), restore the file."""
    original, mutated = mutated_text(m, scratch)
    path = scratch / m.path
    path.write_text(mutated)
    try:
        rc, failed, seconds, tail = _pytest(scratch, m.fast or m.tests if fast else m.tests)
    finally:
        path.write_text(original)
    # killed = a test failed (exit 1); a collection error or crash of pytest itself is not a kill
    killed = rc == 1 and bool(failed)
    print(f"{m.name}: {'killed by ' + ', '.join(failed) if killed else f'SURVIVED (exit {rc})'}"
          f" ({seconds:.0f} s)", flush=True)  # fmt: skip
    if not killed and rc != 0:
        print(tail, flush=True)
    return {"name": m.name, "killed": killed, "failed": failed, "seconds": seconds, "rc": rc}


def _baseline(mutants: tuple[Mutant, ...], scratch: Path) -> dict:
    tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
    rc, failed, seconds, tail = _pytest(scratch, tests)
    if rc != 0:
        raise SystemExit(f"the unmutated tree fails its tests ({failed or rc}); fix that first:\n{tail}")
    print(f"unmutated: {len(tests)} test targets pass ({seconds:.0f} s)", flush=True)
    return {"name": "(unmutated)", "killed": False, "failed": [], "seconds": seconds, "rc": rc}


def run(mutants: tuple[Mutant, ...], *, fast: bool = False) -> list[dict]:
    """Rows of the run: the unmutated baseline first (``fast``: not run, the suite ran before), then
    one per mutant."""
    for m in mutants:  # all must apply before anything runs
        mutated_text(m, ROOT)
    scratch = _scratch_copy()
    try:
        _check_imports_from(scratch)
        rows = [None if fast else _baseline(mutants, scratch)]
        return rows + [_run_mutant(m, scratch, fast) for m in mutants]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def report(rows: list[dict], mutants: tuple[Mutant, ...], *, fast: bool = False) -> str:
    by_name = {m.name: m for m in mutants}
    killed = sum(r["killed"] for r in rows[1:])
    total_s = sum(r["seconds"] for r in rows if r)
    baseline = (
        "No unmutated baseline in `--fast` mode (the suite passes first in `.ci/run`)."
        if rows[0] is None
        else f"The unmutated copy passes those tests ({rows[0]['seconds']:.0f} s)."
    )
    command = f"python benchmarks/mutants.py{' --fast' if fast else ''}"
    lines = [
        "# Mutation check",
        "",
        f"Source: commit {_commit().split()[0]}, `{command}`",
        "",
        f"`{command}` on {_commit()}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
        f"Each mutant is applied to a scratch copy of the tree; its {'killing' if fast else 'listed'} fast "
        "tests run with `-x`.",
        baseline,
        f"**{killed} of {len(rows) - 1} mutants killed**; pytest time {total_s:.0f} s in all.",
        "",
        "| mutant | edit | file | killed by | s |",
        "|---|---|---|---|---|",
    ]
    for r in rows[1:]:
        m = by_name[r["name"]]
        verdict = (
            ", ".join(f"`{t}`" for t in r["failed"])
            if r["killed"]
            else f"**survived** (pytest exit {r['rc']})"
        )
        lines.append(f"| {m.name} | {m.what} | `{m.path}` | {verdict} | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def _selected(only: str | None) -> tuple[Mutant, ...]:
    if not only:
        return MUTANTS
    names = only.split(",")
    unknown = sorted(set(names) - {m.name for m in MUTANTS})
    if unknown:
        raise SystemExit(f"unknown mutants {unknown}; choose from {', '.join(m.name for m in MUTANTS)}")
    return tuple(m for m in MUTANTS if m.name in names)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated mutant names")
    ap.add_argument(
        "--fast",
        action="store_true",
        help="CI mode: no unmutated baseline (the suite ran before), each mutant's killing tests only; "
        "writes no report unless --out is given; exit 1 when a mutant survives",
    )
    ap.add_argument("--out", help="report path (default benchmarks/results/mutants.md; none with --fast)")
    args = ap.parse_args()
    mutants = _selected(args.only)
    try:
        rows = run(mutants, fast=args.fast)
    except MutantDoesNotApply as e:
        raise SystemExit(str(e)) from None
    out = args.out or (None if args.fast else str(ROOT / "benchmarks" / "results" / "mutants.md"))
    if out:
        Path(out).write_text(report(rows, mutants, fast=args.fast))
        print(f"wrote {out}")
    survivors = [r["name"] for r in rows[1:] if not r["killed"]]
    print(f"{len(rows) - 1 - len(survivors)} of {len(rows) - 1} mutants killed"
          + (f"; SURVIVED: {', '.join(survivors)}" if survivors else ""))  # fmt: skip
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
