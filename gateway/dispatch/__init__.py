"""Every replica's link from the Redis queues to its local engine: claiming, running a job,
delivering its tokens, cancels, retries.
"""
