"""The runtime executes a plan with several encoder pipelines for a family that declares them
(``ModelFamily.encoder_parts``: Qwen2.5-Omni's vision and audio towers, tests/runtime/test_two_encoder_train.py);
for any other family its executor refuses one in one line naming the plan's encoders and the family's
(before it touches modules or transport)."""

from types import SimpleNamespace

import pytest

from entrain.core.errors import ConfigError
from entrain.models.families.registry import get_family
from entrain.runtime.executor import Executor
from tests.sim import two_encoder_fixtures as two


def _executor(family: str) -> Executor:
    renderer = SimpleNamespace(family=get_family(family))
    return Executor(layout=two.layout(), rank=0, modules={}, transport=None, renderer=renderer, input_grad={})


def test_runtime_executor_refuses_encoder_pipelines_its_family_lacks():
    with pytest.raises(ConfigError, match=r"encoders \['vision', 'audio'\] in separate pipelines") as e:
        _executor("qwen2_vl")
    assert "model family 'qwen2_vl' declares encoder pipelines []" in str(e.value)
    assert "\n" not in str(e.value)
