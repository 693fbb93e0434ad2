"""Peers run side by side: plain vLLM servers and their load, in-process vLLM throughput,
guidellm."""
