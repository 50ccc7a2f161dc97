"""Tiny Qwen2.5-Omni thinker checkpoints (``save_pretrained``, random weights) and packed samples for
them: text, images and videos wrapped in <|vision_start|> ... <|vision_end|>, audio clips wrapped in
<|audio_start|> ... <|audio_end|>, a video with its audio track interleaved (``use_audio_in_video``),
labels."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

VOCAB = 256
IMAGE, VIDEO, VSTART, VEND = 250, 251, 252, 253
AUDIO, ASTART, AEND = 247, 248, 249
PATCH_VALUES = 3 * 2 * 14 * 14
MEL = 16
"""Mel bins of the tiny audio tower (a real checkpoint: 128)."""
IDS = dict(image_token_id=IMAGE, video_token_id=VIDEO, audio_token_id=AUDIO, vision_start_token_id=VSTART,
           vision_end_token_id=VEND, audio_start_token_id=ASTART, audio_end_token_id=AEND)  # fmt: skip


def config(*, text_layers: int = 3, vision_depth: int = 3, audio_layers: int = 2, tied: bool = False,
           position_id_per_seconds: int = 25, seconds_per_chunk: int = 2):  # fmt: skip
    from transformers import Qwen2_5OmniThinkerConfig

    text = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=text_layers, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=VOCAB, bos_token_id=0, eos_token_id=1,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]})  # fmt: skip
    vision = dict(depth=vision_depth, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                  fullatt_block_indexes=[vision_depth - 1], window_size=56)  # fmt: skip
    audio = dict(num_mel_bins=MEL, encoder_layers=audio_layers, encoder_attention_heads=2, encoder_ffn_dim=32,
                 d_model=16, output_dim=32, n_window=4, max_source_positions=64)  # fmt: skip
    return Qwen2_5OmniThinkerConfig(
        audio_config=audio, vision_config=vision, text_config=text, tie_word_embeddings=tied,
        position_id_per_seconds=position_id_per_seconds, seconds_per_chunk=seconds_per_chunk, **IDS,
    )  # fmt: skip


def save_whole(folder: Path, *, seed: int = 0, **kwargs) -> Path:
    """A random ``Qwen2_5OmniThinkerForConditionalGeneration`` saved to ``folder``."""
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen2_5OmniThinkerForConditionalGeneration(config(**kwargs))
    with torch.no_grad():  # non-trivial norms and biases, so a misplaced tensor shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(folder, max_shard_size="200KB")
    return folder


def audio_tokens(frames: int) -> int:
    """LLM tokens of an audio clip of ``frames`` mel frames (the tower's two stride-2 reductions)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


@dataclass
class Sample:
    """One sample: ids, labels and its media in sequence order. ``patches``: the visual items'
    patches (images and videos in the order their tokens appear); ``mel``: ``[MEL, frames]`` of its
    audio clips, concatenated in order."""

    input_ids: torch.Tensor
    label_positions: torch.Tensor
    targets: torch.Tensor
    grids: tuple = ()
    video_grids: tuple = ()
    visual_grids: tuple = ()
    """Every visual item's grid (images and videos) in sequence order."""
    second_per_grids: tuple = ()
    audio_lengths: tuple = ()
    patches: torch.Tensor = field(default_factory=lambda: torch.zeros(0, PATCH_VALUES))
    mel: torch.Tensor = field(default_factory=lambda: torch.zeros(MEL, 0))
    use_audio_in_video: bool = False

    @property
    def visual_positions(self) -> torch.Tensor:
        return ((self.input_ids == IMAGE) | (self.input_ids == VIDEO)).nonzero()[:, 0]

    @property
    def image_positions(self) -> torch.Tensor:
        return self.visual_positions


def _video_with_audio(grid, frames: int, spg: float, per_second: int, per_chunk: int) -> list[int]:
    """The tokens of a video with its audio track as transformers' processor interleaves them
    (``Qwen2_5OmniProcessor.replace_video_with_audio_token``): per chunk of ``per_second * per_chunk``
    temporal ids, the video tokens of the chunk, then the audio's."""
    import numpy as np
    from transformers import Qwen2_5OmniProcessor

    t, h, w = grid
    video = np.repeat(np.arange(t) * spg * per_second, h * w // 4)
    audio = np.arange(audio_tokens(frames))
    chunk = Qwen2_5OmniProcessor.get_chunked_index
    vc, ac = chunk(None, video, per_second * per_chunk), chunk(None, audio, per_second * per_chunk)
    ids: list[int] = []
    for j in range(max(len(vc), len(ac))):
        if j < len(vc):
            ids += [VIDEO] * (vc[j][1] - vc[j][0])
        if j < len(ac):
            ids += [AUDIO] * (ac[j][1] - ac[j][0])
    return ids


def make_sample(seed: int, parts: list, *, text: int = 5, answer: int = 3, per_second: int = 25,
                per_chunk: int = 2) -> Sample:  # fmt: skip
    """``parts``: in order, ``("image", (1, h, w))``, ``("video", (t, h, w), seconds_per_grid)``,
    ``("audio", frames)`` or ``("video+audio", (t, h, w), seconds_per_grid, frames)``; text between."""
    g = torch.Generator().manual_seed(seed)

    def words(n):
        return torch.randint(2, 200, (n,), generator=g).tolist()

    ids: list[int] = words(text)
    grids, videos, visual, spgs, lengths, patches, mels = [], [], [], [], [], [], []
    with_audio = False
    for part in parts:
        kind = part[0]
        if kind in ("image", "video", "video+audio"):
            grid = tuple(part[1])
            visual.append(grid)
            patches.append(torch.randn(grid[0] * grid[1] * grid[2], PATCH_VALUES, generator=g))
            if kind == "image":
                grids.append(grid)
                ids += [VSTART] + [IMAGE] * (grid[0] * grid[1] * grid[2] // 4) + [VEND]
            else:
                videos.append(grid)
                spgs.append(float(part[2]))
                if kind == "video":
                    ids += [VSTART] + [VIDEO] * (grid[0] * grid[1] * grid[2] // 4) + [VEND]
                else:
                    with_audio = True
                    frames = int(part[3])
                    lengths.append(frames)
                    mels.append(torch.randn(MEL, frames, generator=g))
                    body = _video_with_audio(grid, frames, float(part[2]), per_second, per_chunk)
                    ids += [VSTART, ASTART] + body + [AEND, VEND]
        elif kind == "audio":
            frames = int(part[1])
            lengths.append(frames)
            mels.append(torch.randn(MEL, frames, generator=g))
            ids += [ASTART] + [AUDIO] * audio_tokens(frames) + [AEND]
        ids += words(2)
    ids += words(answer)
    input_ids = torch.tensor(ids, dtype=torch.int64)
    n = input_ids.numel()
    label_positions = torch.arange(n - answer - 1, n - 1)
    return Sample(
        input_ids=input_ids,
        label_positions=label_positions,
        targets=input_ids[label_positions + 1],
        grids=tuple(grids),
        video_grids=tuple(videos),
        visual_grids=tuple(visual),
        second_per_grids=tuple(spgs),
        audio_lengths=tuple(lengths),
        patches=torch.cat(patches) if patches else torch.zeros(0, PATCH_VALUES),
        mel=torch.cat(mels, dim=1) if mels else torch.zeros(MEL, 0),
        use_audio_in_video=with_audio,
    )


def mixed_samples() -> list[Sample]:
    """Text only; an image; an audio clip; a video; a video with its audio track; and a mixture of an
    image, an audio clip and a video in one sample."""
    return [
        make_sample(1, []),
        make_sample(2, [("image", (1, 4, 8))]),
        make_sample(3, [("audio", 37)]),
        make_sample(4, [("video", (2, 4, 4), 0.5)]),
        make_sample(5, [("video+audio", (4, 4, 4), 1.0, 240)]),  # video and audio interleaved over 2 chunks
        make_sample(6, [("audio", 20), ("image", (1, 8, 4)), ("video", (2, 4, 4), 2.0), ("audio", 9)]),
    ]


def whole_omni(*, seed: int = 0, **kwargs):
    """A random whole ``Qwen2_5OmniForConditionalGeneration``: the thinker of ``config(**kwargs)``, a
    one-layer talker and token2wav."""
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    torch.manual_seed(seed)
    ids = dict(tts_text_start_token_id=240, tts_text_end_token_id=241, tts_text_pad_token_id=242,
               tts_codec_start_token_id=60, tts_codec_end_token_id=61, tts_codec_pad_token_id=62,
               tts_codec_mask_token_id=63, vision_start_token_id=VSTART, vision_end_token_id=VEND,
               audio_start_token_id=ASTART, audio_end_token_id=AEND, image_token_index=IMAGE,
               video_token_index=VIDEO, audio_token_index=AUDIO)  # fmt: skip
    talker = dict(vocab_size=VOCAB, embedding_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}, **ids)  # fmt: skip
    dit = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, emb_dim=16, head_dim=16, num_embeds=64,
               mel_dim=8, enc_emb_dim=16, enc_dim=16, enc_channels=[16, 16, 16, 16, 48], enc_attention_channels=8,
               enc_se_channels=8, look_ahead_layers=[0], look_backward_layers=[0])  # fmt: skip
    bigvgan = dict(
        mel_dim=8, upsample_initial_channel=16, upsample_rates=[2, 2], upsample_kernel_sizes=[4, 4]
    )
    cfg = Qwen2_5OmniConfig(thinker_config=config(**kwargs).to_dict(), talker_config=talker,
                            token2wav_config={"dit_config": dit, "bigvgan_config": bigvgan})  # fmt: skip
    model = Qwen2_5OmniForConditionalGeneration(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def save_whole_omni(folder: Path, **kwargs) -> Path:
    """``whole_omni(**kwargs)`` saved to ``folder``: the layout of a published Qwen2.5-Omni checkpoint
    (``thinker.*``, ``talker.*``, ``token2wav.*`` tensors, a ``spk_dict.pt``; no speakers in it)."""
    whole_omni(**kwargs).save_pretrained(folder, max_shard_size="200KB")
    torch.save({}, folder / "spk_dict.pt")  # the speakers file transformers' from_pretrained reads
    return folder
