"""Discrete-event executor of a Plan under a cost model.

Model (documented assumptions):

* Each rank runs its action list in order, one action at a time. A compute action starts when the
  rank is free and its inputs exist (``entrain.core.ir.graph``); it lasts
  ``PlanCosts.compute_ms`` (per-call constant per (sub-)microbatch; raw-work samples split over
  stages by the stages' share of the per-layer linear costs — see ``entrain.core.schedules.action_costs``).
* ``SEND`` is asynchronous: it costs the sender nothing; the message arrives
  ``latency + bytes / bandwidth`` later. Links are not contended. ``RECV`` blocks the receiver until
  the message has arrived, and a consumer may use a remote input only after its rank ran the
  ``RECV`` (a plan receiving after use deadlocks, as it would at run time). A plan without communication actions (compute-only orders) gets the
  same transfer delays implicitly.
* Memory: a forward allocates its activation bytes on its rank at its start; the backward (``B``,
  or ``W`` when split) frees them at its end. Only activations are counted (no weights, optimizer
  state or received-message buffers); ``ReplicaRun.step_bytes`` keeps, per action, the most a rank
  holds while it runs, for ``entrain.sim.metrics`` to add the messages in flight at that step.
* Several encoders (``Layout.multi_encoder``): each encoder pipeline runs on its own ranks; the first
  LLM stage's ``RECV_F`` of an encoder message waits for every encoder's message of it (each priced
  by its sending stage), and its ``SEND_B`` sends each encoder its gradient.
* Replicas run independently; the iteration ends when every pipeline rank of every replica has
  finished and then all-reduced its gradients over DP (``PlanCosts.allreduce_ms``): iteration time
  = max over pipeline ranks r of (latest end of rank r over replicas + all-reduce of rank r), plus
  the end-of-step phase (clipping, the optimizer step, the step's own collectives: a constant and a
  part per trainable parameter byte of the heaviest rank, ``PlanCosts.step_end_ms``; 0 unless the
  profile sets it).
* Expert parallelism (a layout component with ``ep`` > 1): the replicas of an EP group (``ep``
  consecutive replicas, as the runtime groups them) meet at every sparse layer's all-to-all, so a
  compute action of a stage with mixture-of-experts layers lasts as long as the longest of that
  action over the group's replicas (each priced on its own samples: a heavier microbatch at the same
  position keeps the others waiting), and it starts on every replica of the group when the last of
  them can start it (``_Lockstep``: a replica whose input arrived early waits at the first
  all-to-all for the one whose input is late; the group's replicas are simulated together). The
  runtime runs only plans whose replicas of a group run the same computations on those stages
  (``runtime.expert_parallel.check_same_actions``); a group whose simulated programs differ there
  keeps the durations' coupling only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from entrain.core.costs.costmodel import CostModel
from entrain.core.errors import ScheduleError
from entrain.core.ir.graph import Message, ReplicaGraph
from entrain.core.ir.plan import Action, ActionKind, IterationPlan, Layout, Plan
from entrain.core.ir.validate import format_grid, messages_of
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.workers import ordered_map

__all__ = ["Span", "ReplicaRun", "IterationRun", "simulate_plan", "run_iteration", "run_replica"]

_F, _B, _I, _W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W
_EP = "ep"
"""Wait key tag: a rank blocked until its expert-parallel group's replicas all reached an action."""


@dataclass(frozen=True, slots=True)
class Span:
    """One executed compute action: global rank, action, start and end (ms from iteration start)."""

    rank: int
    action: Action
    start_ms: float
    end_ms: float


@dataclass
class ReplicaRun:
    replica: int
    num_microbatches: int
    busy_ms: dict[int, float]
    """Per global rank: summed compute time."""
    end_ms: dict[int, float]
    """Per global rank: end of its last action."""
    peak_bytes: dict[int, float]
    fwd_ms: dict[tuple[int, int, int], float]
    """(stage, mb, sub) -> forward duration."""
    bwd_ms: dict[tuple[int, int, int], float]
    spans: list[Span] = field(default_factory=list)
    memory: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    """Per global rank, (time, bytes after the change) steps; only when traced."""
    step_bytes: dict[int, list[float]] = field(default_factory=dict)
    """Per global rank, per action of its list: the most activation bytes it holds while that action
    runs (a forward's own, a backward's recomputation transient included)."""

    @property
    def makespan_ms(self) -> float:
        return max(self.end_ms.values(), default=0.0)


