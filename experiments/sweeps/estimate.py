"""What a run will cost before it runs: its resolved config, its step budget and its compute.

    run argv --resolve--> config dict (the -c files merged in order, then --key=value, as the CLI does)
             --budget---> --trainer.max_steps / --trainer.max_epochs from ``budget: {tokens|steps|epochs}``
             --estimate-> FLOPs: LM 6 N D (N: parameters without the input embedding, D: tokens);
                          ViT / DiT: FLOPs of one image's forward + backward, measured with
                          torch.utils.flop_counter on the meta device, times the images trained on
                          (DiT with ``test``: plus the sampler's forward passes for FID)
             --hours----> GPU-hours = FLOPs / (peak FLOP/s x MFU): the MFU a finished run of the same network
                          measured (its summary.json ``perf.mfu``) when the sweep directory holds one, else the
                          spec's assumed ``compute.mfu``; the run's note says which
             --memory---> per-GPU peak of one training step under the run's strategy and precision,
                          measured on fake tensors (experiments.parallel.memory), and one training step on
                          fake CUDA tensors in the GPU's dtypes (experiments.parallel.fake_step)

The merge here covers what the estimate reads (sizes, batch, devices, budget); the sweep never builds a task
module (runs are processes). A test checks it against the real CLI for every run of every shipped spec.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from experiments.monitoring.records import SUMMARY_FILE, read_json
from experiments.parallel.fake_step import FakeStepError, FakeStepResult, StepOptions, fake_cuda_step, step_options
from experiments.parallel.memory import (
    GB,
    MemoryEstimate,
    MemorySetup,
    Workload,
    check_shape,
    measure,
    parse_memory,
    setup_from_config,
    workload_for,
)
from experiments.sweeps.spec import Run, SpecError, SweepSpec, grid, sweep_dir_of
from fileio.checks import InputError
from models import TrunkConfig, count_params
from models.dit import DiT
from models.lm import LanguageModel
from models.vit import ViTClassifier

TASKS = {"LanguageModeling": "lm", "ImageClassification": "vit", "LatentDiffusion": "dit"}
GPU_MEMORY_GB = {"H200": 141, "H100": 80, "B200": 192, "B100": 192, "A100": 80, "L40S": 48, "V100": 32}
DEFAULT_GPU_MEMORY_GB = 80


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


CLASS_KEYS = ("class_path", "init_args", "dict_kwargs")


def _into_arguments(node: dict, part: str | None = None) -> dict:
    """Where the next key of an option goes: inside a class node (one with ``class_path``), a key that is not
    ``class_path`` / ``init_args`` is one of the class's arguments, as jsonargparse reads
    ``--trainer.strategy.data_parallel_size=2`` (= ``--trainer.strategy.init_args.data_parallel_size=2``)."""
    return node if "class_path" not in node or part in CLASS_KEYS else node.setdefault("init_args", {})


def resolve_config(argv: list[str]) -> dict:
    """The config a ``fit`` argv amounts to: ``-c`` files deep-merged in order, then ``--a.b=v`` set.

    Appending list options (``--trainer.callbacks+=...``) and options inside lists are skipped: nothing the
    estimate reads lives there.
    """
    config: dict = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-c", "--config"):
            if i + 1 >= len(argv):
                raise InputError(f"{arg} needs a config file after it; valid: {arg} CONFIG.yaml")
            path = Path(argv[i + 1])
            try:
                loaded = yaml.safe_load(path.read_text()) or {}
            except yaml.YAMLError as exc:
                line = str(exc).strip().splitlines()[0]
                raise InputError(f"{arg} {path} is not valid YAML ({line}); valid: a YAML mapping") from None
            except UnicodeDecodeError:
                raise InputError(f"{arg} {path} is not UTF-8 text; valid: a YAML mapping") from None
            if not isinstance(loaded, dict):
                raise InputError(
                    f"{arg} {path} holds a YAML {type(loaded).__name__}, not a mapping; valid: trainer:, model:, data:"
                )
            config = _merge(config, loaded)
            i += 2
            continue
        if arg.startswith("--") and "=" in arg:
            key, value = arg[2:].split("=", 1)
            if not key.endswith("+") and not key.startswith("trainer.callbacks"):
                node = config
                *parents, leaf = key.split(".")
                for part in parents:
                    node = _into_arguments(node, part)
                    if not isinstance(node.get(part), dict):  # a class given by name takes its init_args after it
                        name = node.get(part)
                        node[part] = {"class_path": name} if isinstance(name, str) and "." in name else {}
                    node = node[part]
                node = _into_arguments(node, leaf)
                node[leaf] = yaml.safe_load(value) if value else None
        i += 1
    return config


def _init(config: dict, section: str) -> dict:
    return (config.get(section) or {}).get("init_args") or {}


def task_name(config: dict) -> str:
    return TASKS.get(str((config.get("model") or {}).get("class_path", "")).rsplit(".", 1)[-1], "other")


def world_size(spec: SweepSpec, config: dict) -> int | None:
    """Devices a run trains on: the launcher's nodes x GPUs, else the config's ``devices x num_nodes``."""
    if spec.submitit and spec.launcher["gpus_per_node"]:
        return spec.launcher["nodes"] * spec.launcher["gpus_per_node"]
    trainer = config.get("trainer") or {}
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1) or 1
    return devices * nodes if isinstance(devices, int) and devices > 0 else None


def accumulation(config: dict) -> int:
    """``trainer.accumulate_grad_batches`` of a resolved config (1 when unset)."""
    return int((config.get("trainer") or {}).get("accumulate_grad_batches", 1) or 1)


def samples_per_step(spec: SweepSpec, config: dict) -> int | None:
    """Tokens (LM) or images (ViT, DiT) per optimizer step over all devices: ``global_batch_size`` when set (the
    samples of one optimizer step, accumulation included: the DataModules derive the micro-batch or the
    accumulation from it), else the micro-batch x devices x accumulation steps."""
    data, world = _init(config, "data"), world_size(spec, config)
    if data.get("global_batch_size"):
        batch = int(data["global_batch_size"])
    elif world is None or not data.get("batch_size"):
        return None
    else:
        batch = int(data["batch_size"]) * world * accumulation(config)
    return batch * (int(data.get("seq_len", 128)) if task_name(config) == "lm" else 1)


def launcher_args(spec: SweepSpec) -> list[str]:
    """The devices a submitit job holds, given to Lightning (its SLURM environment checks they match)."""
    if not spec.submitit or not spec.launcher["gpus_per_node"]:
        return []
    return [f"--trainer.num_nodes={spec.launcher['nodes']}", f"--trainer.devices={spec.launcher['gpus_per_node']}"]


def budget_args(spec: SweepSpec, run: Run) -> list[str]:
    """``--trainer.max_steps`` / ``--trainer.max_epochs`` for the spec's budget ([] without one)."""
    if not spec.budget:
        return []
    ((kind, value),) = spec.budget.items()
    if kind == "steps":
        return [f"--trainer.max_steps={value}"]
    if kind == "epochs":
        return [f"--trainer.max_epochs={value}", "--trainer.max_steps=-1"]
    config = resolve_config(run.argv(spec, extra=launcher_args(spec))[4:])
    per_step = samples_per_step(spec, config)
    if task_name(config) != "lm" or per_step is None:
        raise SpecError(
            f"budget.tokens needs an LM config with a known global batch ({spec.source}); "
            "valid: budget.steps or budget.epochs"
        )
    return [f"--trainer.max_steps={math.ceil(value / per_step)}"]


