"""Algorithm 1 with N encoders judged on the deployed configuration (``planning.encoders_bmin``): a split
whose components deploy no configuration that fits (every stage of every encoder group and of the LLM
in device memory, each group's stages on its GPUs) makes the size unstable where the paper's test on
allocation vectors calls it stable; the Eq. 2 gap is the deployed configuration's time on the
reference draw; ``simulate`` and ``train``'s profile (``sim.encoders_run.encoders_profile``) use it."""

from __future__ import annotations

import math
from dataclasses import replace

from entrain.core.costs.sampler import draw_seed, pool_sampler
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.planning.bmin import BMinConfig, DeployCheck
from entrain.core.planning.encoders import (
    allocate_gpus,
    component_totals,
    encoder_works,
    find_b_min_encoders,
    search_encoders,
)
from entrain.core.planning.encoders_bmin import (
    DeployedEncodersBMin,
    deployed_encoders_config,
    encoders_deploy_gap,
    encoders_eq2_on,
    find_b_min_encoders_deployed,
)
from entrain.core.workload.samples import SampleMeta
from entrain.sim.encoders_run import encoders_profile
from tests.core.test_encoder_allocation import _encoders

POOL = [SampleMeta(f"p{i}", ((224, 224),), 200, audio=(3000,) if i % 4 == 0 else (100,)) for i in range(100)]
"""Small images and short texts, one clip in four 30 s long (``test_encoder_allocation``'s pool)."""
PARALLEL = ParallelConfig(gpus=8, dp=1, tp=1, cp=1, global_batch=64, microbatch_size=4)
QUICK = BMinConfig(alpha=0.5, p_error=0.5)
"""One validation draw per size (k = 1): the tests' own Algorithm 1 parameters."""


def _tight(memory_bytes: float):
    """The omni encoders on a device of ``memory_bytes``."""
    out = []
    for e in _encoders():
        hw = replace(e.cost.hardware, device_memory_bytes=memory_bytes)
        out.append(replace(e, cost=replace(e.cost, hardware=hw)))
    return tuple(out)


def _draw(n: int, t: int):
    return list(pool_sampler(POOL)(n, draw_seed(0, n, t)))


def test_a_split_that_deploys_nothing_is_refused():
    """On a 1 MB device no configuration of any split fits: the paper's test settles on the allocation
    vector, the deployed check refuses every size up to the global batch, in one line."""
    tight = _tight(1e6)
    paper = find_b_min_encoders(pool_sampler(POOL), tight, 8, replace(QUICK, max_batch_size=64))
    assert paper.converged
    deploy = DeployCheck(PARALLEL)
    ours = find_b_min_encoders_deployed(pool_sampler(POOL), tight, 8, deploy, QUICK)
    assert isinstance(ours, DeployedEncodersBMin) and not ours.converged
    assert ours.b_min == 64 and all(math.isinf(t.eq2_gap) and not t.stable for t in ours.trials)
    assert any(t.allocation_stable for t in ours.trials)  # the paper's test alone would have stopped
    assert "no deployable configuration" in ours.reason and "\n" not in ours.reason
    draw = _draw(16, 0)
    alloc = allocate_gpus(8, component_totals(encoder_works(draw, tight)))
    assert deployed_encoders_config(draw, tight, 1, alloc, deploy) is None
    fits = deployed_encoders_config(draw, _encoders(), 1, alloc, deploy)
    assert fits is not None and fits.memory_ok and fits.allocation == alloc


def test_on_a_device_that_holds_it_the_check_converges_on_the_deployed_stages():
    deploy = DeployCheck(PARALLEL)
    ours = find_b_min_encoders_deployed(pool_sampler(POOL), _encoders(), 8, deploy, QUICK)
    assert ours.converged and ours.reason is None and ours.trials[-1].eq2_gap <= deploy.tolerance
    draw = _draw(ours.b_min, 0)
    assert ours.allocation == allocate_gpus(8, component_totals(encoder_works(draw, _encoders())))


def test_the_gap_is_the_deployed_configurations_eq2_on_the_reference_draw():
    """Two draws of different splits: the gap is |Eq. 2 of the validation draw's configuration on the
    reference draw - the reference's own| over the reference's; the same draw twice gives 0."""
    encoders, deploy = _encoders(), DeployCheck(PARALLEL)
    ref, other = POOL[:16], [s for s in POOL if s.audio[0] > 1000][:16]  # mixed; the long clips alone
    allocs = [allocate_gpus(8, component_totals(encoder_works(d, encoders))) for d in (ref, other)]
    assert allocs[0] != allocs[1]
    a = deployed_encoders_config(ref, encoders, 1, allocs[0], deploy)
    b = deployed_encoders_config(other, encoders, 1, allocs[1], deploy)
    assert a == search_encoders(ref, encoders, replace(PARALLEL, gpus=8), allocation=allocs[0])[0]
    assert math.isclose(encoders_eq2_on(ref, encoders, a), a.predicted_iteration_time_ms, rel_tol=1e-9)
    want = (
        abs(encoders_eq2_on(ref, encoders, b) - a.predicted_iteration_time_ms) / a.predicted_iteration_time_ms
    )
    assert [(c.pp, c.layer_ranges) for c in (*a.encoders, a.llm)] != [
        (c.pp, c.layer_ranges) for c in (*b.encoders, b.llm)
    ]
    assert want > 0
    assert encoders_deploy_gap([ref, other], allocs, encoders, 1, deploy) == want
    assert encoders_deploy_gap([ref, ref], [allocs[0]] * 2, encoders, 1, deploy) == 0.0


def test_the_planners_profile_uses_the_deployed_check():
    """``encoders_profile`` (``simulate`` and ``train`` with one pipeline per tower): on the 1 MB device
    Algorithm 1 does not converge and profiles the global batch."""
    b, profile = encoders_profile(pool_sampler(POOL), _tight(1e6), PARALLEL)
    assert isinstance(b, DeployedEncodersBMin) and not b.converged and b.b_min == 64 and len(profile) == 64
