"""The engine in virtual time: LLMEngine's own loop around a cost-model executor, for the
simulator.
"""
