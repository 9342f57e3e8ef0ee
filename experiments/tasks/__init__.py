"""The task LightningModules, one per modality, over the shared trunk, and what only they use.

Belongs here: a ``TaskModule`` subclass per task (its ``model_step``, metrics and ``predict_step``),
the optimizer and schedule every task shares (``optim.py``), and a task's own math (``diffusion.py``).
Not here: evaluation protocols (``experiments.evaluation``), run bookkeeping (``experiments.monitoring``,
``experiments.reliability``), grids of runs (``experiments.sweeps``).

Configs name these classes as ``class_path: experiments.tasks.<Class>``.
"""

from experiments.tasks.base import TaskModule
from experiments.tasks.dit import LatentDiffusion
from experiments.tasks.lm import LanguageModeling
from experiments.tasks.optim import OptimConfig
from experiments.tasks.vae import AutoencoderTraining
from experiments.tasks.vit import ImageClassification

__all__ = [
    "AutoencoderTraining",
    "ImageClassification",
    "LanguageModeling",
    "LatentDiffusion",
    "OptimConfig",
    "TaskModule",
]
