"""The engine core in its own process: the step loop off the gateway's interpreter.

`EngineCoreClient` (client.py) is what the gateway holds: it offers AsyncEngine's interface and
talks over ZeroMQ to the child (main.py) that runs LLMEngine's step loop. What crosses the
boundary is data only (messages.py).
"""
