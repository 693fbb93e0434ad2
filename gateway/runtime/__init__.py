"""The service process: settings, `mixgate serve`, the engine's bring-up, the embedded redis-
server, Redis health.
"""