def run_extra_args(spec: SweepSpec, run: Run) -> list[str]:
    """What the sweep adds to a run's command beyond its grid point: devices, then budget."""
    return launcher_args(spec) + budget_args(spec, run)


@dataclass
class Estimate:
    """A run's compute. ``samples``: tokens (LM) or images trained on; FLOPs and hours None when unknown."""

    run: str
    task: str
    params: int
    steps: int | None
    per_step: int | None
    samples: float | None
    train_flops: float | None
    test_flops: float | None
    world: int | None
    gpu_hours: float | None
    note: str = ""
    mfu: float | None = None
    mfu_source: str = "assumed"


@functools.lru_cache(maxsize=64)
def _measured(task: str, key: str) -> tuple[int, int, float, float]:
    """(parameters, 6ND parameters, training FLOPs per sample, forward FLOPs per sample) of a network."""
    args = json.loads(key)
    trunk = TrunkConfig(**args.pop("trunk"))
    with torch.device("meta"):
        if task == "lm":
            net = LanguageModel(trunk, **args)
            total = count_params(net, active=True)
            flop_params = total - (0 if args.get("tie_embeddings") else net.embed.weight.numel())
            return total, flop_params, 6.0 * flop_params, 2.0 * flop_params
        if task == "vit":
            net = ViTClassifier(trunk, **args)
            inputs = (torch.zeros(1, 3, args["img_size"], args["img_size"]),)
        else:
            net = DiT(trunk, **args)
            size, ch = args["input_size"], args["in_channels"]
            inputs = (torch.zeros(1, ch, size, size), torch.zeros(1), torch.zeros(1, dtype=torch.long))
        with FlopCounterMode(display=False) as forward:
            out = net(*inputs)
        with FlopCounterMode(display=False) as backward:
            out.sum().backward()
    fwd = float(forward.get_total_flops())
    return count_params(net), 0, fwd + float(backward.get_total_flops()), fwd


