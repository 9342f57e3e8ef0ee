"""Everything Lightning: the tasks, the CLI, and the tools that train, compare and analyse norm schemes.

cli.py, __main__.py  the command line: LightningCLI's fit/validate/test/predict plus the tools
tasks/               one LightningModule per task (LM, ViT, DiT, VAE), its optimizer and its math
reliability/         what makes a run trustworthy: errors, checkpoints, run-directory layout
monitoring/          what a run records while it trains: summary.json, divergence, diagnostics
evaluation/          metrics beyond the training loss: FID and its reference statistics
sweeps/              running grids of runs: locally or as SLURM jobs, resumable, with live progress
results/             reading runs: comparisons, seed statistics, tables, plots, TensorBoard layout, exports
analysis/            post-hoc analyses of a checkpoint: layer pruning, per-stream logit lens
bench/               step time and activation memory of the schemes, side by side
"""
