"""LLaVA records with audio files: ``"audio": [...]`` and ``<audio>`` placeholders reach a family that
reads audio (a tiny Qwen2.5-Omni thinker) as its processor makes them: the metadata pass counts each
clip's mel frames (read, resampled to 16 kHz), the chat expands each ``<audio>`` to
``<|audio_bos|>`` + n x ``<|AUDIO|>`` + ``<|audio_eos|>`` in placeholder order with n what ``Qwen2_5OmniProcessor`` replaces each clip's ``<|AUDIO|>`` with
(images between them where their placeholders are), and the encoder input holds the processor's
log-mel features of the clips in that order. A family that reads no audio refuses the record, naming file, record and field."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.io import wavfile

from entrain.core.costs.presets import build_cost_model
from entrain.core.errors import DataError
from entrain.core.workload.samples import audio_llm_tokens
from entrain.data.llava import read_metadata
from entrain.models.families.base import ModelSource
from entrain.models.families.composition.config import get_model_config
from entrain.models.families.registry import family_of_source
from entrain.runtime.data import SampleRenderer
from entrain.runtime.record_source import RecordSource
from tests.models.qwen2_5_omni_tiny import AEND, ASTART, AUDIO, MEL, save_whole

from .families import RecordModel, assert_ranks_match, train_step

RATES = (16_000, 8_000)
SECONDS = (0.37, 0.21)
"""Two clips of different lengths (the second at 8 kHz, resampled), so their order shows."""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("record_audio")
    rng = np.random.default_rng(0)
    for i, (rate, sec) in enumerate(zip(RATES, SECONDS)):
        wave = 0.3 * np.sin(np.arange(int(rate * sec)) * (0.05 + 0.07 * i)) + 0.05 * rng.normal(
            size=int(rate * sec)
        )
        wavfile.write(root / f"c{i}.wav", rate, (wave * 32767).astype(np.int16))
    Image.fromarray(rng.integers(0, 255, (56, 84, 3), dtype=np.uint8)).save(root / "p.png")
    record = {"id": "r0", "image": "p.png", "audio": ["c0.wav", "c1.wav"], "conversations": [
        {"from": "human", "value": "<audio>\nWhat is said, <image> and then <audio>?"},
        {"from": "gpt", "value": "A tone, then a lower one."}]}  # fmt: skip
    alone = {"id": "r1", "audio": "c1.wav", "conversations": [
        {"from": "human", "value": "<audio>\nWhat do you hear?"}, {"from": "gpt", "value": "A low tone."}]}  # fmt: skip
    path = root / "d.json"
    path.write_text(json.dumps([record, alone]))
    folder = save_whole(root / "tiny")
    source = ModelSource(model_path=str(folder))
    family = family_of_source(source)
    cfg, _ = family.runtime_config(source)
    metas = read_metadata(path, vision=family.image_rule(cfg.shape, None, None), use_cache=False)
    return root, path, cfg, {m.id: m for m in metas}


def _clips(root):
    from scipy.signal import resample_poly

    out = []
    for i in range(len(RATES)):
        r, data = wavfile.read(root / f"c{i}.wav")
        x = data.astype(np.float32) / 32768.0
        out.append(x if r == 16_000 else resample_poly(x, 16_000 // r, 1).astype(np.float32))
    return out


def test_record_audio_renders_as_the_processor(dataset):
    root, path, cfg, metas = dataset
    clips = _clips(root)
    frames = tuple(-(-len(c) // 160) for c in clips)
    assert metas["r0"].audio == frames and frames[0] != frames[1]
    r = SampleRenderer(cfg, metas, source=RecordSource(str(path)))
    s = r.sample("r0")
    ids = s.input_ids.tolist()
    starts = [i for i, t in enumerate(ids) if t == ASTART]
    ends = [i for i, t in enumerate(ids) if t == AEND]
    runs = [e - b - 1 for b, e in zip(starts, ends)]
    assert runs == [audio_llm_tokens(f) for f in frames]  # placeholder order
    assert all(set(ids[b + 1 : e]) == {AUDIO} for b, e in zip(starts, ends))
    assert starts[0] < s.image_positions.min() < starts[1]  # <audio> ... <image> ... <audio>
    enc = r.encoder_input(["r0"])
    feats, mask, replacements = _processor_audio(clips)
    assert runs == [x.count("<|AUDIO|>") for x in replacements]  # the processor's expansion of each clip
    want = torch.cat([f[:, : int(m.sum())].T for f, m in zip(feats, mask)])
    assert enc.audio["audio_lengths"].tolist() == list(frames) == mask.sum(1).tolist()
    torch.testing.assert_close(enc.audio["audio_mel"], want, rtol=1e-5, atol=1e-5)


def _processor_audio(clips):
    """``Qwen2_5OmniProcessor``'s own audio path (its feature extractor, feature mask and each clip's
    ``<|AUDIO|>`` replacement), on an instance holding only what that path reads (a whole processor
    also wants a video processor, which needs torchvision)."""
    from transformers import Qwen2_5OmniProcessor, WhisperFeatureExtractor

    proc = object.__new__(Qwen2_5OmniProcessor)
    proc.feature_extractor, proc.audio_token = WhisperFeatureExtractor(feature_size=MEL), "<|AUDIO|>"
    out, replacements = proc._process_audio(
        clips, sampling_rate=16_000, return_attention_mask=True, return_tensors="pt"
    )
    return out["input_features"], out["feature_attention_mask"], replacements


def test_a_family_without_audio_refuses_the_record(dataset):
    _, path, _, metas = dataset
    cfg = get_model_config("tiny")
    with pytest.raises(DataError) as e:  # when the run starts, not at the record's first step
        SampleRenderer(cfg, metas, source=RecordSource(str(path)))
    msg = str(e.value)
    assert str(path) in msg and "'r0'" in msg and "audio" in msg and "reads no audio" in msg


def test_records_with_audio_train_as_transformers(dataset, tmp_path):
    """A 2-rank 1F1B step on the records: loss, gradient norm and every gradient (the audio tower's
    included) before and after clipping equal transformers' thinker (fp64) on the same rendered inputs
    (the inputs themselves: the test above)."""
    from .harness import run_workers
    from .test_qwen2_5_omni_train import oracle

    _, path, cfg, metas = dataset
    fm = RecordModel("qwen2_5_omni", family_of_source(ModelSource(model_path=cfg.folder)), cfg,
                      build_cost_model(cfg.shape, "cpu-tiny"), metas)  # fmt: skip
    fm.path = str(path)
    plan = fm.plan("1f1b", 1, 1, 1, 2)
    results = run_workers(train_step, 2, tmp_path, fm, plan)
    rest, _, _ = assert_ranks_match("records", results, oracle(fm, False), tol=1e-5)
    assert any(".audio_tower.layers." in n for n in rest.grads)