def data_facts(task: str, config: dict, dataset: dict) -> tuple[dict, str]:
    """What the network's shape needs from the data and the config cannot say: the spec's ``dataset`` block
    (``dataset``), else the latent cache's meta.json when it exists, else the embedded data's, else ImageNet's
    (noted)."""
    data_cfg = config.get("data") or {}
    facts, note = dict(dataset), ""
    if task == "dit" and "latent_size" not in facts:
        meta = Path(str(_init(config, "data").get("cache_dir", ""))) / "meta.json"
        try:
            cached = json.loads(meta.read_text())
            facts.setdefault("latent_size", int(cached["latent_size"]))
            facts.setdefault("latent_channels", int(cached["latent_channels"]))
            facts.setdefault("num_classes", int(cached["num_classes"]))
        except (OSError, ValueError, KeyError, TypeError):
            note = "latents assumed 32x32x4 (set dataset.latent_size)"
    if task == "vit" and str(data_cfg.get("class_path", "")).endswith("EmbeddedImageDataModule"):
        facts.setdefault("num_classes", 10)  # Fashion-MNIST (or the digits fallback)
    return facts, note


def network_args(task: str, config: dict, dataset: dict) -> dict:
    """The arguments of the task's ``models`` network (``trunk`` a TrunkConfig dict), from the config and the
    data facts (:func:`data_facts`)."""
    model, data = _init(config, "model"), _init(config, "data")
    facts, _ = data_facts(task, config, dataset)
    trunk = TrunkConfig(**(model.get("trunk") or {})).to_dict()
    if task == "lm":
        vocab = 256 if data.get("tokenizer", "byte") == "byte" else int(data.get("bpe_vocab_size", 4096))
        return {
            "trunk": trunk,
            "vocab_size": vocab,
            "max_seq_len": int(data.get("seq_len", 128)),
            "tie_embeddings": bool(model.get("tie_embeddings", False)),
        }
    if task == "vit":
        default_size = (
            32 if str((config.get("data") or {}).get("class_path", "")).endswith("EmbeddedImageDataModule") else 224
        )
        return {
            "trunk": trunk,
            "img_size": int(data.get("image_size", default_size)),
            "patch_size": int(model.get("patch_size", 16)),
            "num_classes": facts.get("num_classes", 1000),
        }
    return {
        "trunk": trunk,
        "input_size": facts.get("latent_size", 32),
        "patch_size": int(model.get("patch_size", 2)),
        "in_channels": facts.get("latent_channels", 4),
        "num_classes": facts.get("num_classes", 1000),
        "learn_sigma": bool(model.get("learn_sigma", True)),
    }