@dataclass
class IterationRun:
    replicas: list[ReplicaRun]
    iteration_time_ms: float
    allreduce_ms: dict[int, float]
    """Per pipeline rank."""
    step_end_ms: float = 0.0
    """The end-of-step phase after the last all-reduce (``PlanCosts.step_end_ms``), in ``iteration_time_ms``."""


def simulate_plan(
    plan: Plan,
    cost: CostModel,
    *,
    comm: bool = True,
    trace_iterations: int = 1,
    costs: PlanCosts | None = None,
) -> list[IterationRun]:
    """Run every iteration of ``plan``; spans and memory traces are kept for the first
    ``trace_iterations`` iterations. ``comm=False`` makes every transfer free. ``costs``: the plan's
    ``PlanCosts`` when the caller has them (their caches then serve its metrics too); a plan with
    several encoders needs them (``EncodersPlanCosts``: each encoder priced by its own cost model)."""
    if costs is None and plan.layout.multi_encoder:
        raise ScheduleError(
            f"plan {plan.system!r} has encoders {list(plan.layout.encoder_names)}: simulating it needs each "
            "encoder's cost model (pass costs=EncodersPlanCosts(...))"
        )
    costs = PlanCosts(plan.layout, cost, plan.samples) if costs is None else costs
    return [
        run_iteration(plan.layout, it, costs, comm=comm, trace=i < trace_iterations)
        for i, it in enumerate(plan.iterations)
    ]


def run_iteration(
    layout: Layout, it: IterationPlan, costs: PlanCosts, *, comm: bool = True, trace: bool = False
) -> IterationRun:

    ep = max(c.ep for c in layout.components.values())
    coupled = ep > 1 and any(costs.expert_stages)
    graphs = [ReplicaGraph(layout, it.microbatches[r]) for r in range(layout.dp)]

    def replica_actions(replica: int) -> dict[int, tuple[Action, ...]]:
        return {
            g: it.actions[g]
            for g in (layout.global_rank(replica, r) for r in range(layout.ranks_per_replica))
        }

    def run(first: int) -> list[ReplicaRun]:
        """The replicas of the EP group starting at ``first`` (one replica where none is coupled)."""
        group = range(first, min(first + (ep if coupled else 1), layout.dp))
        acts = {p: replica_actions(p) for p in group}
        lockstep = _Lockstep.of(costs, [acts[p] for p in group])
        reps = [
            _Replica(
                graphs[p], acts[p], costs, comm, trace, tuple(graphs[q] for q in group if q != p), lockstep, i
            )
            for i, p in enumerate(group)
        ]
        _run(reps, lockstep)
        return [_replica_run(rep, p) for rep, p in zip(reps, group)]

    starts = range(0, layout.dp, ep if coupled else 1)
    runs = [r for group in ordered_map(run, starts) for r in group]  # EP groups run independently
    allreduce = {r: costs.allreduce_ms(r) for r in range(layout.ranks_per_replica)}
    t = 0.0
    for r in range(layout.ranks_per_replica):
        last = max(run.end_ms[layout.global_rank(run.replica, r)] for run in runs)
        t = max(t, last + allreduce[r])
    tail = costs.step_end_ms()
    return IterationRun(runs, t + tail, allreduce, tail)


class _Lockstep:
    """Where an expert-parallel group's replicas meet: each compute action of a stage with
    mixture-of-experts layers starts on every replica of the group at the latest of their own start
    times (their ranks' all-to-alls pair up, so the first of them waits for the last one)."""

    def __init__(self, size: int):
        self.size = size
        self.starts: dict[Action, dict[int, float]] = {}
        """Per action, each replica's (position in the group) own start time, once it reached it."""
        self.waiting: dict[Action, list[tuple[int, int]]] = {}
        """Per action, the (replica position, rank) blocked on it."""
        self.pending: list[tuple[int, int]] = []
        """Woken (replica position, rank), for the run loop to advance."""

    @classmethod
    def of(cls, costs: PlanCosts, actions: list[dict[int, tuple[Action, ...]]]) -> _Lockstep | None:
        """The group's meeting points, or None: a group of one, no action on a stage with experts, or
        replicas whose ranks run different such actions or in another order (the runtime refuses
        those plans; their simulation keeps the durations' coupling only)."""
        if len(actions) < 2:
            return None
        programs = [
            [
                tuple(a for a in acts if a.kind.is_compute and costs.expert_stages[a.stage])
                for acts in rep.values()
            ]
            for rep in actions
        ]
        if not any(any(p) for p in programs) or any(p != programs[0] for p in programs):
            return None
        return cls(len(actions))

    def meet(self, pos: int, a: Action, start: float) -> float | None:
        """Replica ``pos`` can start ``a`` at ``start``: the group's start once every replica reached it
        (the ones blocked on it are woken), else None."""
        got = self.starts.setdefault(a, {})
        got.setdefault(pos, start)
        if len(got) < self.size:
            return None
        self.pending += self.waiting.pop(a, [])
        return max(got.values())

    def met(self, a: Action) -> bool:
        return len(self.starts.get(a, ())) == self.size


