"""Where runs live: ``<runs_root>/<task>/<experiment>/<run_name>/``, and the short task names used there."""

TASK_NAMES: dict[str, str] = {
    "LanguageModeling": "lm",
    "ImageClassification": "vit",
    "LatentDiffusion": "dit",
    "AutoencoderTraining": "vae",
}
