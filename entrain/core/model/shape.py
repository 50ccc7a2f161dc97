"""``ModelShape``: a model's architecture as plain numbers, what the cost model and the planner take
from a model family (``entrain.models.families.base.ModelFamily.shape``). Core never asks which
family a shape belongs to."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from entrain.core.model.layer_specs import LayerSpec

__all__ = ["ModelShape"]


@runtime_checkable
class ModelShape(Protocol):
    """A model's architecture as plain numbers: what ``entrain.core`` prices and plans with."""

    name: str
    """The model's label in plans, profiles and reports (a preset name, or e.g. ``hf:FOLDER``)."""

    def layer_specs(self, label_fraction: float | None = None) -> dict[str, list[LayerSpec]]:
        """``{"encoder": [...], "llm": [...]}``: one ``LayerSpec`` per layer of each component, in
        ``layer_names`` order (FLOPs per unit power of tokens, bytes per token, parameter counts).
        ``label_fraction``: None prices per-label layers per label token (``LayerSpec.per_label``)."""
        ...

    def num_params(self) -> int:
        """Total parameters of the model (encoder incl. projector + LLM)."""
        ...
