from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from engine.text.tokenizer import Tokenizer
from engine.text.tokenizer_builder import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    special_token_id,
    write_tokenizer,
)
from tests.dependencies import require_module

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Wie geht's? 你好 😀"},
        {"role": "assistant", "content": "Gut.\n"},
        {"role": "user", "content": "  spaces  "},
    ],
]

# A Llama-3-style template (not ChatML): bos_token, raise_exception, loop controls, tojson.
LLAMA3_STYLE_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}"
    "{% endif %}"
    "{% if loop.index > 8 %}{% break %}{% endif %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}{{ eos_token }}\n"
    "{% if message.meta is defined %}{{ message.meta | tojson }}{% endif %}"
    "{% endfor %}"
    "{% if tools is not none %}TOOLS{% endif %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    write_tokenizer(out, model_max_length=1024)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 258}))
    return out


@pytest.fixture(scope="module")
def tok(folder: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(folder)


def _edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not ...}
    path.write_text(json.dumps(config))


def _copy(folder: Path, dest: Path) -> Path:
    dest.mkdir()
    for path in folder.iterdir():
        (dest / path.name).write_bytes(path.read_bytes())
    return dest


def test_special_ids_and_vocab(tok: Tokenizer) -> None:
    assert VOCAB_SIZE == 259
    assert tok.vocab_size == VOCAB_SIZE
    assert [special_token_id(t) for t in SPECIAL_TOKENS] == [256, 257, 258]
    assert tok.eos_token_ids == (258,)
    assert tok.bos_token_id is None
    assert tok.all_special_ids == (256, 257, 258)
    assert tok.convert_ids_to_tokens([104, 32, 258]) == ["h", "Ġ", IM_END]
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.convert_ids_to_tokens([VOCAB_SIZE])


def test_every_id_decodes(tok: Tokenizer) -> None:
    tokens = tok.convert_ids_to_tokens(range(VOCAB_SIZE))
    assert len(set(tokens)) == VOCAB_SIZE
    assert tok.decode([0x41, 0xC3, 0xA9]) == "Aé"


def test_one_token_per_byte_and_specials(tok: Tokenizer) -> None:
    assert tok.encode("héllo") == list("héllo".encode())
    ids = tok.encode(f"a{IM_END}b")
    assert ids == [ord("a"), 258, ord("b")]
    assert tok.decode(ids) == "ab"
    assert tok.decode(ids, skip_special_tokens=False) == f"a{IM_END}b"
    # No BOS in this tokenizer, so add_special_tokens changes nothing.
    assert tok.encode("x", add_special_tokens=True) == [ord("x")]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_round_trip_any_unicode(tok: Tokenizer, text: str) -> None:
    assume(not any(s in text for s in SPECIAL_TOKENS))
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_is_chatml(tok: Tokenizer, messages: list[dict[str, Any]]) -> None:
    expected = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == expected
    prompted = tok.apply_chat_template(messages)
    assert prompted == expected + f"{IM_START}assistant\n"
    assert tok.encode_chat(messages) == tok.encode(prompted)
    assert tok.encode_chat(messages)[0] == special_token_id(IM_START)


def test_none_values_are_dropped(tok: Tokenizer) -> None:
    messages = [{"role": "user", "content": "q", "name": None}]
    assert tok.apply_chat_template(messages) == f"{IM_START}user\nq{IM_END}\n{IM_START}assistant\n"
    with pytest.raises(ValueError, match="empty conversation"):
        tok.apply_chat_template([])


def test_transformers_agrees(folder: Path, tok: Tokenizer) -> None:
    transformers = require_module("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    assert len(hf) == tok.vocab_size
    assert hf.eos_token_id == 258
    assert hf.pad_token_id == special_token_id(ENDOFTEXT)
    for messages in CONVERSATIONS:
        for prompt in (True, False):
            ours = tok.apply_chat_template(messages, add_generation_prompt=prompt)
            theirs = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
            assert ours == theirs
    text = "naïve café 😀 日本語\n\tend"
    assert hf.encode(text, add_special_tokens=False) == tok.encode(text)
    assert hf.decode(tok.encode(text)) == text


def test_other_template_renders_like_transformers(folder: Path, tmp_path: Path) -> None:
    transformers = require_module("transformers")
    other = _copy(folder, tmp_path / "llama3ish")
    _edit_config(
        other,
        chat_template=LLAMA3_STYLE_TEMPLATE,
        # Older HF folders spell special tokens as serialized AddedTokens.
        bos_token={"__type": "AddedToken", "content": ENDOFTEXT, "special": True},
        eos_token={"__type": "AddedToken", "content": IM_END, "special": True},
        add_bos_token=True,
    )
    tok = Tokenizer.from_pretrained(other)
    hf = transformers.AutoTokenizer.from_pretrained(other)
    messages = [*CONVERSATIONS[1], {"role": "user", "content": "x", "meta": {"k": "é<>"}}]
    ours = tok.apply_chat_template(messages)
    assert ours == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.startswith(f"{ENDOFTEXT}<|start_header_id|>system")
    assert '{"k": "é<>"}' in ours
    assert "TOOLS" not in ours
    assert tok.bos_token_id == 256
    assert tok.encode("x", add_special_tokens=True) == [256, ord("x")]
    assert tok.encode_chat(messages).count(256) == 1
    with pytest.raises(ValueError, match="unknown role tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_eos_ids_are_the_union(folder: Path, tmp_path: Path) -> None:
    other = _copy(folder, tmp_path / "eos")
    _edit_config(other, eos_token={"content": IM_END, "lstrip": False})
    (other / "generation_config.json").write_text(json.dumps({"eos_token_id": [258, 256]}))
    (other / "config.json").write_text(json.dumps({"eos_token_id": 257}))
    assert Tokenizer.from_pretrained(other).eos_token_ids == (258, 256, 257)


def test_template_sources(folder: Path, tmp_path: Path) -> None:
    missing = _copy(folder, tmp_path / "none")
    _edit_config(missing, chat_template=...)
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer.from_pretrained(missing).apply_chat_template([{"role": "user", "content": "x"}])
    named = _copy(folder, tmp_path / "named")
    _edit_config(
        named, chat_template=[{"name": "default", "template": "D"}, {"name": "t", "template": "T"}]
    )
    assert (
        Tokenizer.from_pretrained(named).apply_chat_template([{"role": "u", "content": ""}]) == "D"
    )
    # A chat_template.jinja file wins over the config's template.
    (named / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert (
        Tokenizer.from_pretrained(named).apply_chat_template([{"role": "u", "content": ""}]) == "J1"
    )


def test_missing_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        Tokenizer.from_pretrained(tmp_path)
