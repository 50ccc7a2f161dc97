"""The runtime does not execute a plan with several encoder pipelines yet: its executor refuses one in
one line naming the encoders (before it touches modules or transport)."""

import pytest

from entrain.core.errors import ConfigError
from entrain.runtime.executor import Executor
from tests.sim import two_encoder_fixtures as two


def test_runtime_executor_refuses_two_encoder_pipelines():
    with pytest.raises(ConfigError, match=r"encoders \['vision', 'audio'\] in separate pipelines") as e:
        Executor(layout=two.layout(), rank=0, modules={}, transport=None, renderer=None, input_grad={})
    assert "\n" not in str(e.value)
