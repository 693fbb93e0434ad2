"""Text <-> token ids: the tokenizer with chat templates, the offline tokenizer builder, the
streaming detokenizer.
"""
