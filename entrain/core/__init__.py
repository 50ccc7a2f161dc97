"""Pure-Python core of Entrain, one subpackage per floor (lower floors never import higher ones):

``workload`` (samples and their work) < ``model`` (architectures as numbers, layer specs) < ``ir``
(the Plan IR) < ``costs`` (the cost model and memory) < ``assignment`` (per-iteration microbatches,
each system's batcher) < ``schedules`` (plan generators) < ``systems`` (the registry) < ``planning``
(Algorithms 1 and 2 and each system's setup). ``errors``, ``files``, ``workers`` and
``safetensors_header`` are helpers every floor may use.

Never imports torch or transformers (tests/core/test_purity.py enforces it).
"""
