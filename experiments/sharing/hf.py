"""LM -> transformers: a folder ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` loads.

    DIR/config.json                  SuiteLMConfig (model_type "suite_lm", the trunk, auto_map)
    DIR/configuration_suite_lm.py    generated from models/wrappers/hf_config.py
    DIR/modeling_suite_lm.py         generated from models/wrappers/hf_lm.py and every models/ module it uses
    DIR/model.safetensors            the run's weights under ``model.`` (tied head stored once)
    DIR/generation_config.json       the run's predict sampling (temperature, top_k), no cache
    DIR/tokenizer.json, tokenizer_config.json   the run's tokenizer: PreTrainedTokenizerFast.from_pretrained(DIR)
                                     loads it silently with no remote code (AutoTokenizer reads config.json
                                     first, whose auto_map asks about remote code)

transformers' own conventions write the folder: the generated classes are imported from a scratch
package, ``register_for_auto_class`` marks them, and ``save_pretrained`` copies their files and writes
``auto_map``. The check, as OLMo-core's checkpoint conversion validates its output: in a fresh interpreter
without the suite, the reloaded model's float32 logits on random ids equal the suite's (1e-5), greedy
``generate`` equals the suite's greedy ``LanguageModel.generate`` and the tokenizer gives the suite's ids.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch
from transformers import GenerationConfig

from experiments.evaluation.downstream.checkpoint import run_tokenizer
from experiments.reliability.errors import SuiteError
from experiments.sharing.checkpoint import RunCheckpoint
from experiments.sharing.hf_tokenizer import PROBE_TEXT, probe_text, special_ids, to_transformers
from experiments.sharing.isolated import Reloaded, ReloadFailed, reload_exports
from experiments.sharing.report import ExportOptions, ExportReport
from experiments.sharing.source import bundle
from models import LanguageModel, count_params

CONFIG_MODULE, CONFIG_STEM = "models.wrappers.hf_config", "configuration_suite_lm"
MODEL_MODULE, MODEL_STEM = "models.wrappers.hf_lm", "modeling_suite_lm"
LOGIT_TOLERANCE = 1e-5  # float32, as OLMo-core's conversion check
CHECK_TOKENS = 16  # greedy tokens compared


def code_files() -> dict[str, str]:
    """The two modules the folder carries, generated from the suite's source."""
    return {
        CONFIG_STEM: bundle([CONFIG_MODULE], title="SuiteLMConfig: a SiameseNorm-suite language model's configuration"),
        MODEL_STEM: bundle(
            [MODEL_MODULE], {CONFIG_MODULE: CONFIG_STEM}, title="SuiteLMForCausalLM: a SiameseNorm-suite language model"
        ),
    }


@contextlib.contextmanager
def imported(directory: Path, files: dict[str, str]) -> Iterator[dict[str, ModuleType]]:
    """Writes ``files`` (stem -> source) as a fresh package under ``directory`` and imports them; forgets them after."""
    package = f"suite_export_{uuid.uuid4().hex[:12]}"
    (directory / package).mkdir(parents=True)
    (directory / package / "__init__.py").write_text("")
    for stem, source in files.items():
        (directory / package / f"{stem}.py").write_text(source)
    sys.path.insert(0, str(directory))
    try:
        yield {stem: importlib.import_module(f"{package}.{stem}") for stem in files}
    finally:
        sys.path.remove(str(directory))
        for name in [n for n in sys.modules if n == package or n.startswith(f"{package}.")]:
            del sys.modules[name]


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """transformers' progress bars off for the duration (a one-file save needs no bar on the export's output)."""
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()


def generation_config(run: RunCheckpoint, eos: int | None, pad: int | None) -> GenerationConfig:
    """The run's ``predict`` sampling (temperature, top-k) as transformers generation defaults; no KV cache.

    The number of tokens is left to the caller (``max_new_tokens``): a default here would override the
    ``max_length`` tools such as lm-eval pass.
    """
    hp = run.hparams
    temperature, top_k = float(hp.get("temperature", 1.0)), hp.get("top_k")
    sampling = temperature > 0
    return GenerationConfig(
        do_sample=sampling,
        temperature=temperature if sampling else None,
        top_k=int(top_k) if sampling and top_k else None,
        eos_token_id=eos,
        pad_token_id=pad,
        use_cache=False,
    )


def write(net: LanguageModel, run: RunCheckpoint, tokenizer, folder: Path, scratch: Path) -> None:
    """Saves ``net`` and ``tokenizer`` into ``folder`` through the generated classes' ``save_pretrained``."""
    eos, pad = special_ids(tokenizer)
    with imported(scratch / "code", code_files()) as modules:
        config_class = modules[CONFIG_STEM].SuiteLMConfig
        model_class = modules[MODEL_STEM].SuiteLMForCausalLM
        tied = net.head.weight is net.embed.weight
        config = config_class(
            trunk=net.cfg.to_dict(),
            vocab_size=net.vocab_size,
            max_seq_len=net.max_seq_len,
            rope_base=net.rope_base,
            tie_word_embeddings=tied,
        )
        model = model_class(config)
        model.model.load_state_dict(net.state_dict())
        model.generation_config = generation_config(run, eos, pad)
        config_class.register_for_auto_class()
        model_class.register_for_auto_class("AutoModelForCausalLM")
        with _quiet_progress():
            model.save_pretrained(folder)
    to_transformers(tokenizer, net.max_seq_len).save_pretrained(folder)


