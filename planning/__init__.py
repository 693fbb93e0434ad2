"""Capacity planning: the cost model, memory budget, device presets, planner, calibration fit and
files, envelope derivation, SLO files, and the plan and envelope commands.
"""