class _Replica:
    """Event-driven in-order execution of one replica's ranks."""

    def __init__(
        self,
        graph: ReplicaGraph,
        actions: dict,
        costs: PlanCosts,
        comm: bool,
        trace: bool,
        peers: tuple = (),
        lockstep: _Lockstep | None = None,
        pos: int = 0,
    ):
        self.graph, self.actions, self.costs, self.comm, self.trace = graph, actions, costs, comm, trace
        self.peers = peers
        """The other replicas of this one's expert-parallel group (their graphs; empty: none)."""
        self.lockstep, self.pos = lockstep, pos
        """The group's meeting points (None: this replica starts its actions on its own) and this
        replica's position in the group."""
        self.has_comm_actions = any(a.kind.is_comm for acts in actions.values() for a in acts)
        self.ends: dict[tuple, float] = {}
        self.arrival: dict[Message, float] = {}
        self.waiters: dict[object, list[int]] = {}
        self.ptr = dict.fromkeys(actions, 0)
        self.clock = dict.fromkeys(actions, 0.0)
        self.busy = dict.fromkeys(actions, 0.0)
        self.mem = dict.fromkeys(actions, 0.0)
        self.peak = dict.fromkeys(actions, 0.0)
        self.memory = {g: [(0.0, 0.0)] for g in actions} if trace else {}
        self.fwd_ms: dict[tuple[int, int, int], float] = {}
        self.bwd_ms: dict[tuple[int, int, int], float] = {}
        self.spans: list[Span] = []
        self.held: dict[tuple[int, int, int], float] = {}
        self.step_bytes: dict[int, list[float]] = {g: [] for g in actions}
        self._step_high = 0.0
        self._pending_wake: list[int] = []
        self.received: dict[Message, float] = {}

    # --- availability --------------------------------------------------------------------------
    def _transfer_ms(self, msg: Message) -> float:
        if not self.comm:
            return 0.0
        fwd_stage = msg.src if msg.kind == "F" else msg.dst
        return self.costs.message_ms(fwd_stage, self.graph.ids(fwd_stage, msg.mb, msg.sub))

    def _msg_ready(self, msg: Message) -> float | None:
        """Time the message is usable by its consumer, or None (not yet known)."""
        if self.graph.is_remote(msg):
            # with communication actions, a message is usable once this rank has run its RECV
            return self.received.get(msg) if self.has_comm_actions else self.arrival.get(msg)
        if msg.kind == "F":
            return self.ends.get(("F", msg.src, msg.mb, msg.sub))
        times = [self.ends.get(("B", *t)) for t in self.graph.bwd_producers(msg)]
        return None if None in times else max(times, default=0.0)

    def _inputs(self, a: Action) -> list[Message]:
        u = a.sub_index
        if a.kind is _F:
            return self.graph.fwd_inputs(a.stage, a.mb, u)
        if a.kind in (_B, _I):
            return self.graph.bwd_inputs(a.stage, a.mb, u)
        return []

    def _ready_time(self, a: Action) -> tuple[float | None, object]:
        """(time the action's inputs exist, key to wait on if unknown)."""
        t = 0.0
        u = a.sub_index
        if a.kind in (_B, _I):
            own = self.ends.get(("F", a.stage, a.mb, u))
            if own is None:
                return None, ("F", a.stage, a.mb, u)
            t = own
        if a.kind is _W:
            own = self.ends.get(("I", a.stage, a.mb, u))
            return (own, ("I", a.stage, a.mb, u)) if own is None else (own, None)
        for msg in self._inputs(a):
            r = self._msg_ready(msg)
            if r is None:
                return None, self._wait_key(msg)
            t = max(t, r)
        return t, None

    def _wait_key(self, msg: Message) -> object:
        if self.graph.is_remote(msg):
            return ("recv", msg) if self.has_comm_actions else msg
        if msg.kind == "F":
            return ("F", msg.src, msg.mb, msg.sub)
        pending = [("B", *t) for t in self.graph.bwd_producers(msg) if ("B", *t) not in self.ends]
        return pending[0]

    # --- execution -----------------------------------------------------------------------------
    def _wake(self, key: object) -> list[int]:
        return self.waiters.pop(key, [])

    def _advance(self, g: int) -> object | None:
        """Run rank g until it blocks (returns the wait key) or finishes (None)."""
        acts = self.actions[g]
        woken: list[int] = []
        while self.ptr[g] < len(acts):
            a = acts[self.ptr[g]]
            self._step_high = self.mem[g]
            if a.kind.is_compute:
                ready, key = self._ready_time(a)
                if ready is None:
                    self._requeue(woken)
                    return key
                start = max(ready, self.clock[g])
                if self.lockstep is not None and self.costs.expert_stages[a.stage]:
                    met = self.lockstep.meet(self.pos, a, start)
                    if met is None:
                        self._requeue(woken)
                        return (_EP, a)
                    start = met
                woken += self._compute(g, a, start)
            elif a.kind in (ActionKind.RECV_F, ActionKind.RECV_B):
                msgs = messages_of(self.graph.layout, a)  # one per encoder at a multi-encoder boundary
                missing = next((m for m in msgs if m not in self.arrival), None)
                if missing is not None:
                    self._requeue(woken)
                    return missing
                self.clock[g] = max([self.clock[g], *(self.arrival[m] for m in msgs)])
                for msg in msgs:
                    self.received[msg] = self.clock[g]
            else:
                for msg in messages_of(self.graph.layout, a):
                    self.arrival[msg] = self.clock[g] + self._transfer_ms(msg)
                    woken += self._wake(msg)
            self.step_bytes[g].append(self._step_high)
            self.ptr[g] += 1
        self._requeue(woken)
        return None

    def _requeue(self, ranks: list[int]) -> None:
        self._pending_wake.extend(ranks)

    def _compute(self, g: int, a: Action, start: float) -> list[int]:
        u = a.sub_index
        task = (a.stage, a.mb, u)
        ids = self.graph.ids(*task)
        dur = self.costs.compute_ms(a.stage, a.kind, ids)
        if self.peers and self.costs.expert_stages[a.stage]:
            dur = max(dur, *(self._peer_ms(p, a, task) for p in self.peers))
        end = start + dur
        self.clock[g] = end
        self.busy[g] += dur
        if self.trace:
            self.spans.append(Span(g, a, start, end))
        woken: list[int] = []
        if a.kind is _F:
            self.fwd_ms[task] = dur
            act = self.costs.activation_bytes(a.stage, ids)
            self.held[task] = act
            self._mem(g, start, act)
            self.ends[("F", *task)] = end
            woken += self._wake(("F", *task))
            if not self.has_comm_actions:
                for msg in self.graph.fwd_outputs(*task):
                    if self.graph.is_remote(msg):
                        self.arrival[msg] = end + self._transfer_ms(msg)
                        woken += self._wake(msg)
        else:
            self.bwd_ms[task] = self.bwd_ms.get(task, 0.0) + dur
            if a.kind in (_B, _I):  # recomputed activations exist while the backward runs
                transient = self.costs.recompute_transient_bytes(a.stage, ids)
                if transient > 0:
                    self._mem(g, start, transient)
                    self._mem(g, end, -transient)
            if a.kind in (_B, _W):
                self._mem(g, end, -self.held.pop(task, 0.0))
            key = ("I" if a.kind is _I else "W" if a.kind is _W else "B", *task)
            self.ends[key] = end
            if a.kind is _I:
                self.ends[("B", *task)] = end
                woken += self._wake(("B", *task))
            woken += self._wake(key)
            if not self.has_comm_actions and a.kind in (_B, _I):
                woken += self._implicit_grad_sends(task)
        return woken

    def _peer_ms(self, peer: ReplicaGraph, a: Action, task: tuple[int, int, int]) -> float:
        """``a``'s duration on an EP peer replica's samples of the same (stage, mb, sub); 0 where it has none."""
        stage, mb, sub = task
        if mb >= len(peer.microbatches) or sub >= peer.num_subs(stage, mb):
            return 0.0
        return self.costs.compute_ms(stage, a.kind, peer.ids(*task))

    def _implicit_grad_sends(self, task: tuple[int, int, int]) -> list[int]:
        woken: list[int] = []
        for msg in self.graph.bwd_outputs(*task):
            if not self.graph.is_remote(msg) or msg in self.arrival:
                continue
            times = [self.ends.get(("B", *t)) for t in self.graph.bwd_producers(msg)]
            if None not in times:
                self.arrival[msg] = max(times) + self._transfer_ms(msg)
                woken += self._wake(msg)
        return woken

    def _mem(self, g: int, t: float, delta: float) -> None:
        self.mem[g] += delta
        self.peak[g] = max(self.peak[g], self.mem[g])
        self._step_high = max(self._step_high, self.mem[g])
        if self.trace:
            self.memory[g].append((t, self.mem[g]))


