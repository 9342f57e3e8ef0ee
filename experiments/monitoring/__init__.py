"""What a run records about itself while it trains: ``summary.json`` (curves, final metrics, status), loss
divergence and spike detection, the per-layer, per-stream diagnostics written to TensorBoard, and the run's
row in TensorBoard's HPARAMS tab.

Belongs here: Lightning callbacks that observe a run without changing what it computes.
"""
