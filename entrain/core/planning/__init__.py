"""Macroscopic planning (paper Section 4, docs/design.md §1.1) and each system's setup, one module
per concern:

* ``bmin``: Algorithm 1 (the ``b_min`` search) and the one below-``b_min`` warning;
* ``config_search``: Algorithm 2 (the static configuration search, ``StaticConfig``);
* ``partition``: the 1-D min-max layer partition (paper Eq. 1);
* ``entry``: ``plan``, Algorithm 1 then Algorithm 2 per DP degree;
* ``baselines``: DistTrain's profile sample, paper Table 1's configurations and DIP's layout;
* ``boundary``: boundary sharing (ours, not the paper's);
* ``extensions``: Entrain's other extensions, each decided by simulation;
* ``system_setup`` and ``setups``: a system's request and setup, and each system's own way of choosing it;
* ``steps``: one iteration's plan at a time; ``plan_file``: a plan file checked before training;
* ``replan_settings``: ``--replan``'s settings.

The sampler's statistics and a stage's memory, which planning prices, are in ``entrain.core.costs``.
Import from the module that owns a name; this package re-exports nothing.
"""