def _run(reps: list[_Replica], lockstep: _Lockstep | None = None) -> None:
    """Advance the ranks of ``reps`` (one replica, or an expert-parallel group's that meet at
    ``lockstep``) until every one finished; ScheduleError on a deadlock."""
    stack = [(i, g) for i in reversed(range(len(reps))) for g in sorted(reps[i].actions, reverse=True)]
    waiting: list[dict[int, object]] = [{} for _ in reps]
    while stack:
        i, g = stack.pop()
        rep = reps[i]
        waiting[i].pop(g, None)
        key = rep._advance(g)
        if key is not None:
            if _resolved(rep, key, lockstep):
                stack.append((i, g))
            else:
                if isinstance(key, tuple) and key[0] == _EP:
                    lockstep.waiting.setdefault(key[1], []).append((i, g))
                else:
                    rep.waiters.setdefault(key, []).append(g)
                waiting[i][g] = key
        stack.extend((i, w) for w in rep._pending_wake)
        rep._pending_wake = []
        if lockstep is not None:
            stack.extend(lockstep.pending)
            lockstep.pending = []
    for rep, waits in zip(reps, waiting):
        _no_deadlock(rep, waits)


def _no_deadlock(rep: _Replica, waiting: dict[int, object]) -> None:
    blocked = {g: p for g, p in rep.ptr.items() if p < len(rep.actions[g])}
    if not blocked:
        return
    # blame a rank stuck on its own missing receive or local input before ranks waiting on peers
    local = [g for g in sorted(blocked) if not isinstance(waiting.get(g), Message)]
    g0 = local[0] if local else min(blocked)
    lines = "; ".join(f"rank {g} step {p} ({rep.actions[g][p]})" for g, p in sorted(blocked.items()))
    group = any(isinstance(k, tuple) and k[0] == _EP for k in waiting.values())
    raise ScheduleError(
        f"deadlock in simulation: rank {g0} step {blocked[g0]} ({rep.actions[g0][blocked[g0]]}) never becomes "
        f"ready; blocked: {lines}"
        + (" (some wait for their expert-parallel group's other replicas at an all-to-all)" if group else "")
        + "\n"
        + format_grid({g: list(a) for g, a in rep.actions.items()}, blocked, primary=g0)
    )


