"""Live runs against real `mixgate serve` processes: one run, compare and sweep over runners, the
server processes.
"""
