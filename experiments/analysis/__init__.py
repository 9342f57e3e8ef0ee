"""Post-hoc analyses of a trained checkpoint: what each block and each residual stream contributes::

    python -m experiments prune --ckpt runs/lm/tiny/siamese/checkpoints/last.ckpt [--batches 8] [--out DIR]
    python -m experiments logit-lens --ckpt runs/lm/tiny/siamese/checkpoints/last.ckpt [--batches 8]

``prune`` (every task) measures layer-pruning sensitivity: the validation loss with all blocks, then
with each block skipped in turn (``skip_blocks``), on the same fixed validation batches (DiT: the same
seeded evaluation noise), and writes ``pruning.md``, ``pruning.csv`` and ``pruning.png``.

``logit-lens`` (language models) reads the final residual state stream by stream: each stream's own
readout (``readout.streams``) goes through the LM head, and its top-1 prediction is compared with the
full model's, overall and where the streams disagree with each other; each stream's next-token
accuracy and loss come alongside. Writes ``logit_lens.md`` and ``logit_lens.csv``.

The module and its DataModule are rebuilt with the suite's CLI from the run directory's saved
``config.yaml`` (the checkpoint's ``../config.yaml``), or from ``--config`` files plus any CLI overrides
given after the options, and the checkpoint's weights are loaded into it.
"""
