"""Loads exports the way their users will, in an interpreter where the suite cannot be imported.

Run as ``python -I reload.py JOB.json`` from a scratch directory (:mod:`experiments.sharing.isolated` does),
so ``sys.path`` holds the installed packages and nothing of the suite; this file therefore imports nothing
from the suite. ``JOB.json``: ``{"format": "hf" | "timm" | "diffusers", "items": [{"folder", "io"}, ...],
"threads": N}`` (N: the caller's torch thread count); each item's ``io`` directory holds
``inputs.safetensors`` and ``request.json`` and receives ``outputs.safetensors`` (what the loaded model
computed) and ``result.json`` (load time, classes, and whether the suite was importable: it must not be)::

    hf         AutoModelForCausalLM, PreTrainedTokenizerFast / AutoTokenizer -> logits, greedy generate, ids, texts
    timm       import <code>; timm.create_model("local-dir:...")      -> logits, resolve_data_config +
                                                                         create_transform of a PNG
    diffusers  DiffusionPipeline.from_pretrained(trust_remote_code)   -> samples for labels and seeds

The parent compares the outputs with the suite's own networks.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def check_hf(folder: Path, inputs: dict[str, torch.Tensor], request: dict) -> tuple[dict, dict]:
    """The model through AutoModelForCausalLM; the tokenizer both ways a user loads it: the card's
    ``PreTrainedTokenizerFast.from_pretrained`` (no config.json, no remote code, silent) and ``AutoTokenizer``
    as lm-eval's ``hf`` model calls it; each must encode the text and decode every id list alike."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    load_s = time.perf_counter() - start
    auto = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    with torch.no_grad():
        logits = model(inputs["ids"]).logits
        generated = model.generate(inputs["prompt"], max_new_tokens=request["max_new_tokens"], do_sample=False)
    text_ids = torch.tensor(tokenizer(request["text"])["input_ids"], dtype=torch.long)
    auto_ids = torch.tensor(auto(request["text"])["input_ids"], dtype=torch.long)
    decoded = [tokenizer.decode(ids) for ids in request.get("decode", [])]
    auto_decoded = [auto.decode(ids) for ids in request.get("decode", [])]
    outputs = {"logits": logits.float(), "generated": generated, "text_ids": text_ids, "auto_text_ids": auto_ids}
    info = {"load_s": load_s, "model_class": type(model).__name__, "tokenizer_class": type(tokenizer).__name__}
    return outputs, info | {"decoded": decoded, "auto_decoded": auto_decoded}


def check_timm(folder: Path, inputs: dict[str, torch.Tensor], request: dict) -> tuple[dict, dict]:
    import timm
    from PIL import Image
    from timm.data import create_transform, resolve_data_config

    start = time.perf_counter()
    sys.path.insert(0, str(folder))  # the export's registration module: timm has no remote-code loader
    importlib.import_module(request["code"])
    model = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    load_s = time.perf_counter() - start
    data_config = resolve_data_config({}, model=model)
    with Image.open(request["image"]) as image:
        transformed = create_transform(**data_config)(image.convert("RGB"))
    with torch.no_grad():
        logits = model(inputs["images"])
    info = {"load_s": load_s, "model_class": type(model).__name__, "data_config": data_config}
    return {"logits": logits, "transformed": transformed}, info


def check_diffusers(folder: Path, inputs: dict[str, torch.Tensor], request: dict) -> tuple[dict, dict]:
    from diffusers import DiffusionPipeline

    start = time.perf_counter()
    pipe = DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)
    load_s = time.perf_counter() - start
    generators = [torch.Generator().manual_seed(int(s)) for s in request["seeds"]]
    out = pipe(
        request["labels"],
        generator=generators,
        num_inference_steps=request["steps"],
        output_type=request["output_type"],
    ).images
    info = {"load_s": load_s, "model_class": type(pipe).__name__, "transformer_class": type(pipe.transformer).__name__}
    return {"samples": out}, info


CHECKS = {"hf": check_hf, "timm": check_timm, "diffusers": check_diffusers}


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(int(job["threads"]))  # the exporting process's: floats reduce the same way
    suite_importable = any(importlib.util.find_spec(name) is not None for name in ("models", "experiments"))
    for item in job["items"]:
        folder, io = Path(item["folder"]), Path(item["io"])
        request = json.loads((io / "request.json").read_text())
        outputs, info = CHECKS[job["format"]](folder, load_file(io / "inputs.safetensors"), request)
        save_file({k: v.contiguous() for k, v in outputs.items()}, io / "outputs.safetensors")
        info["suite_importable"] = suite_importable
        info["sys_path"] = list(sys.path)
        (io / "result.json").write_text(json.dumps(info, default=str))


if __name__ == "__main__":
    main()
