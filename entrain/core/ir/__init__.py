"""The Plan IR, plain data both executors run: the plan itself (``plan``: layout, actions, iteration
plans), the microbatch assignment it carries (``microbatches``), the parallel configuration and its
rules (``parallel``), a replica's dependency graph (``graph``), the validator (``validate``) and the
point-to-point program each rank issues for its communication actions (``p2p``).

Import from the module that owns a name; this package re-exports nothing.
"""
