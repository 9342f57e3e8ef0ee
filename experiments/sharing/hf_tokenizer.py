"""The run's tokenizer as a transformers tokenizer that ``PreTrainedTokenizerFast.from_pretrained`` (and
``AutoTokenizer``) read without remote code.

    byte   a byte-level BPE with the 256 byte symbols and no merges: token id = byte value, exactly the
           suite's ``ByteTokenizer`` (decoding invalid UTF-8 gives U+FFFD, as the suite does). Id 0, the
           end-of-text / padding token, is the NUL character itself: a special token is matched in the raw
           text before the byte mapping, so under its byte-level symbol ("Ā", U+0100) every "Ā" of a text
           would become id 0; as "\x00" it matches exactly the text the suite encodes as byte 0
    bpe    the run's own ``tokenizer.json`` (a HuggingFace ``tokenizers`` file already), unchanged

Special tokens follow the suite's evaluation adapters (:mod:`experiments.evaluation.downstream.tokenizer`):
the suite's LMs train on raw text, so there is no BOS; end-of-text and padding are the tokenizer's declared
end-of-text token when it has one, for bytes id 0 (NUL), else none (a BPE without one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from experiments.evaluation.downstream.tokenizer import end_of_text_id

NUL = "\x00"  # the byte tokenizer's end-of-text / padding token (id 0), as text
if TYPE_CHECKING:
    from datamodules.text.tokenizers import TextTokenizer

# Text whose ids must agree between the suite's tokenizer and the exported one (checked after the export):
# ASCII, Latin-1, the characters byte-level BPE stores bytes as (U+0100 ...), CJK, emoji, NUL, control bytes.
PROBE_TEXT = (
    "In the beginning God created the heaven and the earth.\n  Tabs\tand ünïcödé ßÿ, ĀāĊĠġłŃ, 日本語, "
    "emoji 🙂👍🏽 and 12345.\x00NUL\x01\x7f\r\n"
)


def byte_level_tokenizer() -> Tokenizer:
    """A ``tokenizers`` Tokenizer whose ids are the UTF-8 bytes: ``"hé" -> [104, 195, 169]``."""
    symbol = bytes_to_unicode()  # byte -> the printable character byte-level BPE stores it as
    vocab = {symbol[b]: b for b in range(1, 256)} | {NUL: 0}  # NUL: the special token, matched before the mapping
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def to_transformers(tokenizer: TextTokenizer, max_length: int) -> PreTrainedTokenizerFast:
    """The suite tokenizer as a transformers fast tokenizer (``save_pretrained`` writes tokenizer.json + config).

    Args:
        tokenizer: the run's tokenizer (byte-level or BPE).
        max_length: the model's window, recorded as ``model_max_length``.
    """
    if tokenizer.kind == "byte":
        inner, special = byte_level_tokenizer(), 0
    else:
        inner, special = Tokenizer.from_str(tokenizer.hf.to_str()), end_of_text_id(tokenizer)
    token = inner.id_to_token(special) if special is not None else None  # bytes: NUL itself
    return PreTrainedTokenizerFast(
        tokenizer_object=inner,
        eos_token=token,
        pad_token=token,
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )


def special_ids(tokenizer: TextTokenizer) -> tuple[int | None, int | None]:
    """(end-of-text for generation, padding): the declared end-of-text; for bytes no stop but NUL padding."""
    if tokenizer.kind == "byte":
        return None, 0
    declared = end_of_text_id(tokenizer)
    return declared, declared


def probe_text(tokenizer: TextTokenizer) -> str:
    """:data:`PROBE_TEXT` with the tokenizer's end-of-text string inside (a BPE's ``<|endoftext|>``; NUL for bytes)."""
    declared = end_of_text_id(tokenizer)
    marker = tokenizer.hf.id_to_token(declared) if declared is not None else NUL
    return f"{PROBE_TEXT} before{marker}after"
