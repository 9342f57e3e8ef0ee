"""The DiT ``test`` generation protocol: sample, score, and record how every number was measured.

    on_test_start     open the reference (a bad path fails here, before any sampling)
    on_test_epoch_end every rank: its chunks of the N samples       <run>/samples/<settings>/chunk_*.npz
                      rank 0:     samples-n<N>.npz (ADM layout), features in batches, FID / KID / P / R / IS,
                                  <run>/test_samples.png, metrics.json; broadcast, logged as test/<metric>
                                  (the reference's features: computed by the first run, then read from
                                  <latent cache>/fid_stats/, see experiments.evaluation.reference_cache)

``module.test_protocol`` (a flat dict: samples, sampler, steps, cfg scale and channels, reference path,
sha256 and image count, feature backend ...) goes into ``summary.json`` and the TensorBoard hparams, so a
comparison of runs can tell numbers measured under different protocols apart.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from experiments.evaluation.fid import build_feature_extractor, open_reference
from experiments.evaluation.fid.heldout import fid_stats_dir, heldout_reference
from experiments.evaluation.generation import score_against
from experiments.evaluation.reference_cache import with_cached_features
from experiments.monitoring.summary import RunSummary
from experiments.reliability.layout import trainer_run_dir
from experiments.tasks.sampling import (
    SamplePlan,
    chunk_files,
    generate_chunks,
    image_batches,
    plan_description,
    prepare_directory,
    sampling_settings,
    settings_dirname,
    write_adm_npz,
)

GRID_SAMPLES = 64
HELD_OUT = "held-out"  # fid_reference: real images of the data the latent cache was encoded from


class GenerationEvaluation:
    """One ``test`` run's generation metrics for a :class:`experiments.tasks.dit.LatentDiffusion` module."""

    def __init__(self, module) -> None:
        self.module, hp = module, module.hparams
        self.trainer = module.trainer
        if hp.fid_reference is None:
            raise ValueError(
                "model.init_args.fid_reference is not set; valid: a path to the reference (e.g. ADM's "
                "VIRTUAL_imagenet256_labeled.npz, a folder of images, a statistics .npz) or 'held-out'"
            )
        if hp.vae_path is None:
            raise ValueError(
                "model.init_args.vae_path is not set (synthetic latents have no VAE): samples cannot be decoded; "
                "valid: a latent cache made by datamodules.latents.encode, or --model.init_args.fid_samples=0"
            )
        self.held_out = hp.fid_reference == HELD_OUT
        self.reference = None if self.held_out else open_reference(hp.fid_reference)
        stored = None if self.reference is None or self.reference.stats is None else len(self.reference.stats.mu)
        if stored is not None and stored != hp.fid_feature:  # checked before any sample is drawn
            raise ValueError(
                f"model.init_args.fid_feature={hp.fid_feature}, but {hp.fid_reference} stores statistics of "
                f"{stored} features; valid: fid_feature={stored}, or a reference of images"
            )
        self.plan = SamplePlan(hp.fid_samples, hp.fid_batch_size, hp.num_classes, hp.sample_seed)

    # ------------------------------------------------------------------ where things go
    def run_dir(self) -> Path:
        return Path(trainer_run_dir(self.trainer))

    def settings(self) -> dict:
        return sampling_settings(self.module)

    def sample_dir(self, settings: dict) -> Path:
        return self.run_dir() / "samples" / settings_dirname(settings, self.plan.seed, self.plan.chunk_size)

    def reporter(self, phase: str) -> Callable[[int, int | None], None] | None:
        """Where a phase's ``(done, total)`` goes: the run's ``progress.json``, so a sweep shows each run's
        sampling and feature passes with a rate and an ETA (None without a :class:`RunSummary`, or off rank 0)."""
        summary = next((cb for cb in self.trainer.callbacks if isinstance(cb, RunSummary)), None)
        return None if summary is None else summary.phase_reporter(self.trainer, phase)

    # ------------------------------------------------------------------ the protocol
    def run(self) -> None:
        module, trainer = self.module, self.trainer
        settings = self.settings()
        directory = self.sample_dir(settings)
        if trainer.is_global_zero:
            prepare_directory(directory, plan_description(self.plan, **settings))
        trainer.strategy.barrier()

        def generate(labels: torch.Tensor, seeds: list[int]) -> torch.Tensor:
            return module.generate(labels.to(module.device), seeds, should_stop=lambda: trainer.received_sigterm)

        start = time.perf_counter()
        try:
            with tf32_matmuls(module.device):
                generated = generate_chunks(
                    self.plan,
                    directory,
                    generate,
                    trainer.global_rank,
                    trainer.world_size,
                    trainer.is_global_zero,
                    report=self.reporter("sampling"),
                )
        except InterruptedError:
            stop = SIGTERMException()
            stop.add_note(f"sampling interrupted by SIGTERM; its finished chunks are in {directory}: rerun to resume")
            raise stop from None
        self.rate = generated / (time.perf_counter() - start) if generated else None  # this rank's samples/s
        trainer.strategy.barrier()
        result = self.score(directory, settings) if trainer.is_global_zero else None
        result = trainer.strategy.broadcast(result, src=0)
        for name, value in result["values"].items():
            module.log(f"test/{name}", value, sync_dist=False, rank_zero_only=True)
        module.test_protocol = result["protocol"]
        for logger in module.loggers:
            logger.log_hyperparams({f"test_protocol/{k}": v for k, v in result["protocol"].items()})

    def score(self, directory: Path, settings: dict) -> dict:
        """Rank 0: the ADM file, the grid, the metrics and the protocol."""
        module, hp, plan = self.module, self.module.hparams, self.plan
        adm = directory / f"samples-n{plan.num_samples}.npz"
        if not adm.is_file():
            write_adm_npz(chunk_files(directory, plan), adm)
        grid = self.write_grid(directory)
        extractor = build_feature_extractor(hp.fid_weights, hp.fid_feature)
        extractor.module.to(module.device)
        reference, datamodule = self.reference, self.trainer.datamodule
        if reference is None:
            reference = heldout_reference(
                datamodule, extractor, hp.fid_real_images, hp.fid_feature_batch_size, module.device,
                report=self.reporter("reference features"),
            )  # fmt: skip
        else:  # its features once per (reference, network, layer, count): every seed and scheme reuses them
            reference = with_cached_features(
                reference, extractor, fid_stats_dir(datamodule), batch_size=hp.fid_feature_batch_size,
                device=module.device, report=self.reporter("reference features"),
            )  # fmt: skip
        scores, _ = score_against(
            reference,
            image_batches(directory, plan),
            extractor,
            num_samples=plan.num_samples,
            batch_size=hp.fid_feature_batch_size,
            device=module.device,
            report=self.reporter("sample features"),
        )
        protocol = {
            "samples": plan.num_samples,
            "sampler": settings["sampler"],
            "steps": settings["steps"],
            "cfg_scale": settings["cfg_scale"],
            "cfg_channels": settings["cfg_channels"],
            "labels": f"i mod {plan.num_classes}",
            "sample_seed": plan.seed,
            "reference": f"held-out images ({reference.path})" if self.held_out else str(reference.path),
            "reference_layout": reference.layout,
            "reference_sha256": reference.sha256,
            "reference_images": reference.image_count,
            "feature_backend": extractor.backend,
            "feature_dims": int(extractor.module.num_features),
            "pr_k": scores.details["pr_k"],
            "kid_subset_size": scores.details.get("kid_subset_size", "n/a"),
            "weights_sha256": settings["weights_sha256"][:16],
            "samples_file": str(adm),
            "sampling_precision": "fp32, TF32 matmuls (as the official DiT)"
            if module.device.type == "cuda"
            else "fp32",
        }
        rate = None if self.rate is None else round(self.rate * self.trainer.world_size, 4)
        record = {"values": scores.values, "unavailable": scores.unavailable, "protocol": protocol,
                  "grid": str(grid), "samples_per_s": rate}  # fmt: skip
        (directory / "metrics.json").write_text(json.dumps(record, indent=2))
        if rate is not None:
            print(f"sampled at {rate:.2f} samples/s ({self.trainer.world_size} rank(s))")
        print("\n".join(scores.lines()))
        print(f"protocol: {protocol_line(protocol)}")
        return record

    def write_grid(self, directory: Path) -> Path:
        """The first 64 samples (8 per row) as ``<run>/test_samples.png`` and in TensorBoard."""
        from torchvision.utils import make_grid, save_image

        images = next(image_batches(directory, self.plan))[:GRID_SAMPLES]
        grid = make_grid(images, nrow=8)  # uint8 (3, H', W')
        path = self.run_dir() / "test_samples.png"
        save_image(grid.float() / 255, path)
        for logger in self.module.loggers:
            if hasattr(logger.experiment, "add_image"):
                logger.experiment.add_image("test/samples", grid, self.module.global_step)
        return path


@contextmanager
def tf32_matmuls(device: torch.device) -> Iterator[None]:
    """TF32 matmuls and convolutions while sampling on CUDA, as the official DiT sample_ddp.py sets them."""
    if device.type != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def protocol_line(protocol: dict) -> str:
    """The protocol in one line, as README tables quote it."""
    count = protocol["reference_images"]
    dims = protocol.get("feature_dims", 2048)  # summaries written before the option have the published tap
    tap = "" if dims == 2048 else f" {dims}-d tap (not the published FID)"
    ref = f"{count} images" if isinstance(count, int) else count
    return (
        f"{protocol['samples']} samples, {protocol['sampler']} {protocol['steps']} steps, "
        f"cfg {protocol['cfg_scale']:g} ({protocol['cfg_channels']} channels), "
        f"vs {protocol['reference']} ({ref}, sha256 {protocol['reference_sha256'][:12]}), "
        f"{protocol['feature_backend']} InceptionV3{tap}, P/R k={protocol['pr_k']}, "
        f"KID subsets of {protocol['kid_subset_size']}"
    )
