"""``SuiteLMForCausalLM``: the suite's ``LanguageModel`` as a transformers causal LM, for every norm scheme.

    input_ids (B, N) ──> model: LanguageModel (embed -> trunk under the scheme -> head) ──> logits (B, N, V)

The wrapped network is the suite's, unchanged: its parameters keep their names under ``model.``, so a
suite state dict loads with that prefix added, and two-stream schemes (SiameseNorm, ResiDual) and
Hyper-Connections need nothing special here (the trunk's block loop never knows how many streams there are).

What transformers expects and how it is met:
    generation     ``GenerationMixin``; no key/value cache: each step runs the whole (window-cropped)
                   sequence, exactly what the suite's ``LanguageModel.generate`` does, so greedy decoding
                   agrees token for token.
    padding        the suite's attention is causal only, with no padding mask: a mask with zeros (a
                   left-padded batch) is refused; right padding needs no mask for a causal model.
    loading        transformers 5 builds the model on the meta device and fills it from the safetensors;
                   the RoPE tables are buffers that are not saved, so :meth:`_init_weights` recomputes them.
    loss           ``labels`` give transformers' shifted causal-LM cross-entropy; MoE trunks also return the
                   load-balancing term as ``aux_loss`` (unweighted: the weight is a training choice).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import MoeCausalLMOutputWithPast

from models.config import TrunkConfig
from models.layers import rope_tables
from models.lm import LanguageModel
from models.wrappers.hf_config import SuiteLMConfig


class SuiteLMForCausalLM(PreTrainedModel, GenerationMixin):
    """A suite ``LanguageModel`` (any norm scheme, dense or MoE) behind transformers' causal-LM interface."""

    config_class = SuiteLMConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _tied_weights_keys = {"model.head.weight": "model.embed.weight"}  # only when config.tie_word_embeddings
    _no_split_modules = ["Block"]
    _supports_sdpa = True

    def __init__(self, config: SuiteLMConfig) -> None:
        super().__init__(config)
        self.model = LanguageModel(
            TrunkConfig(**(config.trunk or {})),
            config.vocab_size,
            max_seq_len=config.max_seq_len,
            tie_embeddings=config.tie_word_embeddings,
            rope_base=config.rope_base,
        )
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Recomputes the rotary tables; every weight comes from the file or from the suite's own init."""
        if isinstance(module, LanguageModel):
            head_dim = module.cfg.dim // module.cfg.num_heads
            cos, sin = rope_tables(module.max_seq_len, head_dim, module.rope_base, device=module.rope_cos.device)
            module.rope_cos.copy_(cos)
            module.rope_sin.copy_(sin)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.model.head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.model.head = value

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        **kwargs,
    ) -> MoeCausalLMOutputWithPast:
        """Logits ``(B, N, V)`` for ``input_ids`` ``(B, N)``; the loss too when ``labels`` are given.

        Raises:
            ValueError: ``attention_mask`` masks a position (padding inside the sequence is not supported).
        """
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError(
                "this model has causal attention without a padding mask: pass unpadded (or right-padded) "
                "sequences without masked positions, e.g. one prompt per generate() call"
            )
        logits, aux = self.model(input_ids, return_aux=True)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        moe = self.model.cfg.moe_experts > 0
        return MoeCausalLMOutputWithPast(loss=loss, logits=logits, aux_loss=aux if moe else None)

    def prepare_inputs_for_generation(self, input_ids: Tensor, attention_mask: Tensor | None = None, **kwargs) -> dict:
        """The whole sequence, cropped to the training window as ``LanguageModel.generate`` does (no cache)."""
        window = self.config.max_seq_len
        inputs = {"input_ids": input_ids[:, -window:]}
        if attention_mask is not None:
            inputs["attention_mask"] = attention_mask[:, -window:]
        return inputs
