"""Initial values that depend on the seed and the parameter's name only, so a shard can be drawn without the rest.

A network's *init plan* maps each parameter whose initial value is random (or which is built on the meta device:
:func:`meta_parameters`) to an :class:`Init`: its full shape and a function that fills a float32 CPU tensor of
that shape, in place, from a ``torch.Generator``. Each parameter draws from its own generator, seeded from the
network's seed and the parameter's name (:func:`param_seed`)::

    value(name) = fill(torch.empty(shape, float32, cpu), Generator().manual_seed(param_seed(seed, name)))

so the value does not depend on which other tensors were drawn before, in what order, or on which process: a
rank that holds one slice of a parameter draws the full tensor, keeps its slice and frees the rest (OLMo-core's
approach; DTensor's own random ops on a CPU mesh would give every rank the same numbers). The one-process
network and every sharded one are equal bit for bit by construction (:func:`initialize` here,
``experiments.parallel.meta_init`` for the shards). Parameters outside the plan (norm scales, a scheme's
constant mixing weights) and every buffer keep what their constructor gives them: constants, the same whatever
the seed (tests/models/test_init_values.py checks this for every scheme).

A network draws its seed from the global random generator once (:func:`draw_seed`) and leaves the generator as
that one draw left it (:func:`rng_unchanged`): what its constructors draw on the way is discarded, so the stream
the training randomness continues from is the same whether the network was built in full or on the meta device.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import Tensor, nn

from models.layers.moe import GroupedExperts

Fill = Callable[[Tensor, torch.Generator], object]  # fills a float32 CPU tensor of the full shape in place

# The modules whose parameters an init plan covers entirely, which :func:`meta_parameters` builds on the meta
# device: every large tensor of the suite's networks is one of these
META_BUILT: tuple[type[nn.Module], ...] = (nn.Linear, nn.Embedding, nn.modules.conv._ConvNd, GroupedExperts)


class Init(NamedTuple):
    """How one parameter starts: its full (unsharded, unpacked) shape and the in-place fill of that shape."""

    shape: tuple[int, ...]
    fill: Fill


Plan = dict[str, Init]


def trunc_normal_(
    t: Tensor, std: float, a: float, b: float, generator: torch.Generator | None = None, mean: float = 0.0
) -> Tensor:
    """A normal ``(mean, std)`` truncated to ``[a, b]``, in place and in one pass: inverse-CDF sampling (a uniform
    between the bounds' CDFs through ``erfinv``), as ``nn.init.trunc_normal_`` did before torch 2.10.

    torch's own now rejects and redraws, with a mask and two full-size temporaries per round: three times the
    tensor's memory and about four full draws, which on a 2.4 GB expert weight is the difference between the
    largest parameter fitting beside a rank's shards or not. The uniform is kept a float32 step inside (-1, 1), so
    ``erfinv`` never returns an infinity (bounds far out in the tails then truncate at about 5.3 std).
    """
    lo, hi = (math.erf((x - mean) / (std * math.sqrt(2.0))) for x in (a, b))  # 2 CDF - 1 at the bounds
    step = 2.0**-23
    t.uniform_(max(lo, -1.0 + step), min(hi, 1.0 - step), generator=generator)
    t.erfinv_().mul_(std * math.sqrt(2.0)).add_(mean)
    return t.clamp_(min=a, max=b)


def param_seed(seed: int, name: str) -> int:
    """The generator seed of parameter ``name`` under the network seed ``seed``: 63 bits of ``sha256("seed/name")``
    (stable across processes and Python versions, unlike ``hash``)."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def initial_value(init: Init, seed: int, name: str) -> Tensor:
    """The full float32 CPU value of parameter ``name``: ``init.fill`` on a fresh tensor, from its own generator."""
    value = torch.empty(init.shape, dtype=torch.float32, device="cpu")
    init.fill(value, torch.Generator(device="cpu").manual_seed(param_seed(seed, name)))
    return value


def draw_seed() -> int:
    """A network seed: one draw from the global CPU generator (so ``seed_everything`` decides it)."""
    return int(torch.randint(0, 1 << 62, (), device="cpu", dtype=torch.int64))


@contextmanager
def rng_unchanged() -> Iterator[None]:
    """Puts the global CPU generator back as it was on entry (what constructors draw inside is discarded)."""
    state = torch.random.get_rng_state()
    try:
        yield
    finally:
        torch.random.set_rng_state(state)


def prefixed(prefix: str, plan: Plan) -> Plan:
    """A submodule's plan under its name in the parent (``prefix`` without the dot)."""
    return {f"{prefix}.{name}": init for name, init in plan.items()}


@torch.no_grad()
def initialize(module: nn.Module, plan: Plan, seed: int) -> None:
    """Gives every parameter of ``plan`` its value (cast to the parameter's dtype and device); a parameter on the
    meta device is left for later (``experiments.parallel.meta_init`` gives each rank its slice).

    Raises:
        ValueError: a plan entry that names no parameter of ``module``, or whose shape is not the parameter's.
    """
    params = dict(module.named_parameters())
    for name, init in plan.items():
        param = params.get(name)
        if param is None or tuple(param.shape) != tuple(init.shape):
            found = "no such parameter" if param is None else f"the parameter is {tuple(param.shape)}"
            raise ValueError(f"init plan entry {name} of shape {tuple(init.shape)}: {found}")
        if not param.is_meta:
            param.copy_(initial_value(init, seed, name))


@contextmanager
def meta_parameters(classes: tuple[type[nn.Module], ...] = META_BUILT) -> Iterator[None]:
    """Inside, the parameters registered by modules of ``classes`` are put on the meta device as they are
    registered (their constructors' own init then runs on meta tensors, for free); every other parameter and
    every buffer is built as usual, with its constructor's value. Each large tensor exists at most once, briefly,
    as the uninitialized ``torch.empty`` its constructor allocates (pages never touched are never resident)."""
    register = nn.Module.register_parameter

    def on_meta(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and isinstance(self, classes) and not param.is_meta:
            param = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        register(self, name, param)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register
