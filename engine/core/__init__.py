"""The step loop: validate, schedule, run, update; the scheduler, KV blocks, sequences, step
records.
"""
