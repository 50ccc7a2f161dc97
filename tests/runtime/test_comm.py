"""Transport (metadata first, match by key), layout refusals, learning-rate schedule, weights folder."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from entrain.core.errors import ConfigError
from entrain.core.ir.plan import ComponentLayout, Layout, StageSpec
from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_vlm
from entrain.runtime.comm import MessageKey, Transport
from entrain.runtime.data import SampleRenderer
from entrain.runtime.distributed import check_runtime_layout
from entrain.runtime.trainer import OptimConfig, PipelineTrainer, lr_factor

from .cases import batch_metas, plan_for, works
from .harness import run_workers


def _exchange(env):
    t = Transport(env.device, me=env.rank)
    a, b = MessageKey(0, False, 0, 0), MessageKey(0, False, 1, 1)
    if env.rank == 0:
        t.send(torch.arange(6.0).reshape(2, 3), 1, a, ["x", "y"])
        t.send(torch.ones(5, 1, 2, dtype=torch.bfloat16), 1, b, ["z"])
        t.send(torch.zeros(3), 1, MessageKey(0, True, 2, 0), ["w"])
        t.wait_all()
        return None
    t.receive(0, a, ["x", "y"])  # sized by its header
    t.receive(0, b, ["z"])
    got_b, got_a = t.take(0, b), t.take(0, a)  # taken in another order than received
    try:
        t.receive(0, MessageKey(0, True, 2, 0), ["not-w"])
        error = None
    except RuntimeError as e:
        error = str(e)
    return got_a, got_b, error


def test_variable_shapes_arrive_in_order_and_ids_are_checked(tmp_path):
    _, (got_a, got_b, error) = run_workers(_exchange, 2, tmp_path)
    torch.testing.assert_close(got_a, torch.arange(6.0).reshape(2, 3))
    assert got_b.dtype == torch.bfloat16 and got_b.shape == (5, 1, 2)
    assert error is not None and "other sample ids" in error and "0SEND_B2.0" in error


def _known_shapes(env):
    """Messages of a shape the receiver knows: header and data in one batch, the header checked at
    ``wait_all`` -- a message whose header disagrees with the Plan is named there."""
    t = Transport(env.device, me=env.rank)
    keys = [MessageKey(1, True, mb, 0) for mb in range(3)]
    if env.rank == 0:
        t.send(torch.full((2, 3), 1.0), 1, keys[0], ["a"])
        t.send(torch.full((4,), 2.0), 1, keys[1], ["b"])
        t.send(torch.full((4,), 3.0), 1, keys[2], ["c"])  # the receiver expects ids ["other"]
        t.wait_all()
        return None
    for key, ids, like in zip(
        keys, (["a"], ["b"], ["other"]), (torch.empty(2, 3), torch.empty(4), torch.empty(4))
    ):
        t.receive(0, key, ids, like=like)
    assert len(t.checks) == 3  # none went through the header-first path
    got = [t.take(0, k) for k in keys]
    try:
        t.wait_all()
        error = None
    except RuntimeError as e:
        error = str(e)
    return *got, error


def test_known_shapes_are_received_in_one_batch_and_their_headers_checked(tmp_path):
    _, (first, second, third, error) = run_workers(_known_shapes, 2, tmp_path)
    torch.testing.assert_close(first, torch.full((2, 3), 1.0))
    torch.testing.assert_close(second, torch.full((4,), 2.0))
    torch.testing.assert_close(third, torch.full((4,), 3.0))
    assert error is not None and "message 1SEND_B2.0 from rank 0" in error and "the Plan says" in error


def _rendezvous(env):
    """A gloo send does not complete before its receive is posted (what NCCL does): the transport's
    semantics on gloo are NCCL's, so the CPU tests exercise the GPU's ordering."""
    t = torch.ones(4)
    if env.rank == 0:
        work = dist.isend(t, 1)
        polls = 0
        while not work.is_completed() and polls < 400:
            time.sleep(0.005)
            polls += 1
        early = work.is_completed()
        dist.barrier()  # now rank 1 posts its receive
        work.wait()
        return early
    dist.barrier()
    dist.recv(torch.empty(4), 0)
    return None


def test_a_gloo_send_waits_for_its_receive(tmp_path):
    early, _ = run_workers(_rendezvous, 2, tmp_path)
    assert early is False


def _preposted(env):
    """A receive posted ahead (``Transport.prepost``) lets the sender's rendezvous complete before the
    receive's action: the sender waits for both its sends before the receiver runs any receive (without
    the receives posted ahead that wait would time out); the action then takes the message, header
    checked, and one posted ahead but never taken is named at the end of the step."""
    t = Transport(env.device, timeout_s=10.0, me=env.rank, prepost_gradients=True)
    keys = [MessageKey(1, True, mb, 0) for mb in range(2)]
    if env.rank == 0:
        dist.barrier()  # rank 1 has posted both receives ahead
        t.send(torch.full((3,), 7.0), 1, keys[0], ["a"])
        t.send(torch.full((3,), 8.0), 1, keys[1], ["b"])
        t.wait_all()  # both sends complete: the receives were posted
        dist.barrier()  # only now does rank 1 run a receive action
        return None
    for key in keys:
        t.prepost(0, key, torch.empty(3))
    dist.barrier()
    dist.barrier()
    t.receive(0, keys[0], ["a"], like=torch.empty(3))
    got = t.take(0, keys[0])
    try:
        t.wait_all()  # keys[1] was posted ahead but never taken
        error = None
    except RuntimeError as e:
        error = str(e)
    return got, t.num_preposted, error


def test_a_receive_posted_ahead_completes_the_send_before_its_action(tmp_path):
    _, (got, num_preposted, error) = run_workers(_preposted, 2, tmp_path)
    torch.testing.assert_close(got, torch.full((3,), 7.0))
    assert num_preposted == 2
    assert error is not None and "1SEND_B1.0 from rank 0" in error and "never taken" in error


def _layout(tp: int = 1, cp: int = 1) -> Layout:
    stages = (StageSpec(0, "encoder", 0, 4, 0), StageSpec(1, "llm", 0, 6, 1))
    comps = {"encoder": ComponentLayout(tp=1, pp=1), "llm": ComponentLayout(tp=tp, cp=cp, pp=1)}
    return Layout(dp=1, microbatch_size=1, num_microbatches=2, components=comps, stages=stages)


def test_tp_and_cp_plans_are_refused_naming_component_and_degree():
    check_runtime_layout(_layout(), 2)
    with pytest.raises(ConfigError, match="llm has TP = 4"):
        check_runtime_layout(_layout(tp=4))
    with pytest.raises(ConfigError, match="llm has CP = 2"):
        check_runtime_layout(_layout(cp=2))
    with pytest.raises(ConfigError, match="needs 2 processes"):
        check_runtime_layout(_layout(), 3)


def test_lr_warmup_then_cosine():
    cfg = OptimConfig(lr=1.0, warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    values = [lr_factor(s, cfg) for s in range(16)]
    assert values[:4] == [0.25, 0.5, 0.75, 1.0]
    assert values[4] == pytest.approx(1.0)
    assert values[9] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert values[14] == pytest.approx(0.1) and values[15] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(values[3:], values[4:]))


def test_weights_folder_round_trip(tmp_path):
    from safetensors.torch import save_file

    cfg = get_model_config("tiny")
    model = build_vlm(cfg, seed=3)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    loaded = build_vlm(cfg, seed=0, weights_dir=str(tmp_path))
    for (name, p), (_, q) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(p, q), name
    with pytest.raises(ConfigError, match="does not exist"):
        build_vlm(cfg, weights_dir=str(tmp_path / "missing"))


def test_an_action_error_names_the_error_a_torch_message_wraps():
    """torch's split backward raises a message that starts with a blank line, from the real error:
    the one line names both (it named neither: 'failed: RuntimeError: ')."""
    from entrain.core.ir.plan import Action, ActionKind
    from entrain.runtime.step_errors import ExecutionError

    try:
        try:
            raise RuntimeError("Can't detach views in-place. Use detach() instead.\nmore")
        except RuntimeError as inner:
            raise RuntimeError(
                "\n        Failed to run stage backward input:\n        Stage output: [...]"
            ) from inner
    except RuntimeError as e:
        message = str(ExecutionError(0, Action(1, ActionKind("I"), 0), None, e))
    assert message == (
        "rank 0: action 1I0 (stage 1, microbatch 0, sub 0) failed: RuntimeError: Failed to run stage "
        "backward input: <- RuntimeError: Can't detach views in-place. Use detach() instead."
    )


def _stalled_peer(env, plan, folder, warm_up=True):
    """Rank 1 stalls (after connecting its channels when ``warm_up``) while rank 0 runs its step."""
    import time

    from entrain.core.ir.p2p import warmup_batches
    from entrain.runtime.step_errors import ExecutionError, WarmUpError

    cfg = get_model_config("tiny")
    metas = {m.id: m for m in batch_metas()}
    trainer = PipelineTrainer(
        layout=plan.layout,
        model=build_vlm(cfg, seed=0),
        env=env,
        renderer=SampleRenderer(cfg, metas),
        optim=OptimConfig(),
    )
    if warm_up:  # both ranks connect first: the stall is mid-step
        trainer.executor.transport.warm_up(warmup_batches(plan.layout, env.rank))
    running = Path(folder) / "rank0-waiting"
    if env.rank == 1:  # the LLM rank never runs its actions; it leaves once rank 0 is waiting on it
        deadline = time.monotonic() + 50  # however long rank 0 takes to get there on a loaded machine
        while not running.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)
        return None
    transport, wait = trainer.executor.transport, trainer.executor.transport._wait

    def first_wait(works):  # every operation before this wait has been posted
        running.touch()
        wait(works)

    transport._wait = first_wait
    it = plan.iterations[0]
    t0 = time.monotonic()
    try:
        trainer.executor.run(it, it.actions[0], loss_scale=1.0)
    except ExecutionError as e:
        return str(e), e.peer, time.monotonic() - t0
    except WarmUpError as e:
        return str(e), None, time.monotonic() - t0
    return None


def test_a_stalled_peer_fails_with_rank_action_and_peer(tmp_path):
    plan = plan_for("1f1b", 1, 1, 1, 4, works(batch_metas()))
    (message, peer, waited_s), _ = run_workers(
        _stalled_peer, 2, tmp_path, plan, str(tmp_path), pg_timeout_s=2, clean_shutdown=False
    )
    assert peer == 1 and waited_s < 30
    assert message.startswith("rank 0: action 0RECV_B0 (stage 0, microbatch 0, sub 0) with rank 1 failed")


def test_a_peer_that_never_connects_fails_the_warm_up_naming_the_channel(tmp_path):
    """The first step opens with the channel warm-up (``entrain.core.ir.p2p.WarmUp``); a peer that never
    gets there is named by its channel, not mistaken for a mid-step stall."""
    plan = plan_for("1f1b", 1, 1, 1, 4, works(batch_metas()))
    (message, _, waited_s), _ = run_workers(
        _stalled_peer, 2, tmp_path, plan, str(tmp_path), False, pg_timeout_s=2, clean_shutdown=False
    )
    assert waited_s < 30
    assert message.startswith("rank 0: connecting its point-to-point channels before its first step failed")
    assert "the warm-up of channel 1 -> 0" in message


class _FakeSend:
    """A send's work: completed once its receiver has posted (``done``), as NCCL's event says."""

    def __init__(self):
        self.done, self.waited = False, 0

    def is_completed(self) -> bool:
        return self.done

    def wait(self, timeout=None) -> bool:
        self.waited += 1
        return True


def test_a_sent_tensor_is_released_when_its_send_completes_not_at_the_end_of_the_step(monkeypatch):
    """``Transport.release_sent`` at the next send drops a completed send with its tensors and keeps
    the one in flight. (gloo's send work says it completed only once waited on, so there the tensors
    wait for ``wait_all``; NCCL's work answers from its CUDA event.)"""
    import gc
    import weakref

    works: list[_FakeSend] = []

    def batch(self, op, tensors, peer, group):
        works.append(_FakeSend())
        return [works[-1]]

    monkeypatch.setattr(Transport, "_batch", batch)
    t = Transport(torch.device("cpu"), me=0)
    first, second = torch.arange(6.0), torch.ones(2)
    alive = weakref.ref(first)
    t.send(first, 1, MessageKey(0, False, 0, 0), ["a"])
    del first
    t.send(second, 1, MessageKey(0, False, 1, 0), ["b"])
    gc.collect()
    assert alive() is not None and len(t.pending) == 2  # in flight: held
    works[0].done = True
    t.send(torch.zeros(1), 1, MessageKey(0, False, 2, 0), ["c"])
    gc.collect()
    assert alive() is None and works[0].waited == 1  # completed: released (its error raised, if any)
    assert [w for w, _ in t.pending] == works[1:]
