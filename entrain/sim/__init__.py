"""Discrete-event simulator of Plans (depends on ``entrain.core`` only; never imports torch)."""
