"""What every exporter is given and what it returns: the contract between the command and the formats.

    export(run: RunCheckpoint, folder: Path, scratch: Path, options: ExportOptions) -> ExportReport

``folder`` is the (staged) export; ``scratch`` a directory for generated code and the reload check that is
deleted afterwards. The report feeds the printed summary and the model card.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ExportOptions:
    """Command-line choices an exporter may need.

    Attributes:
        tokenizer: LM: a directory holding the run's tokenizer when it cannot be found from the run.
        vae: DiT: the AutoencoderKL directory to ship (default: the run's ``vae_path``, when it has one).
        check: reload the export in a fresh interpreter without the suite and compare its outputs.
    """

    tokenizer: Path | None = None
    vae: Path | None = None
    check: bool = True


@dataclass
class ExportReport:
    """What an export holds and how it was checked.

    Attributes:
        library: the library that loads it ("transformers", "timm", "diffusers").
        model_class: the class a user gets back.
        params: parameters of the exported network (tied ones once).
        usage: Python lines that load it and run it once (for the model card and the README).
        checks: one line per check that passed (empty when ``check`` was off).
        load_s: seconds the ecosystem's loading call took in the fresh interpreter (None without a check).
        notes: what a user must know (e.g. no VAE: latents only).
    """

    library: str
    model_class: str
    params: int
    usage: str
    checks: list[str] = field(default_factory=list)
    load_s: float | None = None
    notes: list[str] = field(default_factory=list)
