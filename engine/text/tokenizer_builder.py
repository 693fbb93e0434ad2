"""A byte-level BPE tokenizer built offline, so test and benchmark models need no download.

The base vocabulary is the 256 GPT-2 byte symbols with no merges: every byte is one token and
token id == byte value, so any text round-trips and a multi-byte UTF-8 character is always split
across tokens (which is exactly what the incremental detokenizer must handle). Three ChatML
special tokens follow the bytes; the vocabulary has no unused ids, so every id decodes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

__all__ = [
    "BYTE_VOCAB_SIZE",
    "CHATML_TEMPLATE",
    "ENDOFTEXT",
    "IM_END",
    "IM_START",
    "SPECIAL_TOKENS",
    "VOCAB_SIZE",
    "TokenizerFiles",
    "build_tokenizer",
    "bytes_to_unicode",
    "special_token_id",
    "write_tokenizer",
]

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Order fixes the ids: the specials follow the 256 bytes in this order.
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)
BYTE_VOCAB_SIZE = 256
VOCAB_SIZE = BYTE_VOCAB_SIZE + len(SPECIAL_TOKENS)

# ChatML, written in the style of Qwen2's template so transformers renders it identically.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


def special_token_id(token: str) -> int:
    """The id `build_tokenizer` gives a special token (they follow the byte ids)."""
    if token not in SPECIAL_TOKENS:
        raise ValueError(f"{token!r} is not one of {SPECIAL_TOKENS}")
    return BYTE_VOCAB_SIZE + SPECIAL_TOKENS.index(token)


@dataclass(frozen=True, slots=True)
class TokenizerFiles:
    """What `write_tokenizer` wrote, and the ids a model config must agree with."""

    tokenizer_json: Path
    tokenizer_config_json: Path
    special_tokens_map_json: Path
    vocab_size: int
    eos_token_id: int
    pad_token_id: int

    def __post_init__(self) -> None:
        if not 0 <= self.eos_token_id < self.vocab_size:
            raise ValueError("eos_token_id must be inside the vocabulary")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError("pad_token_id must be inside the vocabulary")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable unicode symbol map (the alphabet ByteLevel uses)."""
    # Printable latin-1 bytes map to themselves; the rest are shifted past 255 so that no
    # symbol is whitespace or a control character.
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping: dict[int, str] = {}
    shifted = 0
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(256 + shifted)
            shifted += 1
    return mapping


def build_tokenizer() -> Tokenizer:
    """The in-memory tokenizer: byte vocabulary (id == byte value), no merges, ChatML specials."""
    byte_symbols = bytes_to_unicode()
    vocab = {byte_symbols[byte]: byte for byte in range(BYTE_VOCAB_SIZE)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    # NOTE: use_regex keeps GPT-2's pre-split; with no merges it cannot change the ids, but it
    # is what real byte-level tokenizers ship, so other loaders see a familiar pipeline.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    added = tokenizer.add_special_tokens(
        [
            AddedToken(token, special=True, normalized=False, single_word=False)
            for token in SPECIAL_TOKENS
        ]
    )
    if added != len(SPECIAL_TOKENS) or tokenizer.get_vocab_size(True) != VOCAB_SIZE:
        raise RuntimeError("the byte tokenizer did not get the expected vocabulary")
    return tokenizer


def _tokenizer_config(model_max_length: int) -> dict[str, Any]:
    added_tokens_decoder = {
        str(special_token_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added_tokens_decoder,
        "bos_token": None,
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "model_max_length": model_max_length,
        "pad_token": ENDOFTEXT,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    # sort_keys + a trailing newline: the bytes depend only on the content.
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_tokenizer(out_dir: str | Path, model_max_length: int) -> TokenizerFiles:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into out_dir."""
    if model_max_length <= 0:
        raise ValueError(f"model_max_length must be positive, got {model_max_length}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer_json = out / "tokenizer.json"
    tokenizer_json.write_text(build_tokenizer().to_str(pretty=True) + "\n")
    tokenizer_config_json = out / "tokenizer_config.json"
    _write_json(tokenizer_config_json, _tokenizer_config(model_max_length))
    special_tokens_map_json = out / "special_tokens_map.json"
    _write_json(special_tokens_map_json, {"eos_token": IM_END, "pad_token": ENDOFTEXT})
    return TokenizerFiles(
        tokenizer_json=tokenizer_json,
        tokenizer_config_json=tokenizer_config_json,
        special_tokens_map_json=special_tokens_map_json,
        vocab_size=VOCAB_SIZE,
        eos_token_id=special_token_id(IM_END),
        pad_token_id=special_token_id(ENDOFTEXT),
    )
