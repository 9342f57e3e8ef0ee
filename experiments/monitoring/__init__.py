"""What a run records about itself while it trains: ``summary.json`` (curves, final metrics, status), loss
divergence and spike detection, the per-layer, per-stream diagnostics written to TensorBoard, the run's
row in TensorBoard's HPARAMS tab and its TensorBoard logger; and what it prints: the progress bar, the model
summary, and why a fit stopped before validating has no best checkpoint.

Belongs here: Lightning callbacks that observe a run without changing what it computes.
"""