def estimate(spec: SweepSpec, run: Run) -> Estimate:
    """The compute of one run of ``spec`` (with the budget and launcher applied as the sweep runs it)."""
    argv = run.argv(spec, extra=run_extra_args(spec, run))[4:]
    config = copy.deepcopy(resolve_config(argv))
    task, name = task_name(config), run.name(spec)
    trainer, model = config.get("trainer") or {}, _init(config, "model")
    if task == "other":
        return Estimate(name, task, 0, None, None, None, None, None, None, None, "not a trainable task config")
    network = network_args(task, config, spec.dataset)
    check_shape(network)  # an absurd width or depth: one line, before anything is built
    params, flop_params, train_per_sample, fwd_per_sample = _measured(task, json.dumps(network, sort_keys=True))
    per_step, world = samples_per_step(spec, config), world_size(spec, config)
    steps, note = trainer.get("max_steps"), ""
    if (steps is None or steps < 0) and trainer.get("max_epochs") and per_step:
        images = spec.dataset.get("train_images")
        steps = trainer["max_epochs"] * math.ceil(images / per_step) if images else None
        note = "" if images else "epochs budget: set dataset.train_images"
    samples = steps * per_step if steps and steps > 0 and per_step else None
    train = samples * train_per_sample if samples else None
    test = None
    if task == "dit" and spec.test:
        passes = int(model.get("fid_samples", 0)) * int(model.get("sample_steps", 0))
        test = passes * fwd_per_sample * (2 if float(model.get("guidance_scale", 1.0)) > 1 else 1)
    flops = None if train is None else train + (test or 0.0)
    measured = measured_mfus(spec)
    mfu, source = measured.get(json.dumps(network, sort_keys=True), (spec.compute["mfu"], "assumed"))
    hours = flops / (spec.compute["peak_tflops"] * 1e12 * mfu) / 3600 if flops is not None else None
    if task == "lm" and not note:
        note = f"6ND, N={flop_params / 1e6:,.1f}M"
    mfu_note = f"MFU {mfu:.1%} {source}" if measured else ""  # said per run once any run measured one
    note = "; ".join(n for n in (note, data_facts(task, config, spec.dataset)[1], mfu_note) if n)
    return Estimate(name, task, params, steps, per_step, samples, train, test, world, hours, note, mfu, source)


@functools.lru_cache(maxsize=256)
def _network_key(argv: tuple[str, ...], dataset: str) -> str:
    """The :func:`network_args` of a run's argv as JSON (cached: every estimate of a sweep asks for each run's)."""
    config = resolve_config(list(argv))
    return json.dumps(network_args(task_name(config), config, json.loads(dataset)), sort_keys=True)


def measured_mfus(spec: SweepSpec) -> dict[str, tuple[float, str]]:
    """``{network: (MFU, "measured by RUN on DEVICE")}`` from the finished runs of ``spec`` in its sweep directory
    whose ``summary.json`` records a numeric ``perf.mfu`` (a GPU run's; CPU runs record "n/a"). The network is the
    run's :func:`network_args` as JSON, so every lr and seed of one shape shares the measurement; the first
    finished run in grid order gives it. Empty when no run measured one (the spec's ``compute.mfu`` is used)."""
    sweep_dir = sweep_dir_of(spec)
    found: dict[str, tuple[float, str]] = {}
    if not sweep_dir.is_dir():
        return found
    for run in grid(spec):
        record = read_json(sweep_dir / run.name(spec) / SUMMARY_FILE)
        perf = record.get("perf") if record.get("status") == "finished" else None
        mfu = perf.get("mfu") if isinstance(perf, dict) else None
        if not isinstance(mfu, int | float) or isinstance(mfu, bool) or not 0 < mfu <= 1:
            continue
        argv = tuple(run.argv(spec, extra=run_extra_args(spec, run))[4:])
        key = _network_key(argv, json.dumps(spec.dataset, sort_keys=True))
        found.setdefault(key, (float(mfu), f"measured by {run.name(spec)} on {perf.get('device', '?')}"))
    return found


