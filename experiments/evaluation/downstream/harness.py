"""lm-evaluation-harness over a suite LM: ``lm_eval`` model ``"suite-lm"``, registered when this module is imported.

    python -m experiments lm-eval --ckpt runs/lm/tiny/siamese/checkpoints/last.ckpt --tasks ...
    simple_evaluate(model="suite-lm", model_args={"ckpt": ...}, ...)     (after importing this module)

A :class:`lm_eval.api.model.TemplateLM` (the harness's base for token-level models, an ``LM`` subclass):
the harness turns task documents into (context, continuation) strings, ``TemplateLM`` tokenizes them
with ``tok_encode`` (our tokenizer; trailing context spaces move to the continuation) and calls
:meth:`SuiteLM._loglikelihood_tokens`, which scores them here in length-sorted batches (the harness's
``Collator``, longest first). Rows longer than the window keep the continuation and the end of the
context (left truncation, as the harness's HF model does); a continuation longer than the window is an
error. ``loglikelihood_rolling`` uses the harness's rolling windows; ``generate_until`` decodes one
request at a time (our model has no padding mask), greedy unless the task asks for sampling.

Special tokens (the suite's LMs train on raw text without them): end-of-text is the tokenizer's declared
one, else id 0 (NUL for bytes; it stops generation). The token an empty context or a rolling window starts
from (``prefix_token_id``) is that same end-of-text token: the convention of lm-eval's own ``hf`` model on an
export (it starts from the tokenizer's BOS, else its EOS; an export declares end-of-text as EOS and no BOS),
so ``lm-eval`` on a checkpoint and ``lm_eval --model hf`` on its export give the same loglikelihoods.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator, handle_stop_sequences
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from torch import Tensor, nn
from tqdm.auto import tqdm

from datamodules.text.tokenizers import TextTokenizer
from experiments.evaluation.downstream.tokenizer import end_of_text_id

MODEL_NAME = "suite-lm"
DTYPES = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


@register_model(MODEL_NAME)
class SuiteLM(TemplateLM):
    """An lm-eval model over a suite ``LanguageModel`` and its tokenizer.

    Args:
        model: maps token ids ``(B, N)`` to logits ``(B, N, V)``; ``max_seq_len`` is its window.
        tokenizer: the tokenizer it was trained with.
        batch_size: rows per forward pass.
        device: where the model runs; None, or CUDA on a machine without: CUDA when available, else CPU.
        dtype: autocast dtype ("float32" runs without autocast).
        max_gen_toks: default number of generated tokens for ``generate_until``.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: TextTokenizer,
        batch_size: int | str = 32,
        device: str | None = None,
        dtype: str = "float32",
        max_gen_toks: int = 256,
    ) -> None:
        super().__init__()
        if str(batch_size).isdigit() and int(batch_size) > 0:
            self.batch_size = int(batch_size)
        else:
            raise ValueError(f"batch_size={batch_size!r} is not supported; valid: a positive integer (no 'auto')")
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} is not supported; valid: {', '.join(DTYPES)}")
        if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
            device = "cuda" if torch.cuda.is_available() else "cpu"  # the harness defaults to cuda:0 anywhere
        self._device = torch.device(device)
        self.model = model.to(self._device).eval()
        self.text_tokenizer = tokenizer
        self.autocast_dtype = DTYPES[dtype]
        self.max_gen_toks = int(max_gen_toks)
        declared = end_of_text_id(tokenizer)
        self._eot = 0 if declared is None else declared
        self._prefix = self._eot  # as lm-eval's hf model on the export: its EOS (see the module docstring)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None) -> SuiteLM:
        """``--model_args ckpt=PATH[,tokenizer=DIR,dtype=bfloat16,...]``: loads the checkpoint."""
        from experiments.evaluation.downstream.checkpoint import load_lm

        args = {**{k: v for k, v in (additional_config or {}).items() if v is not None}, **arg_dict}
        args.pop("max_batch_size", None)  # a fixed batch size: nothing to search up to
        ckpt = args.pop("ckpt", None)
        if ckpt is None:
            raise ValueError("model suite-lm needs --model_args ckpt=PATH; valid: a .ckpt file of an LM run")
        loaded = load_lm(str(ckpt), args.pop("tokenizer", None))
        return cls(loaded.net, loaded.tokenizer, **args)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict[str, Any] | None = None) -> SuiteLM:
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # ------------------------------------------------------------------------------------ tokens

    @property
    def eot_token_id(self) -> int:
        return self._eot

    @property
    def prefix_token_id(self) -> int:
        return self._prefix

    @property
    def max_length(self) -> int:
        return int(self.model.max_seq_len)

    @property
    def tokenizer_name(self) -> str:
        return f"suite-{self.text_tokenizer.kind}{self.text_tokenizer.vocab_size}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.text_tokenizer.encode(string)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.text_tokenizer.decode(tokens)

    def _forward(self, ids: Tensor) -> Tensor:
        autocast = (
            torch.autocast(self._device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype is not None
            else contextlib.nullcontext()
        )
        with torch.no_grad(), autocast:
            return self.model(ids.to(self._device)).float()  # (B, N, V)

    # -------------------------------------------------------------------------------- requests

    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        """Sum of log-probs of each continuation given its context, and whether greedy decoding yields it."""
        window = self.max_length
        for _, _, continuation in requests:
            if len(continuation) > window:
                raise ValueError(
                    f"a continuation of {len(continuation)} tokens does not fit the model's {window}-token window"
                )
        collator = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])))
        answers: list[tuple[float, bool]] = []
        bar = tqdm(total=len(requests), desc="suite-lm loglikelihood", disable=disable_tqdm or self.rank != 0)
        for chunk in collator.get_batched(n=self.batch_size):
            rows = [(context + continuation)[-(window + 1) :][:-1] for _, context, continuation in chunk]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), self._eot, dtype=torch.long)  # right padding: never scored
            for i, row in enumerate(rows):
                ids[i, : len(row)] = torch.tensor(row)
            logits = self._forward(ids)  # (B, width, V)
            for i, ((request, _, continuation), row) in enumerate(zip(chunk, rows, strict=True)):
                n = len(continuation)
                # (n, V): the predictions of the continuation, in float64 (sums of many log-probs)
                scored = logits[i, len(row) - n : len(row)].double().log_softmax(dim=-1).cpu()
                target = torch.tensor(continuation)
                answer = (float(scored.gather(1, target[:, None]).sum()), bool((scored.argmax(-1) == target).all()))
                answers.append(answer)
                if request is not None:
                    self.cache_hook.add_partial("loglikelihood", request, answer)
            bar.update(len(chunk))
        bar.close()
        return collator.get_original(answers)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of whole documents over disjoint windows (each token predicted once)."""
        totals = []
        for request in tqdm(requests, desc="suite-lm rolling", disable=disable_tqdm or self.rank != 0):
            (text,) = request.args
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    token_list=self.tok_encode(text),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            scores = self._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in windows], disable_tqdm=True)
            total = sum(score for score, _ in scores)
            totals.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Decodes each request until a stop string, end-of-text or ``max_gen_toks`` tokens."""
        outputs = []
        eot_text = self.tok_decode([self.eot_token_id])
        for request in tqdm(requests, desc="suite-lm generate", disable=disable_tqdm or self.rank != 0):
            context, gen_kwargs = request.args
            kwargs = dict(gen_kwargs)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eot_text)
            max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            temperature = float(kwargs.pop("temperature", 0.0))
            sample = bool(kwargs.pop("do_sample", temperature > 0)) and temperature > 0
            tokens = self.tok_encode(context) or [self.prefix_token_id]
            generated: list[int] = []
            for _ in range(max_new):
                ids = torch.tensor([(tokens + generated)[-self.max_length :]])
                logits = self._forward(ids)[0, -1]  # (V,)
                if sample:
                    nxt = int(torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1))
                else:
                    nxt = int(logits.argmax())
                if nxt == self.eot_token_id:
                    break
                generated.append(nxt)
                if any(stop in self.tok_decode(generated) for stop in until):
                    break
            text = self.tok_decode(generated)
            for stop in until:
                text = text.split(stop)[0]
            outputs.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return outputs
