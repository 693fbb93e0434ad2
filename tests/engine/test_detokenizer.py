from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models

from engine.text.detokenizer import DetokenizerDelta, IncrementalDetokenizer
from engine.text.tokenizer import Tokenizer
from engine.text.tokenizer_builder import IM_END, special_token_id, write_tokenizer

MULTIBYTE = "héllo 😀 世界, ok 🇫🇷 — ñ"
PROMPT = [ord(c) for c in "prompt: "]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    folder: Path = tmp_path_factory.mktemp("tok")
    write_tokenizer(folder, model_max_length=1024)
    return Tokenizer.from_pretrained(folder)


def _stream(
    detok: IncrementalDetokenizer, ids: list[int], chunk: int = 1
) -> list[DetokenizerDelta]:
    return [detok.add_tokens(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]


def test_multibyte_one_token_at_a_time(tok: Tokenizer) -> None:
    ids = tok.encode(MULTIBYTE)
    detok = IncrementalDetokenizer(tok, PROMPT)
    deltas = _stream(detok, ids)
    assert all("\ufffd" not in d.text for d in deltas)
    # Split characters wait: some deltas are empty, and no delta is cut inside a character.
    assert any(d.text == "" for d in deltas)
    assert "".join(d.text for d in deltas) == tok.decode(ids) == MULTIBYTE
    assert detok.flush() == ""
    assert detok.output_text == MULTIBYTE
    assert detok.stop_matched is None


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=60), chunk=st.integers(min_value=1, max_value=5))
def test_deltas_concatenate_to_decode(tok: Tokenizer, text: str, chunk: int) -> None:
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, PROMPT)
    streamed = "".join(d.text for d in _stream(detok, ids, chunk)) + detok.flush()
    assert streamed == tok.decode(ids)
    assert detok.output_text == streamed


def test_unfinished_character_at_the_end_is_flushed_as_decode_shows_it(tok: Tokenizer) -> None:
    ids = [ord("a"), *list("😀".encode())[:2]]
    detok = IncrementalDetokenizer(tok, [])
    assert "".join(d.text for d in _stream(detok, ids)) == "a"
    assert detok.flush() == "\ufffd"
    assert detok.output_text == tok.decode(ids) == "a\ufffd"


def test_stop_string_across_tokens_is_cut(tok: Tokenizer) -> None:
    ids = tok.encode("Hello world STOP more text")
    detok = IncrementalDetokenizer(tok, PROMPT, stop=("STOP",))
    deltas = _stream(detok, ids)
    streamed = "".join(d.text for d in deltas)
    assert streamed == "Hello world "
    assert detok.stop_matched == "STOP"
    assert deltas[-1] == DetokenizerDelta("", "STOP")
    assert detok.output_text == "Hello world "
    assert detok.flush() == ""
    assert detok.finished


def test_stop_string_never_partially_emitted(tok: Tokenizer) -> None:
    text = "abc\n\nUsxy\n\nUser: ignored"
    detok = IncrementalDetokenizer(tok, PROMPT, stop=("\n\nUser:",))
    deltas = [d.text for d in _stream(detok, tok.encode(text))]
    # "\n", "\n\n", "\n\nU", "\n\nUs" could each grow into the stop string: held back until
    # "x" rules it out; the second "\n\nUser" is never emitted at all.
    assert deltas[:9] == ["a", "b", "c", "", "", "", "", "\n\nUsx", "y"]
    assert set(deltas[9:]) == {""}
    assert detok.output_text == "abc\n\nUsxy"
    assert detok.stop_matched == "\n\nUser:"


def test_held_back_text_is_flushed(tok: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tok, PROMPT, stop=("</answer>",))
    streamed = "".join(d.text for d in _stream(detok, tok.encode("42 </ans")))
    assert streamed == "42 "
    assert detok.flush() == "</ans"
    assert detok.output_text == "42 </ans"
    assert detok.stop_matched is None
    with pytest.raises(RuntimeError, match="after flush"):
        detok.add_tokens([ord("x")])


def test_multibyte_stop_and_earliest_match_in_one_batch(tok: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tok, PROMPT, stop=("界", "世界", "ok"))
    delta = detok.add_tokens(tok.encode("你好世界 ok"))
    assert delta == DetokenizerDelta("你好", "世界")
    assert detok.add_tokens([ord("z")]) == DetokenizerDelta("", "世界")
    assert detok.output_text == "你好"


@settings(max_examples=100, deadline=None)
@given(
    text=st.text(alphabet="ab😀\n", max_size=40),
    stops=st.lists(st.text(alphabet="ab😀\n", min_size=1, max_size=4), min_size=1, max_size=3),
    chunk=st.integers(min_value=1, max_value=4),
)
def test_stop_matches_reference(tok: Tokenizer, text: str, stops: list[str], chunk: int) -> None:
    # Streaming ends at the stop string that completes first (one character per token here).
    hits = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    expected = text[: min(hits)[1]] if hits else text
    detok = IncrementalDetokenizer(tok, PROMPT, stop=tuple(stops))
    streamed = ""
    for delta in _stream(detok, tok.encode(text), chunk):
        streamed += delta.text
        assert expected.startswith(streamed)
    streamed += detok.flush()
    assert streamed == expected
    assert (detok.stop_matched is not None) == bool(hits)


def test_special_tokens_skipped_or_kept(tok: Tokenizer) -> None:
    ids = [*tok.encode("hi"), special_token_id(IM_END), *tok.encode("!")]
    skipped = IncrementalDetokenizer(tok, PROMPT)
    assert "".join(d.text for d in _stream(skipped, ids)) == "hi!"
    kept = IncrementalDetokenizer(tok, PROMPT, stop=(IM_END,), skip_special_tokens=False)
    assert "".join(d.text for d in _stream(kept, ids)) == "hi"
    assert kept.stop_matched == IM_END


def test_prompt_context_keeps_leading_space() -> None:
    # A SentencePiece-style decoder strips the leading space of a text's first word, so the
    # first output word only keeps its space when decoded after prompt context.
    vocab = {"▁Hello": 0, "▁world": 1, "▁again": 2, "<unk>": 3}
    raw = HFTokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    raw.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")

    class MetaspaceDecoder:
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return raw.decode(ids, skip_special_tokens=skip_special_tokens)

    assert raw.decode([1]) == "world"
    detok = IncrementalDetokenizer(MetaspaceDecoder(), [0])
    assert [d.text for d in _stream(detok, [1, 2])] == [" world", " again"]


def test_empty_stop_string_rejected(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        IncrementalDetokenizer(tok, PROMPT, stop=("",))


def test_invalid_bytes_do_not_stall_the_stream(tok: Tokenizer) -> None:
    # 0xFF never starts a UTF-8 character: after at most 4 pending tokens it must be emitted
    # (as U+FFFD) instead of being held back until the end of the output.
    detok = IncrementalDetokenizer(tok, [])
    emitted = [detok.add_tokens([0xFF]).text for _ in range(12)]
    assert "".join(emitted).count("\ufffd") >= 8
    assert emitted[-1] != "" or emitted[-2] != ""
    ascii_after = detok.add_tokens([ord("a")]).text
    assert ascii_after.endswith("a")
