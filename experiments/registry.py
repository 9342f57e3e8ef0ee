"""Task LightningModules by short name (used for run directories)."""

TASK_NAMES: dict[str, str] = {
    "LanguageModeling": "lm",
    "ImageClassification": "vit",
    "LatentDiffusion": "dit",
    "AutoencoderTraining": "vae",
}
