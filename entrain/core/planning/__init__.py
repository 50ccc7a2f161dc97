"""Macroscopic planning (paper Section 4, docs/design.md §1.1), one module per concern:

* ``profile``: samplers, seeded draws and their column statistics (``SampleStats``), the per-layer
  cost coefficients, the encoder share and ProportionalAllocation;
* ``bmin``: Algorithm 1 (the ``b_min`` search) and the one below-``b_min`` warning;
* ``config_search``: Algorithm 2 (the static configuration search, ``StaticConfig``);
* ``memory``: a stage's memory and its activation recomputation;
* ``baselines``: DistTrain's profile sample, paper Table 1's configurations and DIP's layout;
* ``boundary``: boundary sharing (ours, not the paper's);
* ``entry``: ``plan``, Algorithm 1 then Algorithm 2 per DP degree.

Import from the module that owns a name; this package re-exports nothing.
"""
