"""``SuiteLMConfig``: what transformers needs to rebuild a suite ``LanguageModel``, as plain JSON values."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedConfig


class SuiteLMConfig(PreTrainedConfig):
    """Configuration of :class:`models.wrappers.hf_lm.SuiteLMForCausalLM` (``config.json`` of an export).

    A dataclass, as every transformers 5 config: the fields are the keyword arguments. The sizes tools
    look for under their usual names (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
    ``num_key_value_heads``, ``head_dim``, ``max_position_embeddings``) are read from the trunk, never stored twice.

    Attributes:
        trunk: the suite's ``TrunkConfig`` as a dict (width, depth, heads, norm scheme and layer, MoE ...).
        vocab_size: tokenizer vocabulary size.
        max_seq_len: longest sequence the RoPE tables cover (the training window).
        rope_base: RoPE base frequency.
        tie_word_embeddings: the output head shares the input embedding.
    """

    model_type = "suite_lm"

    trunk: dict[str, Any] | None = None
    vocab_size: int = 256
    max_seq_len: int = 2048
    rope_base: float = 10000.0
    tie_word_embeddings: bool = False

    @property
    def hidden_size(self) -> int:
        return int((self.trunk or {}).get("dim", 0))

    @property
    def num_hidden_layers(self) -> int:
        return int((self.trunk or {}).get("depth", 0))

    @property
    def num_attention_heads(self) -> int:
        return int((self.trunk or {}).get("num_heads", 0))

    @property
    def num_key_value_heads(self) -> int:
        """Key/value heads: the trunk's ``num_kv_heads`` (grouped-query attention), else ``num_attention_heads``."""
        return int((self.trunk or {}).get("num_kv_heads") or self.num_attention_heads)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // max(self.num_attention_heads, 1)

    @property
    def max_position_embeddings(self) -> int:
        return self.max_seq_len
