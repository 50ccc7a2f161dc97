"""What every family's whole-model export shares: loading the trained tensors into transformers' own
class, built on the meta device, exactly (same parameter names, or one ``ConfigError``)."""

from __future__ import annotations

from entrain.core.errors import ConfigError

__all__ = ["load_exactly"]


def load_exactly(model, params: dict, source: str) -> None:
    """Assign ``params`` to ``model``'s parameters; ``ConfigError`` naming ``source`` (the checkpoint the
    model was built from) when the names differ from the model's."""
    expected = {n for n, _ in model.named_parameters()}
    if set(params) != expected:
        missing, extra = sorted(expected - set(params)), sorted(set(params) - expected)
        raise ConfigError(
            f"the checkpoint's parameters do not match {source} (missing {missing[:3]}, unexpected {extra[:3]})"
        )
    model.load_state_dict(params, strict=False, assign=True)
