"""Pure-Python core of Entrain: workloads, cost models, planner, assignment, schedules, Plan IR.

Never imports torch or transformers (tests/core/test_purity.py enforces it).
"""
