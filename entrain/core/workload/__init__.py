"""What a dataset is to the planner: per-sample metadata (``samples``), the same as numpy columns
for a million samples (``sample_table``), the per-sample work the assignment balances (``work``) and
the other names of the built-in datasets (``aliases``).

Import from the module that owns a name; this package re-exports nothing.
"""
