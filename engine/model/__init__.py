"""The model and one step's forward: the Llama family, attention over the paged cache, the sampler,
weights, presets.
"""
