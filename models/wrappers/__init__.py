"""The suite's networks in the ecosystem's classes, the other direction of :mod:`models.loaders`.

    hf_config.py       SuiteLMConfig: a transformers ``PreTrainedConfig`` holding the trunk and LM sizes
    hf_lm.py           SuiteLMForCausalLM: ``PreTrainedModel`` + ``GenerationMixin`` around ``LanguageModel``
    timm_vit.py        SuiteViT and one timm ``register_model`` entrypoint per norm scheme (``suite_vit_<scheme>``)
    diffusers_dit.py   SuiteDiTTransformer: a diffusers ``ModelMixin`` / ``ConfigMixin`` around ``DiT``

Each wraps the suite's own module without changing its computation or its parameter names (the
wrapped module sits under one attribute), so a suite state dict loads into a wrapper by adding that
prefix. They need only torch and the library they wrap; the export (``python -m experiments export``)
copies them, with the model code they use, into the folder it writes.

Nothing is imported here: each wrapper pulls in only its own library.
"""
