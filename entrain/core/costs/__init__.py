"""The cost model: fitted per-layer time curves (``layer_costs``), the model that prices a sample,
a stage and a message (``costmodel``), the analytic presets and the fits benchmarks wrote
(``presets``, ``fits/``), column-wise pricing of a drawn batch (``table_work``), the sampler's
draws and statistics the planner prices (``sampler``), and a stage's memory (``memory``).

Import from the module that owns a name; this package re-exports nothing.
"""
