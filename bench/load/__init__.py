"""Load generation: workloads (TOML, built-ins), the seeded load's HTTP clients for chat and jobs,
request records.
"""
