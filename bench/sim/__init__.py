"""The simulator: a workload through the live engine's loop in virtual time, with a modelled
gateway.
"""
