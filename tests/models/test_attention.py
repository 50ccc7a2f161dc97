"""Which attention path runs (flash varlen or one SDPA call per sequence), the dtypes q, k and v reach
the varlen kernel in under autocast, and (on a GPU) equality of the two paths, forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from entrain.core.workload.samples import SampleMeta
from entrain.models.families import packed_attention as attention
from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_stage, build_vlm
from entrain.models.families.packed_attention import PER_SEQUENCE_SDPA, VARLEN, choose_attention_path
from entrain.runtime.data import SampleRenderer

torch.set_num_threads(1)

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
H100, A100, RTX4090, V100, RTX5090 = (9, 0), (8, 0), (8, 9), (7, 0), (12, 0)

# (case, keyword arguments of choose_attention_path, path, kernel dtype, words of the reason)
CASES = [
    ("bf16 autocast, RoPE-promoted q/k", dict(dtypes=(FP32, FP32, BF16), autocast_dtype=BF16), VARLEN, BF16, "bfloat16"),
    ("fp16 autocast", dict(dtypes=(FP32, FP32, FP16), autocast_dtype=FP16), VARLEN, FP16, "float16"),
    ("bf16 weights, no autocast", dict(dtypes=(BF16, BF16, BF16)), VARLEN, BF16, "sm90"),
    ("fp32 without autocast", dict(dtypes=(FP32, FP32, FP32)), PER_SEQUENCE_SDPA, None, "without autocast"),
    ("mixed halves without autocast", dict(dtypes=(BF16, FP16, BF16)), PER_SEQUENCE_SDPA, None, "float32"),
    ("fp32 autocast dtype", dict(dtypes=(FP32,) * 3, autocast_dtype=FP32), PER_SEQUENCE_SDPA, None, "autocast dtype"),
    ("cpu", dict(device_type="cpu", capability=None, autocast_dtype=BF16), PER_SEQUENCE_SDPA, None, "CUDA only"),
    ("no varlen in torch", dict(kernel_available=False, autocast_dtype=BF16), PER_SEQUENCE_SDPA, None, "varlen"),
    ("V100", dict(capability=V100, autocast_dtype=FP16), PER_SEQUENCE_SDPA, None, "sm70"),
    ("unknown capability", dict(capability=None, autocast_dtype=BF16), PER_SEQUENCE_SDPA, None, "unknown"),
    ("future sm130", dict(capability=(13, 0), autocast_dtype=BF16), PER_SEQUENCE_SDPA, None, "sm130"),
    ("A100", dict(capability=A100, autocast_dtype=BF16), VARLEN, BF16, "sm80"),
    ("head 256", dict(head_dim=256, autocast_dtype=BF16), VARLEN, BF16, "256"),
    ("head 288", dict(head_dim=288, autocast_dtype=BF16), PER_SEQUENCE_SDPA, None, "above"),
    ("head 200 training on sm89", dict(head_dim=200, capability=RTX4090, autocast_dtype=BF16), PER_SEQUENCE_SDPA, None, "backward"),
    ("head 200 training on sm120", dict(head_dim=200, capability=RTX5090, autocast_dtype=BF16), PER_SEQUENCE_SDPA, None, "backward"),
    ("head 200 inference on sm89", dict(head_dim=200, capability=RTX4090, autocast_dtype=BF16, needs_grad=False), VARLEN, BF16, "200"),
    ("head 200 training on sm90", dict(head_dim=200, autocast_dtype=BF16), VARLEN, BF16, "200"),
    ("two batch rows", dict(rows=2, autocast_dtype=BF16), PER_SEQUENCE_SDPA, None, "rows"),
    ("attention dropout", dict(dropout=0.1, autocast_dtype=BF16), PER_SEQUENCE_SDPA, None, "dropout 0.1"),
]  # fmt: skip


@pytest.mark.parametrize("case,kwargs,path,dtype,reason", CASES, ids=[c[0] for c in CASES])
def test_path_choice(case, kwargs, path, dtype, reason):
    args = dict(device_type="cuda", dtypes=(BF16,) * 3, head_dim=128, capability=H100)
    chosen = choose_attention_path(**{**args, **kwargs})
    assert (chosen.name, chosen.dtype) == (path, dtype), chosen
    assert reason in chosen.reason


# --- the varlen plumbing on the CPU, with a recording stand-in for the kernel -------------------------
def _reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, window_size, enable_gqa):
    """What the flash kernel computes, per sequence, from its packed ``[T, heads, D]`` layout."""
    outs = []
    for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
        qs, ks, vs = (t[a:b].transpose(0, 1).float() for t in (q, k, v))
        o = F.scaled_dot_product_attention(
            qs, ks, vs, is_causal=tuple(window_size) == (-1, 0), scale=scale, enable_gqa=enable_gqa
        )
        outs.append(o.transpose(0, 1).to(q.dtype))
    return torch.cat(outs)


def _install_fake_gpu(monkeypatch) -> list[dict]:
    """The path choice sees an sm90 GPU with the kernel; the kernel records its calls."""
    calls = []

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
        calls.append({"dtypes": {q.dtype, k.dtype, v.dtype}, "cu": cu_q.tolist(), "max": max_q, **kw})
        return _reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw)

    monkeypatch.setattr(attention, "_device_facts", lambda device: ("cuda", (9, 0)))
    monkeypatch.setattr(attention, "_kernel_available", lambda: True)
    monkeypatch.setattr(attention, "_varlen_kernel", kernel)
    return calls


@pytest.fixture
def fake_gpu(monkeypatch):
    return _install_fake_gpu(monkeypatch)


@pytest.fixture(scope="module")
def tiny():
    cfg = get_model_config("tiny")
    metas = {
        "a": SampleMeta("a", ((56, 84),), 30),
        "b": SampleMeta("b", ((112, 56), (56, 56)), 45),
        "t1": SampleMeta("t1", (), 20),
        "t2": SampleMeta("t2", (), 13),
        "t3": SampleMeta("t3", (), 7),
    }
    return cfg, build_vlm(cfg, seed=0), SampleRenderer(cfg, metas, seed=0)


def _llm_run(model, r, device_type: str):
    """Hidden states and decoder-layer gradients of three packed text samples under bf16 autocast."""
    n = len(model.cfg.llm_layer_names)
    body = build_stage(model, "llm", 0, n - 3)
    batch = r.llm_batch(["t1", "t2", "t3"], 1.0)
    model.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=BF16):
        out = body(None, batch)
    out.float().square().mean().backward()
    grads = {
        k: p.grad.clone() for k, p in model.llm.named_parameters() if ".layers." in k and p.grad is not None
    }
    return out.detach(), grads, batch


def _vision_run(model, r, device_type: str):
    """Output and gradients (input and blocks) of every vision block of two images under bf16 autocast."""
    enc = r.encoder_input(["a", "b"])
    depth = len(model.vision.blocks)
    first = build_stage(model, "encoder", 0, 1)
    blocks = build_stage(model, "encoder", 1, depth + 1)
    with torch.no_grad():
        x = first(enc.patches, enc.grid_thw)
    x = x.detach().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=BF16):
        out = blocks(x, enc.grid_thw)
    out.float().square().mean().backward()
    grads = {k: p.grad.clone() for k, p in model.vision.named_parameters() if p.grad is not None}
    return out.detach(), {"input": x.grad.clone(), **grads}, blocks.geometry(enc.grid_thw, x)


def test_llm_varlen_gets_autocast_dtype(tiny, fake_gpu):
    cfg, model, r = tiny
    out, _, batch = _llm_run(model, r, "cpu")
    layers = len(build_stage(model, "llm", 0, len(cfg.llm_layer_names) - 3).layer_ids)
    assert len(fake_gpu) == layers  # one kernel per decoder layer, not one call per sample
    assert all(c["dtypes"] == {BF16} for c in fake_gpu)  # RoPE's float32 q and k were cast down
    assert fake_gpu[0]["cu"] == [0, 20, 33, 40] and fake_gpu[0]["max"] == 20
    assert fake_gpu[0]["window_size"] == (-1, 0)


def test_vision_windows_take_one_varlen_call(tiny, fake_gpu):
    cfg, model, r = tiny
    _, _, geo = _vision_run(model, r, "cpu")
    full = set(model.vision.fullatt_block_indexes)
    assert len(fake_gpu) == len(model.vision.blocks)
    for i, call in enumerate(fake_gpu):
        bounds = geo.cu_seqlens if i in full else geo.cu_window_seqlens
        assert call["cu"] == bounds.tolist() and call["window_size"] == (-1, -1)
        assert call["max"] == int((bounds[1:] - bounds[:-1]).max())
        assert call["dtypes"] == {BF16}
    assert any(len(c["cu"]) > 3 for c in fake_gpu)  # windows, not just one span per image


@pytest.mark.parametrize("run", [_llm_run, _vision_run], ids=["llm", "vision"])
def test_varlen_plumbing_matches_per_sequence_sdpa_on_cpu(tiny, run, monkeypatch):
    """The stand-in kernel computes exact per-sequence attention, so what differs from the SDPA path is
    the packing (offsets, layout, causality) the varlen path adds: forward and gradients agree."""
    cfg, model, r = tiny
    sdpa_out, sdpa_grads, _ = run(model, r, "cpu")
    calls = _install_fake_gpu(monkeypatch)
    varlen_out, varlen_grads, _ = run(model, r, "cpu")
    assert calls
    _assert_close(varlen_out, sdpa_out)
    for name, g in sdpa_grads.items():
        _assert_close(varlen_grads[name], g, what=name)


def test_cpu_runs_per_sequence_sdpa(tiny, monkeypatch):
    calls = []
    monkeypatch.setattr(attention, "_varlen_kernel", lambda *a, **k: calls.append(1))
    cfg, model, r = tiny
    _llm_run(model, r, "cpu")
    _vision_run(model, r, "cpu")
    assert not calls


def _assert_close(actual, expected, what=""):
    """bf16 tolerance relative to the tensor's scale."""
    scale = expected.float().abs().max().clamp_min(1e-12)
    torch.testing.assert_close(
        actual.float(), expected.float(), rtol=3e-2, atol=3e-2 * float(scale), msg=lambda m: f"{what}: {m}"
    )


