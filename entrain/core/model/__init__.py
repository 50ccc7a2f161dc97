"""A model as plain numbers: its architectures (``architectures``), the shape the cost model and the
planner take (``shape``) and each layer's hardware-independent work per sequence unit
(``layer_specs``).

Import from the module that owns a name; this package re-exports nothing.
"""
