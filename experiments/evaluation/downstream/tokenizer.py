"""The run's own tokenizer behind the interface ``olmo_eval`` tasks call.

``olmo_eval`` tokenizes prompts and answer choices itself (``task.token_encode``) through an abstract
``olmo_eval.Tokenizer``: ``encode_batch`` / ``decode_batch`` and the pad / eos / bos ids. This adapter
forwards every call to the suite's :class:`datamodules.text.tokenizers.TextTokenizer` (byte-level, or a BPE
``tokenizer.json``), so the tasks see exactly the ids the model was trained on; nothing is re-tokenized
here.

Special ids: the suite's LMs train on raw windows of text without special tokens. ``bos_token_id`` is
therefore None (``olmo_eval`` then prepends nothing to a context). ``eos_token_id`` / ``pad_token_id`` are
the tokenizer's end-of-text token when its ``tokenizer.json`` declares one (``<|endoftext|>``, ``</s>``,
``<eos>``), else id 0. Pad only fills the right end of a row, past every position that is scored, so
its value cannot change a score; eos is added only when a caller asks for ``add_special_tokens`` (the
tasks never do).
"""

from __future__ import annotations

from collections.abc import Sequence

from olmo_eval import Tokenizer

from datamodules.text.tokenizers import TextTokenizer

END_OF_TEXT_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")


def end_of_text_id(tokenizer: TextTokenizer) -> int | None:
    """The tokenizer's declared end-of-text special token; None when it has none (byte-level tokens)."""
    hf = getattr(tokenizer, "hf", None)  # BPETokenizer wraps a HuggingFace `tokenizers.Tokenizer`
    if hf is not None:
        for name in END_OF_TEXT_NAMES:
            token_id = hf.token_to_id(name)
            if token_id is not None:
                return int(token_id)
    return None


class OlmoEvalTokenizer(Tokenizer):
    """``olmo_eval.Tokenizer`` over a suite tokenizer.

    Args:
        tokenizer: the run's tokenizer (``datamodule.tokenizer``, or one loaded from a run's shards).
    """

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.inner = tokenizer
        declared = end_of_text_id(tokenizer)
        self._special = set() if declared is None else {declared}  # what decoding may skip
        self._eos = 0 if declared is None else declared

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    @property
    def pad_token_id(self) -> int:
        return self._eos

    @property
    def eos_token_id(self) -> int:
        return self._eos

    @property
    def bos_token_id(self) -> int | None:
        return None

    @property
    def kind(self) -> str:
        return self.inner.kind

    def encode_batch(self, inputs: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        eos = [self._eos] if add_special_tokens else []
        return [self.inner.encode(text) + eos for text in inputs]

    def decode_batch(self, batch_token_ids: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        drop = self._special if skip_special_tokens else set()
        return [self.inner.decode([i for i in ids if int(i) not in drop]) for ids in batch_token_ids]