# --- the real kernel -----------------------------------------------------------------------------------
def _gpu_or_skip() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    device = torch.device("cuda")
    if torch.cuda.get_device_capability(device) < (8, 0):
        pytest.skip("the flash varlen kernel needs sm80 or newer")
    return device


@pytest.mark.gpu
@pytest.mark.parametrize("run", [_llm_run, _vision_run], ids=["llm", "vision"])
def test_gpu_varlen_equals_per_sequence_attention(run, monkeypatch):
    device = _gpu_or_skip()
    cfg = get_model_config("tiny")
    metas = {
        "a": SampleMeta("a", ((224, 336),), 30),
        "b": SampleMeta("b", ((448, 224), (112, 112)), 45),
        "t1": SampleMeta("t1", (), 200),
        "t2": SampleMeta("t2", (), 130),
        "t3": SampleMeta("t3", (), 70),
    }
    model = build_vlm(cfg, seed=0).to(device)
    r = SampleRenderer(cfg, metas, seed=0, device=device)
    used = []
    real = attention._varlen_kernel
    monkeypatch.setattr(attention, "_varlen_kernel", lambda *a, **k: used.append(1) or real(*a, **k))
    varlen_out, varlen_grads, _ = run(model, r, "cuda")
    assert used, "the varlen kernel did not run"
    monkeypatch.setattr(attention, "_kernel_available", lambda: False)
    sdpa_out, sdpa_grads, _ = run(model, r, "cuda")
    _assert_close(varlen_out, sdpa_out)
    assert varlen_grads.keys() == sdpa_grads.keys()
    for name, g in sdpa_grads.items():
        _assert_close(varlen_grads[name], g, what=name)
