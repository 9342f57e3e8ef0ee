"""A grouped-query-attention LM (2 key/value heads of 4) exported for transformers: the export's own check (the
folder loaded with AutoModelForCausalLM in an interpreter without the suite: logits, greedy generate, token ids)
passes, config.json carries the key/value heads (``num_key_value_heads`` through SuiteLMConfig), the card's
shape row names them, and the suite's own loader of exported folders builds the same network again."""

from __future__ import annotations

import json

import torch

from experiments.sharing import hf
from experiments.sharing.card import write_card
from experiments.sharing.checkpoint import read_run_checkpoint
from experiments.sharing.report import ExportOptions
from experiments.tasks import LanguageModeling, OptimConfig
from models.loaders import lm_from_export, load_suite_export
from models.wrappers.hf_config import SuiteLMConfig
from tests.experiments.sharing.conftest import TEXT_DATA, perturb, save_run, trunk

CLASS_PATH = "experiments.tasks.LanguageModeling"


def test_a_gqa_lm_exports_checks_and_loads_back(tmp_path):
    fields = dict(num_heads=4, num_kv_heads=2, mlp="swiglu", norm_layer="rmsnorm", bias=False, qk_norm=True,
                  qk_norm_scope="full")  # fmt: skip
    module = LanguageModeling(trunk("pre", **fields), OptimConfig(), vocab_size=256, seq_len=32, temperature=0.0)
    perturb(module, 3)
    module.eval()
    run = read_run_checkpoint(save_run(tmp_path, "gqa", module, CLASS_PATH, TEXT_DATA))
    folder = tmp_path / "export"
    folder.mkdir()
    report = hf.export(run, folder, tmp_path / "scratch", ExportOptions(check=True))
    assert report.checks and report.checks[0].startswith("logits on 2x32 random ids")  # the isolated reload agreed
    write_card(run, report, folder)

    config = json.loads((folder / "config.json").read_text())
    assert config["trunk"]["num_kv_heads"] == 2 and config["trunk"]["num_heads"] == 4
    loaded = SuiteLMConfig.from_pretrained(folder)
    assert (loaded.num_attention_heads, loaded.num_key_value_heads, loaded.head_dim) == (4, 2, 8)
    assert "| width / depth / heads | 32 / 2 / 4 (2 key/value heads) |" in (folder / "README.md").read_text()

    again = lm_from_export(folder).eval()
    assert again.cfg.num_kv_heads == 2 and again.trunk.blocks[0].attn.k_norm.weight.shape == (16,)
    ids = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(again(ids), module.net(ids), atol=0, rtol=0)
    assert load_suite_export(again, folder) is again  # same trunk: accepted