def per_device_batch(config: dict, setup: MemorySetup) -> int:
    """Samples one device steps on: ``data.batch_size``, else ``global_batch_size`` over the data-parallel ranks
    (tensor-parallel ranks share a batch) and the accumulation steps.

    Raises:
        InputError: neither is set.
    """
    data = _init(config, "data")
    if data.get("batch_size"):
        return int(data["batch_size"])
    if data.get("global_batch_size"):  # the image DataModule's split: global / (replicas x accumulation steps)
        ranks = setup.world_size // setup.tensor_parallel
        return math.ceil(int(data["global_batch_size"]) / max(1, ranks * accumulation(config)))
    raise InputError("data.init_args.batch_size (config) is not set; valid: batch_size or global_batch_size")


def memory_inputs(config: dict, dataset: dict | None = None) -> tuple[Workload, MemorySetup]:
    """The training step and device layout a resolved ``fit`` config asks for, for :func:`measure`.

    Raises:
        InputError: not an LM / ViT / DiT config, or a setting the estimate cannot read (one line).
    """
    task = task_name(config)
    if task == "other":
        model = (config.get("model") or {}).get("class_path")
        raise InputError(
            f"model.class_path={model!r} (config) has no memory estimate; valid: experiments.tasks.LanguageModeling, "
            "ImageClassification, LatentDiffusion"
        )
    setup = setup_from_config(config)
    model = _init(config, "model")
    ema = task == "dit" or bool(model.get("ema_decay"))
    workload = workload_for(task, network_args(task, config, dataset or {}), per_device_batch(config, setup), ema)
    return workload, setup


@functools.lru_cache(maxsize=64)
def _memory_cached(key: str) -> MemoryEstimate | Exception:
    """One measurement per distinct network, batch and layout; a failure is kept too (and raised by the caller),
    so the runs of one broken network cost one attempt, not one each."""
    task, network, batch, ema, setup, checkpointing = json.loads(key)
    setup = MemorySetup(**{**setup, "notes": tuple(setup["notes"])})
    try:
        return measure(workload_for(task, network, batch, ema), setup, checkpointing)
    except ValueError:
        raise  # a layout the estimate cannot take: said in the run's note
    except Exception as exc:  # noqa: BLE001 - the network failed its step: one line for the dry run, not a traceback
        return exc


def cuda_here() -> bool:
    """Whether this machine has a CUDA device (where a local sweep's ``accelerator: auto`` runs train)."""
    return torch.cuda.is_available()


def runs_on_cpu(spec: SweepSpec, config: dict) -> str | None:
    """Why a run of ``spec`` trains on CPU, where no GPU memory applies (None: it runs on GPUs). A run whose
    accelerator is ``auto`` (or unset) runs on GPUs when the sweep submits to GPU nodes or this machine has CUDA."""
    accelerator = str((config.get("trainer") or {}).get("accelerator") or "auto").lower()
    if accelerator == "cpu":
        return "trainer.accelerator=cpu"
    on_gpu_nodes = spec.submitit and bool(spec.launcher["gpus_per_node"])
    if accelerator == "auto" and not on_gpu_nodes and not cuda_here():
        return "trainer.accelerator=auto, run locally on a machine without CUDA"
    return None


@functools.lru_cache(maxsize=64)
def _fake_step_cached(key: str) -> FakeStepResult | FakeStepError:
    """One fake CUDA step per distinct network, batch, layout and optimizer settings; a failure is kept too."""
    task, network, batch, ema, setup, options = json.loads(key)
    setup = MemorySetup(**{**setup, "notes": tuple(setup["notes"])})
    options = StepOptions(**{**options, "betas": tuple(options["betas"])})
    try:
        return fake_cuda_step(workload_for(task, network, batch, ema), setup, options)
    except FakeStepError as exc:
        return exc


