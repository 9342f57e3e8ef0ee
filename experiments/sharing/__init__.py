"""Sharing a trained model: ``python -m experiments export`` writes a run in its ecosystem's own layout.

    cli.py                the command: arguments, the refusals, staging, the printed summary
    checkpoint.py         a run's checkpoint read safely: task, settings, the evaluated network, summary.json
    source.py             the self-contained code an export carries, generated from the suite's own modules
    hf.py, hf_tokenizer.py   LM -> transformers (AutoModelForCausalLM with trust_remote_code; the tokenizer with
                          PreTrainedTokenizerFast, no remote code)
    timm_export.py        ViT -> timm's hub layout (timm.create_model("local-dir:...")), the eval transform as
                          pretrained_cfg
    diffusers_export.py, dit_pipeline.py   DiT -> a diffusers pipeline folder running the suite's sampler
    reload.py, isolated.py   the check: load the export with the library's calls in an interpreter that cannot
                          import the suite, and compare its outputs with the suite's network
    card.py               the model card (model-index with every test metric and its protocol)
    output.py, report.py  where the folder is written (atomically, never over anything unasked); what an
                          exporter returns

Belongs here: turning a finished run into files other tools load, and checking that they do. Not here: the
networks' ecosystem classes themselves (:mod:`models.wrappers`, plain PyTorch plus the wrapped library),
reading third-party weights into the suite (:mod:`models.loaders`), evaluation (:mod:`experiments.evaluation`).
"""
