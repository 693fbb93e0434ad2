"""Gateway benchmarks: queue round trips, gateway-added TTFT, Redis commands per chat, intake and
polls, the latency breakdown, batches.
"""