def fake_step(config: dict, dataset: dict | None = None) -> FakeStepResult:
    """One training step of a resolved GPU ``fit`` config on fake CUDA tensors (:mod:`experiments.parallel.fake_step`),
    shared by the runs of one network, batch, layout and optimizer.

    Raises:
        FakeStepError: the step failed (one line: what a GPU job would have failed on).
        InputError: a setting the step cannot read.
    """
    workload, setup = memory_inputs(config, dataset)
    task = task_name(config)
    options = step_options(config)
    key = [task, network_args(task, config, dataset or {}), per_device_batch(config, setup), workload.ema,
           asdict(setup), asdict(options)]  # fmt: skip
    result = _fake_step_cached(json.dumps(key, sort_keys=True))
    if isinstance(result, FakeStepError):
        raise result
    return result


def memory_estimate(spec: SweepSpec, run: Run) -> MemoryEstimate | str:
    """The per-GPU peak of one run as the sweep runs it (its own activation-checkpointing setting), or a one-line
    reason it has none (a run that trains on CPU: :func:`runs_on_cpu`), after one training step of it on fake
    CUDA tensors (:func:`fake_step`; its note says so). Runs of one shape, batch and layout share one
    measurement and one step (lrs and seeds do not matter).

    Raises:
        RuntimeError: the network's step failed on fake tensors, or on fake CUDA tensors (the dry run names the
            run and the cause).
    """
    config = resolve_config(run.argv(spec, extra=run_extra_args(spec, run))[4:])
    task = task_name(config)
    if task == "other":
        return "no memory estimate: not a trainable task config"
    if cpu := runs_on_cpu(spec, config):
        return f"runs on CPU ({cpu}): no GPU memory to estimate"
    try:
        workload, setup = memory_inputs(config, spec.dataset)
        network = network_args(task, config, spec.dataset)
        key = [task, network, per_device_batch(config, setup), workload.ema, asdict(setup), setup.checkpointing]
        result = _memory_cached(json.dumps(key, sort_keys=True))
    except ValueError as exc:  # InputError included: a setting the estimate cannot read, a mesh that cannot shard
        return f"no memory estimate: {exc}"
    if isinstance(result, Exception):
        cause = (str(result).strip().splitlines() or [""])[0]
        raise RuntimeError(f"memory estimate failed: {type(result).__name__}: {cause}") from result
    try:
        step = fake_step(config, spec.dataset)
    except FakeStepError as exc:
        raise RuntimeError(f"fake CUDA step failed: {exc}") from exc
    except ValueError as exc:
        return f"no fake CUDA step: {exc}"
    kind = str(step.compute_dtype).removeprefix("torch.") + (" + autocast" if step.autocast else "")
    return replace(result, notes=(*result.notes, f"fake CUDA step ok ({kind})"))


def gpu_memory_of(gpu: str) -> tuple[int, str]:
    """Bytes of one device named by a spec's ``compute.gpu`` (``"H100 SXM, bf16 dense"`` -> 80 GB), and how it
    was found: a size written in the name (``"A100 40GB"``), else the model's, else 80 GB (said so)."""
    match = re.search(r"(\d+(?:\.\d+)?)\s*(GB|GiB)\b", gpu, re.IGNORECASE)
    if match:
        return parse_memory(match[0], "compute.gpu", "spec"), f"{match[0]} from compute.gpu"
    for model, size in GPU_MEMORY_GB.items():
        if model.lower() in gpu.lower():
            return int(size * GB), f"{model}: {size} GB"
    return int(DEFAULT_GPU_MEMORY_GB * GB), f"{DEFAULT_GPU_MEMORY_GB} GB assumed ({gpu!r} not known)"