def _resolved(rep: _Replica, key: object, lockstep: _Lockstep | None = None) -> bool:
    if isinstance(key, Message):
        return key in rep.arrival
    if key[0] == "recv":
        return key[1] in rep.received
    if key[0] == _EP:
        return lockstep is not None and lockstep.met(key[1])
    return key in rep.ends


def _replica_run(rep: _Replica, replica: int) -> ReplicaRun:
    return ReplicaRun(
        replica=replica,
        num_microbatches=len(rep.graph.microbatches),
        busy_ms=rep.busy,
        end_ms=dict(rep.clock),
        peak_bytes=rep.peak,
        fwd_ms=rep.fwd_ms,
        bwd_ms=rep.bwd_ms,
        spans=rep.spans,
        memory=rep.memory,
        step_bytes=rep.step_bytes,
    )


def run_replica(
    graph: ReplicaGraph,
    actions: dict[int, tuple[Action, ...]],
    costs: PlanCosts,
    replica: int = 0,
    *,
    comm: bool = True,
    trace: bool = False,
    peers: tuple = (),
) -> ReplicaRun:
    """One replica on its own (``peers``: its EP group's other replicas' graphs, whose durations its
    actions on stages with experts take when longer; their start times are not known here:
    ``run_iteration`` simulates a group together)."""
    rep = _Replica(graph, actions, costs, comm, trace, peers)
    _run([rep])
    return _replica_run(rep, replica)
