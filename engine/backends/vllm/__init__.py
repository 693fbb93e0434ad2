"""vLLM as mixgate's engine: engine arguments, the async engine adapter, mixgate's step composition
inside vLLM's scheduler, its stats.
"""
