"""Entrain: load-balanced distributed training of multimodal LLMs.

Importing the package imports nothing heavy; torch lives behind ``entrain.models`` and
``entrain.runtime`` only.
"""

__version__ = "0.1.0"
