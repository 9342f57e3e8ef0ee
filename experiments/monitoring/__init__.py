"""What a run records about itself while it trains: ``summary.json`` (curves, final metrics, status), loss
divergence and spike detection, and the per-layer, per-stream diagnostics written to TensorBoard.

Belongs here: Lightning callbacks that observe a run without changing what it computes.
"""
