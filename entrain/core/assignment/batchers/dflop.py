"""``dflop``: DFLOP's Online Microbatch Scheduler (An et al., "DFLOP: A Data-driven Framework for
Multimodal LLM Training Pipeline Optimization", SIGMOD'26, arXiv 2603.25120; the authors' code,
github.com/BDAI-Research/DFLOP, ``scheduler.py``), on our engine. docs/baselines.md, "DFLOP", says
what each of the paper's parts does, what we follow and every difference. The paper's section
numbers are not given because we could not check them against its full text; its parts are named as
the authors name them.

What we follow (the Online Microbatch Scheduler, as the authors' code states it): each global batch
of ``N`` samples is split into ``m = dp * K`` groups (``K`` microbatches per replica) by an integer
linear program. Every sample is in exactly one group, no group is empty, and for every group and
every module (vision encoder, LLM) the group's summed predicted duration of that module is at most
``C_max``, which is minimised. Each module bounds ``C_max`` on its own; the two are never added. A
sample's predicted duration of a module is its forward + backward time over the module's stages,
divided by the module's stage count (``module_costs``). DFLOP uses the module's FLOPs over its
profiled throughput times its GPU count; we use the cost model's per-stage times, the same pricing
every system of the engine gets. Group ``j`` is microbatch ``j // dp`` of replica ``j % dp``
(DFLOP's mapping), run in that order.

Differences (docs/baselines.md lists them all):

* Solver: HiGHS through ``scipy.optimize.milp`` with a node limit (``ILP_NODE_LIMIT``) and a 30 s
  cap, not OR-tools CP-SAT with a 10 s limit. The ILP is built only where ``N * m`` binaries are at
  most ``ILP_MAX_BINARIES``. Larger batches (the paper's setting: 512 samples x 128 groups = 65,536
  binaries) get the min-max vector LPT (``minmax_lpt``). The LPT's groups are also the ILP's
  incumbent: the ILP's are kept only where they are strictly better.
* Microbatches: DFLOP's encoder runs ``dp`` consecutive groups as one microbatch at its own
  data-parallel degree. Our layouts have one DP degree, so each group's encoder work runs on its own
  replica, in the same microbatch as its LLM work.
* Configuration: DFLOP's Data-aware 3D Parallelism Optimizer picks each module's TP/PP/DP, and the
  GPU split between the modules, from the profiled input-shape distribution. Here Algorithm 2
  (``planning.config_search``) runs on one draw of a global batch (``entrain.core.planning.setups``).
  It searches each module's TP and CP on its own (they can differ where ``--tp`` is open), under one
  DP, with the GPU split proportional to the encoder's share of the work.
* Schedule: plain 1F1B on the disjoint encoder and LLM ranks (``one_f_one_b.generate``), as DFLOP
  runs.
* The scheduler runs inline when the plan is made; its CPU time is not simulated.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from entrain.core.assignment.batchers.common import StageTimes, check_fixed_size, plain_replica
from entrain.core.assignment.batchers.disttrain import fwd_bwd
from entrain.core.assignment.dp_split import check_batch
from entrain.core.ir.microbatches import IterationAssignment
from entrain.core.workload.work import SampleWork

__all__ = ["ILP_MAX_BINARIES", "ILP_NODE_LIMIT", "module_costs", "minmax_lpt", "ilp_groups", "assign_dflop"]

ILP_MAX_BINARIES = 4096
"""The ILP is solved only where ``N * m`` binaries are at most this many (else the LPT's groups)."""
ILP_NODE_LIMIT = 500
"""Branch-and-bound nodes HiGHS may explore (a node limit keeps the plan deterministic)."""


def module_costs(
    samples: Sequence[SampleWork], stage_times: StageTimes | None, encoder_stages: int | None
) -> np.ndarray:
    """``(N, 2)``: per sample, predicted ms per stage of the encoder and of the LLM (forward + backward
    over the module's stages, / its stage count); without ``stage_times``, the samples' raw work."""
    if stage_times is None:
        return np.array([[s.encoder, s.llm] for s in samples], dtype=float)
    rows = []
    for s in samples:
        f, b = fwd_bwd(stage_times([s]))
        t = f + b
        e = len(t) // 2 if encoder_stages is None else encoder_stages
        rows.append([t[:e].sum() / max(1, e), t[e:].sum() / max(1, len(t) - e)])
    return np.array(rows)


def minmax_lpt(costs: np.ndarray, groups: int) -> list[list[int]]:
    """Sample indices per group: sorted by largest module cost (desc, index asc), each to the group
    whose larger module load after adding it is smallest (ties: lowest group); the first ``groups``
    samples seed one group each, so none is empty."""
    order = sorted(range(len(costs)), key=lambda i: (-costs[i].max(), i))
    load = np.zeros((groups, costs.shape[1]))
    out: list[list[int]] = [[] for _ in range(groups)]
    for n, i in enumerate(order):
        g = n if n < groups else int(np.argmin((load + costs[i]).max(axis=1)))
        out[g].append(i)
        load[g] += costs[i]
    return out


def _objective(costs: np.ndarray, groups: list[list[int]]) -> float:
    return max(costs[g].sum(axis=0).max() for g in groups)


def ilp_groups(costs: np.ndarray, groups: int) -> list[list[int]] | None:
    """DFLOP's ILP (module docstring) by HiGHS; None where it found no feasible point in its limits."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix

    n, c = costs.shape
    nx = n * groups  # x[i, j] at i * groups + j, then C_max
    rows = n + groups + groups * c
    a = lil_matrix((rows, nx + 1))
    for i in range(n):
        a[i, i * groups : (i + 1) * groups] = 1.0
    for j in range(groups):
        a[n + j, j:nx:groups] = 1.0
        for k in range(c):
            r = n + groups + j * c + k
            a[r, j:nx:groups] = costs[:, k]
            a[r, nx] = -1.0
    lo = np.concatenate([np.ones(n), np.ones(groups), np.full(groups * c, -np.inf)])
    hi = np.concatenate([np.ones(n), np.full(groups, np.inf), np.zeros(groups * c)])
    obj = np.zeros(nx + 1)
    obj[nx] = 1.0
    integrality = np.concatenate([np.ones(nx), [0]])
    bounds = Bounds(np.zeros(nx + 1), np.concatenate([np.ones(nx), [np.inf]]))
    options = {"node_limit": ILP_NODE_LIMIT, "time_limit": 30.0, "presolve": True}
    res = milp(obj, constraints=LinearConstraint(a.tocsr(), lo, hi), integrality=integrality, bounds=bounds,
               options=options)  # fmt: skip
    if res.x is None:
        return None
    x = np.rint(res.x[:nx]).reshape(n, groups)
    return [list(np.flatnonzero(x[:, j] > 0.5)) for j in range(groups)]


def assign_dflop(
    batch: Sequence[SampleWork],
    dp: int,
    num_microbatches: int,
    *,
    stage_times: StageTimes | None = None,
    encoder_stages: int | None = None,
    **_: object,
) -> IterationAssignment:
    """DFLOP's partition of one global batch into ``dp * K`` variable-size microbatches."""
    check_batch(batch, dp, num_microbatches)
    encoder_stages = encoder_stages or getattr(stage_times, "encoder_stages", None)
    check_fixed_size(len(batch), dp, num_microbatches)  # the same global batch as every system
    costs = module_costs(batch, stage_times, encoder_stages)
    m = dp * num_microbatches
    groups = minmax_lpt(costs, m)
    if len(batch) * m <= ILP_MAX_BINARIES:
        exact = ilp_groups(costs, m)
        if exact is not None and all(exact) and _objective(costs, exact) < _objective(costs, groups):
            groups = exact
    per_replica = [[[batch[i] for i in sorted(groups[j])] for j in range(r, m, dp)] for r in range(dp)]
    return IterationAssignment(tuple(plain_replica(mbs) for mbs in per_replica))


def group_sizes(assignment: IterationAssignment) -> list[list[int]]:
    """Per replica, the size of each microbatch (DFLOP's vary)."""
    return [[len(mb) for mb in rep.encoder_microbatches] for rep in assignment.replicas]
