"""transformers ``LlamaForCausalLM`` <-> our ``LanguageModel(pre)``; see :mod:`models.loaders`.

A Llama decoder layer is our Pre-Norm block with RMSNorm, RoPE (rotate-half layout, the same inverse
frequencies), SwiGLU and no biases or QK-norm, so the weights map one-to-one once Q, K, V and gate, up
are concatenated into our fused projections. Grouped-query attention maps too: ``num_key_value_heads`` is our
``num_kv_heads`` (k_proj and v_proj of ``num_key_value_heads * head_dim`` rows, query head h reading key/value
head ``h // (num_attention_heads / num_key_value_heads)`` in both, transformers' ``repeat_kv``). Refused:
biases, rope scaling, another activation, tensor-parallel pretraining slices, a different head_dim.
:func:`llama_from_lm` goes the other way: a suite LM of that shape as a ``LlamaForCausalLM``.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor, nn

from models.config import TrunkConfig
from models.lm import LanguageModel
from models.loaders.common import Source, _explain, _load_strict, _refuse, _rename, _split

_LLAMA_SUPPORTED = (
    "transformers LlamaForCausalLM (or its state dict) with num_key_value_heads dividing num_attention_heads, "
    "head_dim == hidden_size / num_attention_heads, hidden_act='silu', no attention or MLP bias, rope_type "
    "'default', pretraining_tp=1; into our LanguageModel under norm_scheme='pre', norm_layer='rmsnorm', "
    "mlp='swiglu', qk_norm=False, bias=False, dense, with Llama's eps, rope_theta, sizes and tying"
)

# Llama's name <-> ours, {i} a block index: read in both directions (lm_from_llama, llama_from_lm).
_LLAMA_NAMES = (
    ("model.embed_tokens.weight", "embed.weight"),
    ("model.layers.{i}.input_layernorm.weight", "trunk.blocks.{i}.attn_res.norm.weight"),
    ("model.layers.{i}.post_attention_layernorm.weight", "trunk.blocks.{i}.mlp_res.norm.weight"),
    ("model.layers.{i}.self_attn.o_proj.weight", "trunk.blocks.{i}.attn.proj.weight"),
    ("model.layers.{i}.mlp.down_proj.weight", "trunk.blocks.{i}.mlp.fc2.weight"),
    ("model.norm.weight", "trunk.readout.norm_f.weight"),
    ("lm_head.weight", "head.weight"),
)


def _rule(source: str, target: str) -> tuple[str, str]:
    """A rename rule (regex, replacement) from one name template to another."""
    return "^" + re.escape(source).replace(r"\{i\}", r"(\d+)") + "$", target.replace("{i}", r"\1")


_LLAMA_RENAMES = tuple(_rule(theirs, ours) for theirs, ours in _LLAMA_NAMES)
_TO_LLAMA = tuple(_rule(ours, theirs) for theirs, ours in _LLAMA_NAMES)

_LLAMA_FEATURES = (
    (r"_proj\.bias$", "projection biases (attention_bias / mlp_bias)"),
    (r"\.rotary_emb\.", "a stored rotary table"),
)


def _config_problems(config, model: LanguageModel | None = None) -> list[str]:
    """What in a ``LlamaConfig`` our network cannot express, and (with ``model``) what differs from it."""
    c, problems = config, []
    if not c.num_key_value_heads or c.num_attention_heads % c.num_key_value_heads:
        problems.append(
            f"num_key_value_heads={c.num_key_value_heads} does not divide num_attention_heads={c.num_attention_heads}"
        )
    if getattr(c, "head_dim", None) not in (None, c.hidden_size // c.num_attention_heads):
        problems.append(f"head_dim={c.head_dim} is not hidden_size / num_attention_heads")
    if c.hidden_act != "silu":
        problems.append(f"hidden_act={c.hidden_act!r}; our SwiGLU uses silu")
    if c.attention_bias or c.mlp_bias:
        problems.append(f"biases (attention_bias={c.attention_bias}, mlp_bias={c.mlp_bias})")
    rope = getattr(c, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        problems.append(f"rope_type={rope.get('rope_type')!r}: rope scaling; ours is plain RoPE")
    if getattr(c, "pretraining_tp", 1) != 1:
        problems.append(f"pretraining_tp={c.pretraining_tp}")
    if model is None:
        return problems
    cfg = model.cfg
    ours = {
        "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "intermediate_size": cfg.hidden,
        "vocab_size": model.vocab_size,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": model.rope_base,
        "tie_word_embeddings": model.head.weight is model.embed.weight,
    }
    theirs = {k: getattr(c, k, None) for k in ours} | {"rope_theta": rope.get("rope_theta", 10000.0)}
    problems += [f"source {k}={theirs[k]!r}, ours {v!r}" for k, v in ours.items() if theirs[k] != v]
    return problems


def _trunk_problems(cfg: TrunkConfig) -> list[str]:
    wanted = {"norm_scheme": "pre", "norm_layer": "rmsnorm", "mlp": "swiglu", "qk_norm": False, "bias": False}
    problems = [f"our {k} is {getattr(cfg, k)!r}; Llama needs {v!r}" for k, v in wanted.items() if getattr(cfg, k) != v]
    if cfg.moe_experts:
        problems.append(f"our trunk is a mixture of experts ({cfg.moe_experts}); Llama's MLP is dense")
    if cfg.mlp_norm_eps not in (None, cfg.norm_eps):
        problems.append(f"our mlp_norm_eps {cfg.mlp_norm_eps:g} differs from norm_eps; Llama has one rms_norm_eps")
    return problems


def load_hf_llama(model: LanguageModel, state_dict_or_module: Source) -> LanguageModel:
    """Loads a transformers ``LlamaForCausalLM`` into our ``LanguageModel(pre)``, in place.

    Args:
        model: our LM: ``norm_scheme="pre"``, rmsnorm, swiglu, no QK-norm or biases, the source's sizes.
        state_dict_or_module: the Llama model (preferred: its config is checked too) or its state dict.

    Returns:
        ``model``, with every tensor replaced.

    Raises:
        ValueError: listing everything that does not map, and what is supported.
    """
    llama, sd = _split(state_dict_or_module)
    problems = _trunk_problems(model.cfg)
    if llama is not None:
        problems += _config_problems(llama.config, model)
    if "lm_head.weight" not in sd and model.head.weight is model.embed.weight:
        sd["lm_head.weight"] = sd.get("model.embed_tokens.weight")  # tied weights may be stored once
    layers = {int(m.group(1)) for k in sd if (m := re.match(r"^model\.layers\.(\d+)\.", k))}
    mapped: dict[str, Tensor] = {}
    for i in sorted(layers):  # separate projections -> our fused [q; k; v] and [gate; up]
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        fused = {
            f"trunk.blocks.{i}.attn.qkv.weight": [f"{attn}.{n}_proj.weight" for n in "qkv"],
            f"trunk.blocks.{i}.mlp.fc1.weight": [f"{mlp}.gate_proj.weight", f"{mlp}.up_proj.weight"],
        }
        for ours, names in fused.items():
            if all(n in sd for n in names):
                mapped[ours] = torch.cat([sd.pop(n) for n in names], dim=0)
    for key in list(sd):
        for pattern, repl in _LLAMA_RENAMES:
            new, hits = re.subn(pattern, repl, key)
            if hits:
                mapped[new] = sd.pop(key)
                break
    problems += _explain(sorted(sd), _LLAMA_FEATURES)
    if model.head.weight is model.embed.weight:  # one parameter, two names: the state dict holds both
        mapped["head.weight"] = mapped.get("embed.weight", mapped.get("head.weight"))
    _load_strict(model, mapped, problems, "the transformers LlamaForCausalLM into LanguageModel", _LLAMA_SUPPORTED)
    return model


def lm_from_llama(llama: nn.Module, **trunk_overrides) -> LanguageModel:
    """A ``LanguageModel(pre)`` with the Llama model's shape, loaded with its weights.

    ``trunk_overrides`` set what Llama's config does not decide (e.g. ``activation_checkpointing``).
    """
    from transformers import LlamaForCausalLM

    what = "the transformers model"
    if not isinstance(llama, LlamaForCausalLM):
        _refuse(what, [f"{type(llama).__name__} is not a LlamaForCausalLM"], _LLAMA_SUPPORTED)
    c = llama.config
    _refuse(what, _config_problems(c), _LLAMA_SUPPORTED)
    trunk = TrunkConfig(
        **{
            "dim": c.hidden_size,
            "depth": c.num_hidden_layers,
            "num_heads": c.num_attention_heads,
            "num_kv_heads": c.num_key_value_heads if c.num_key_value_heads != c.num_attention_heads else None,
            "mlp": "swiglu",
            "mlp_hidden": c.intermediate_size,
            "norm_scheme": "pre",
            "norm_layer": "rmsnorm",
            "norm_eps": c.rms_norm_eps,
            "qk_norm": False,
            "bias": False,
            "attn_drop": c.attention_dropout,
            "init": "normal",
            "init_std": c.initializer_range,
            **trunk_overrides,
        }
    )
    model = LanguageModel(
        trunk,
        vocab_size=c.vocab_size,
        max_seq_len=c.max_position_embeddings,
        tie_embeddings=c.tie_word_embeddings,
        rope_base=(c.rope_parameters or {}).get("rope_theta", 10000.0),
    )
    return load_hf_llama(model, llama)


def llama_config(model: LanguageModel):
    """The ``LlamaConfig`` of our ``LanguageModel(pre)`` (``num_key_value_heads`` = our ``kv_heads``).

    Raises:
        ValueError: listing what in our trunk Llama cannot express.
    """
    from transformers import LlamaConfig

    cfg = model.cfg
    _refuse("our LanguageModel into a transformers LlamaForCausalLM", _trunk_problems(cfg), _LLAMA_SUPPORTED)
    return LlamaConfig(
        vocab_size=model.vocab_size,
        hidden_size=cfg.dim,
        intermediate_size=cfg.hidden,
        num_hidden_layers=cfg.depth,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.dim // cfg.num_heads,
        max_position_embeddings=model.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": model.rope_base},
        tie_word_embeddings=model.head.weight is model.embed.weight,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        attention_dropout=cfg.attn_drop,
        initializer_range=cfg.init_std,
        use_cache=False,
    )


def llama_from_lm(model: LanguageModel, **config_overrides) -> nn.Module:
    """Our ``LanguageModel(pre)`` (rmsnorm, swiglu, no QK-norm or biases) as a transformers ``LlamaForCausalLM``
    with its weights: the fused projections split into q/k/v (``num_key_value_heads`` rows for k and v) and
    gate/up. ``config_overrides`` set what only transformers decides (e.g. ``attn_implementation``).

    Raises:
        ValueError: listing what in our trunk Llama cannot express.
    """
    from transformers import LlamaForCausalLM

    config = llama_config(model)
    for key, value in config_overrides.items():
        setattr(config, key, value)
    cfg = model.cfg
    kv_dim = cfg.kv_heads * (cfg.dim // cfg.num_heads)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    mapped: dict[str, Tensor] = {}
    for i in range(cfg.depth):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        q, k, v = sd.pop(f"trunk.blocks.{i}.attn.qkv.weight").split([cfg.dim, kv_dim, kv_dim])
        gate, up = sd.pop(f"trunk.blocks.{i}.mlp.fc1.weight").chunk(2)
        mapped |= {f"{attn}.q_proj.weight": q, f"{attn}.k_proj.weight": k, f"{attn}.v_proj.weight": v,
                   f"{mlp}.gate_proj.weight": gate, f"{mlp}.up_proj.weight": up}  # fmt: skip
    mapped |= _rename(sd, _TO_LLAMA)
    dtype = model.embed.weight.dtype
    llama = LlamaForCausalLM(config).to(dtype)
    theirs = llama.state_dict()
    if config.tie_word_embeddings and "lm_head.weight" not in theirs:
        mapped.pop("lm_head.weight", None)  # stored once, as the embedding
    problems = [f"our tensors with no Llama counterpart: {', '.join(sorted(sd)[:6])}"] if sd else []
    unfilled = sorted(set(theirs) - set(mapped))
    if unfilled:
        problems.append(f"Llama tensors we do not fill: {', '.join(unfilled[:6])}")
    _refuse("our LanguageModel into a transformers LlamaForCausalLM", problems, _LLAMA_SUPPORTED)
    llama.load_state_dict(mapped, strict=True)
    return llama.eval()
