"""One colour per norm scheme, the same in every plot of the suite (curves, maps, lr plots, depth profiles).

Colours are fixed per name rather than assigned in plotting order, so Pre-Norm is the same blue in the
demo, the stability sweep and the ablation, and two schemes never share a colour within one plot.
The named variants of a scheme (``configs/norm/<scheme>-<variant>.yaml``) have their own colours: the
ablation plots a scheme next to its variants. Names not listed here (a new scheme or variant) take the
first colour of ``EXTRA`` that no listed name of the plot uses, in a stable order.
"""

from __future__ import annotations

from collections.abc import Iterable

# Colour-blind-safe anchors (Okabe-Ito, then Tableau): baseline blue, the paper's scheme green, failures warm.
SCHEME_COLOURS: dict[str, str] = {
    "pre": "#0072b2",  # blue
    "post": "#d55e00",  # vermillion
    "siamese": "#009e73",  # bluish green
    "deepnorm": "#cc79a7",  # reddish purple
    "hybrid": "#e69f00",  # orange
    "siamese_hybrid": "#000000",  # black
    "peri": "#56b4e9",  # sky blue
    "mixln": "#c5b0d5",  # lilac
    "resi_dual": "#7f7f7f",  # grey
    "hyper": "#bcbd22",  # olive
    "resi_dual_hybrid": "#9467bd",  # purple
    "hybrid-depth-scaling": "#8c510a",  # dark brown: next to hybrid's orange in the ablation
    "siamese_hybrid-no-input-norm": "#17becf",  # cyan
    "siamese_hybrid-no-depth-scaling": "#e377c2",  # pink
    "mhc": "#637939",  # dark olive: the Hyper-Connections family
    "lns": "#b15928",  # rust
    "reordered": "#6a3d9a",  # deep violet
    "dyt": "#8dd3c7",  # pale teal
    "dyt-llama": "#bebada",  # pale lavender
    "dyt-dit": "#fb8072",  # salmon
    "pre-dyt-llama": "#08306b",  # navy: pre's blue, darker
    "siamese-dyt-llama": "#00441b",  # dark green: siamese's green, darker
    "dyt-llama-a8": "#80b1d3",  # pale steel: dyt-llama's family
    "pre-dyt-llama-a8": "#4292c6",  # medium blue: the Pre-Norm family, DyT tuned
    "siamese-dyt-llama-a8": "#41ab5d",  # medium green: siamese's family, DyT tuned
    "dyt-llama-a16": "#9e9ac8",  # lilac: dyt-llama's family
    "pre-dyt-llama-a16": "#6a51a3",  # violet: DyT, every seed
    "pre-dyt": "#4f9fd6",  # light blue: pre's blue, lighter (the ViT sweep's DyT cells)
    "siamese-dyt": "#7fc97f",  # light green: siamese's green, lighter
    "keel": "#a6761d",  # mustard
    "derf": "#e7298a",  # magenta
    "derf-gpt2": "#ce1256",  # crimson: derf's magenta, darker
    "pre-derf-gpt2": "#2166ac",  # steel blue: the Pre-Norm family
    "derf-gpt2-a4": "#f768a1",  # pink: derf's family
    "pre-derf-gpt2-a4": "#084594",  # deep blue: the Pre-Norm family, Derf tuned
    "derf-gpt2-a8": "#fa9fb5",  # light pink: derf's family
    "pre-derf-gpt2-a8": "#ae017e",  # plum: Derf, every seed
    "mhc-v2": "#addd8e",  # pale olive: mhc's olive, lighter
    "pre-no-qk-norm": "#9ecae1",  # pale blue: Pre-Norm twins
    "pre-port-trunk": "#08519c",  # dark blue: Pre-Norm twins
    "siamese-port-trunk": "#006d2c",  # dark green: siamese's family, its twin
    "pre-plain-init": "#3182bd",  # mid blue
    "pre-qk-full": "#6baed6",  # light steel blue
    "attn_res": "#d95f02",  # burnt orange
    "block_attn_res": "#fdae6b",  # pale orange: attn_res's, lighter
}
EXTRA = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173")


def scheme_colours(names: Iterable[str]) -> dict[str, str]:
    """``{name: colour}`` for the schemes of one plot: fixed colours, unknown names from ``EXTRA``."""
    names = list(dict.fromkeys(names))
    out = {n: SCHEME_COLOURS[n] for n in names if n in SCHEME_COLOURS}
    spare = [c for c in EXTRA if c not in out.values()]
    for i, name in enumerate(n for n in names if n not in out):
        out[name] = spare[i % len(spare)]
    return out


def scheme_colour(name: str) -> str:
    """The colour of one scheme (an unknown one takes the first spare colour)."""
    return scheme_colours([name])[name]
