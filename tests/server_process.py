"""End-to-end tests start servers the way benchmarks do (bench/processes.py)."""

from bench.processes import ServerProcess, free_port

__all__ = ["ServerProcess", "free_port"]