def decode_probes(net: LanguageModel) -> list[list[int]]:
    """Id lists whose decoding must agree: every single id below 256 (each byte, for bytes), and random runs
    that cut characters apart (U+FFFD where they do) and mix in the end-of-text id."""
    gen = torch.Generator().manual_seed(1)
    runs = [torch.randint(0, net.vocab_size, (24,), generator=gen).tolist() for _ in range(8)]
    return [[i] for i in range(min(256, net.vocab_size))] + runs + [[196, 0, 128, 104, 195, 169][: net.vocab_size]]


def check_inputs(net: LanguageModel, tokenizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Random ids over the whole window (batch 2), a prompt from the probe text, and the id lists to decode."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, net.vocab_size, (2, min(net.max_seq_len, 64)), generator=gen)
    prompt = torch.tensor([tokenizer.encode(PROBE_TEXT)[: max(1, min(8, net.max_seq_len // 2))]])
    request = {"max_new_tokens": CHECK_TOKENS, "text": probe_text(tokenizer), "decode": decode_probes(net)}
    return {"ids": ids, "prompt": prompt}, request


def compare(net: LanguageModel, tokenizer, inputs: dict[str, torch.Tensor], reloaded: Reloaded) -> list[str]:
    """The check lines; :class:`ReloadFailed` on the first difference."""
    out = reloaded.outputs
    with torch.no_grad():
        want = net.float().eval()(inputs["ids"])
        greedy = net.generate(inputs["prompt"], CHECK_TOKENS, temperature=0)
    diff = float((out["logits"] - want).abs().max())
    if diff > LOGIT_TOLERANCE:
        raise ReloadFailed(f"the reloaded model's logits differ from the suite's by {diff:.2e} (> {LOGIT_TOLERANCE:g})")
    got = out["generated"][0].tolist()
    eos, _ = special_ids(tokenizer)
    ends_early = len(got) < greedy.shape[1] and eos is not None and got[-1] == eos  # generate stops at end-of-text
    if got != greedy[0, : len(got)].tolist() or (len(got) < greedy.shape[1] and not ends_early):
        raise ReloadFailed(f"greedy generate gave {got}, the suite's generate {greedy[0].tolist()}")
    text = probe_text(tokenizer)
    for route, key in (("PreTrainedTokenizerFast", "text_ids"), ("AutoTokenizer", "auto_text_ids")):
        if key in out and out[key].tolist() != tokenizer.encode(text):
            raise ReloadFailed(f"{route} gives other ids than the run's {tokenizer.kind} tokenizer on {text!r}")
    probes = decode_probes(net)
    for route, key in (("PreTrainedTokenizerFast", "decoded"), ("AutoTokenizer", "auto_decoded")):
        for ids, got_text in zip(probes, reloaded.result.get(key, []), strict=False):
            if got_text != tokenizer.decode(ids):
                raise ReloadFailed(
                    f"{route} decodes {ids} as {got_text!r}, the run's {tokenizer.kind} tokenizer as "
                    f"{tokenizer.decode(ids)!r}"
                )
    shape = "x".join(map(str, inputs["ids"].shape))
    return [
        f"logits on {shape} random ids: max |diff| {diff:.1e} (float32, tolerance {LOGIT_TOLERANCE:g})",
        f"greedy generate: {len(got) - inputs['prompt'].shape[1]} tokens equal to the suite's LanguageModel.generate",
        f"PreTrainedTokenizerFast and AutoTokenizer ({reloaded.result['tokenizer_class']}): the run's "
        f"{tokenizer.kind} ids on a mixed-script probe text and its texts for {len(probes)} id lists",
    ]


def export(run: RunCheckpoint, folder: Path, scratch: Path, options: ExportOptions) -> ExportReport:
    """Writes the transformers folder for an LM run (and checks it unless ``options.check`` is off)."""
    tokenizer = run_tokenizer(run.data_hparams, run.path, options.tokenizer)
    if tokenizer.vocab_size > int(run.hparams["vocab_size"]):
        raise SuiteError(
            f"the tokenizer has {tokenizer.vocab_size} tokens, the run's model {run.hparams['vocab_size']}; "
            "valid: --tokenizer DIR of the tokenizer the run trained with"
        )
    net = run.network()
    write(net, run, tokenizer, folder, scratch)
    usage = (
        "from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast\n\n"
        'model = AutoModelForCausalLM.from_pretrained("DIR", trust_remote_code=True)\n'
        'tokenizer = PreTrainedTokenizerFast.from_pretrained("DIR")  # transformers\' own class, no remote code\n'
        'ids = tokenizer("In the beginning", return_tensors="pt").input_ids\n'
        "print(tokenizer.decode(model.generate(ids, max_new_tokens=50)[0]))"
    )
    report = ExportReport("transformers", "SuiteLMForCausalLM", count_params(net), usage)
    report.notes.append(
        "no key/value cache: each generated token runs the whole window, as the suite's own generate does; "
        "padded batches (attention_mask with zeros) are refused"
    )
    if options.check:
        inputs, request = check_inputs(net, tokenizer)
        (reloaded,) = reload_exports("hf", [(folder, inputs, request)], scratch / "reload")
        report.checks = compare(net, tokenizer, inputs, reloaded)
        report.load_s = float(reloaded.result["load_s"])
    return report
