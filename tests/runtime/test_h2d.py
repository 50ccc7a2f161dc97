"""On a GPU the rendered inputs are copied from pinned memory without
blocking, the next forward's on a side stream while the current one computes (``entrain.runtime.h2d``);
on the CPU nothing changes. CUDA is faked: tensors and streams that record what they were asked."""

from __future__ import annotations

import torch

from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_vlm
from entrain.runtime import h2d
from entrain.runtime.data import SampleRenderer
from entrain.runtime.trainer import OptimConfig, PipelineTrainer

from .cases import SEED, batch_metas, plan_for, works
from .harness import run_workers

CUDA = torch.device("cuda", 0)


class FakeHostTensor:
    """Records ``pin_memory`` and ``to`` calls; ``to`` returns a tensor of the requested dtype."""

    def __init__(self, log: list, dtype=torch.float32):
        self.log, self.dtype = log, dtype

    def pin_memory(self):
        self.log.append("pin_memory")
        return self

    def to(self, *args, **kwargs):
        self.log.append(("to", args, kwargs))
        dtype = next((a for a in args if isinstance(a, torch.dtype)), self.dtype)
        return FakeHostTensor(self.log, dtype)


def test_a_cuda_copy_is_pinned_and_non_blocking_then_cast_on_the_device():
    log = []
    out = h2d.host_to_device(FakeHostTensor(log), CUDA, torch.bfloat16)
    assert log == ["pin_memory", ("to", (CUDA,), {"non_blocking": True}), ("to", (torch.bfloat16,), {})]
    assert out.dtype == torch.bfloat16


def test_a_cpu_copy_is_a_plain_to():
    log = []
    h2d.host_to_device(FakeHostTensor(log), torch.device("cpu"), torch.float64)
    assert log == [("to", (torch.device("cpu"), torch.float64), {})]


class FakeCuda:
    """``torch.cuda``'s streams and events as a log: where each input was built and what waited."""

    def __init__(self, monkeypatch):
        self.log, self.current = [], "compute"
        fake = self

        class Stream:
            def __init__(self, device):
                self.name = "side"

            def wait_event(self, event):
                fake.log.append(("wait", self.name, event.tag))

        class Event:
            def record(self, stream):
                self.tag = fake.log[-1][1]  # the input just built
                fake.log.append(("record", stream.name, self.tag))

        class StreamContext:
            def __init__(self, stream):
                self.stream = stream

            def __enter__(self):
                fake.current = self.stream.name

            def __exit__(self, *exc):
                fake.current = "compute"

        compute = Stream(None)
        compute.name = "compute"
        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "stream", StreamContext)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: compute)

    def build(self, key: str):
        def run():
            self.log.append(("build", key, self.current))
            return torch.zeros(1)  # a CPU tensor: no record_stream

        return run


def test_the_next_input_is_copied_on_a_side_stream_and_waited_for(monkeypatch):
    cuda = FakeCuda(monkeypatch)
    pre = h2d.InputPrefetcher(CUDA)
    pre.expect([("a", cuda.build("a")), ("b", cuda.build("b"))])
    assert cuda.log == [("build", "a", "side"), ("record", "side", "a")]
    pre.take("a", cuda.build("a-again"))
    assert cuda.log[2:] == [("wait", "compute", "a"), ("build", "b", "side"), ("record", "side", "b")]
    pre.take("x", cuda.build("x"))  # not announced: built at once, on the compute stream
    assert cuda.log[5:] == [("build", "x", "compute")]
    pre.take("b", cuda.build("b-again"))
    assert cuda.log[6:] == [("wait", "compute", "b")]


def _asked_and_announced(env, plan):
    cfg = get_model_config("tiny")
    renderer = SampleRenderer(cfg, {m.id: m for m in batch_metas()}, seed=SEED)
    asked = []
    for name, kind in (("encoder_input", "encoder"), ("llm_batch", "llm")):
        method = getattr(renderer, name)
        setattr(renderer, name, lambda ids, *a, m=method, k=kind: asked.append((k, tuple(ids))) or m(ids, *a))
    trainer = PipelineTrainer(
        layout=plan.layout, model=build_vlm(cfg, seed=SEED), env=env, renderer=renderer, optim=OptimConfig()
    )
    it = plan.iterations[0]
    announced = trainer._forward_inputs(it, it.actions[trainer.place.plan_rank])
    trainer.train_step(it)
    return asked, announced


def test_the_announced_inputs_are_those_the_forwards_ask_for_in_order(tmp_path):
    plan = plan_for("1f1b", 2, 2, 1, 4, works(batch_metas()))
    results = run_workers(_asked_and_announced, plan.layout.world_size, tmp_path, plan)
    for asked, announced in results:  # the second encoder stage's rank asks for none
        assert asked == announced
    assert {kind for asked, _ in results for kind, _ in asked} == {"encoder", "llm"}
