"""Admission at the edge: the path every generation request takes before it is queued, and the
service that asks the pure policy.
"""
