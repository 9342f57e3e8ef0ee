"""LM -> transformers: every scheme's export loads with AutoModelForCausalLM / AutoTokenizer in an interpreter that
cannot import the suite and computes the suite's logits, greedy continuations and token ids; lm-eval's ``hf``
model scores a local task as the suite's ``suite-lm`` adapter does; and the folder starts a suite run again."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from datamodules.text.tokenizers import BPETokenizer, ByteTokenizer
from experiments.sharing import hf
from experiments.sharing.checkpoint import read_run_checkpoint
from experiments.sharing.hf_tokenizer import PROBE_TEXT
from experiments.sharing.isolated import Reloaded, ReloadFailed, reload_exports
from experiments.sharing.report import ExportOptions
from experiments.tasks import LanguageModeling, OptimConfig
from models.loaders import lm_from_export
from tests.experiments.sharing.conftest import SCHEMES, TEXT_DATA, lm_module, save_run, trunk

REPO = Path(__file__).resolve().parents[3]
CLASS_PATH = "experiments.tasks.LanguageModeling"


@pytest.fixture(scope="module")
def lm_exports(tmp_path_factory) -> tuple[Path, dict]:
    """Each scheme's LM run exported without the built-in check (this file checks them); the MoE one with BPE."""
    import pydoc_data.topics

    root = tmp_path_factory.mktemp("lm")
    bpe = BPETokenizer.train("".join(pydoc_data.topics.topics.values())[:50_000], vocab_size=300)
    bpe.save(root / "bpe")
    exports = {}
    for seed, name in enumerate(SCHEMES):
        tokenizer = bpe if name == "moe" else ByteTokenizer()
        module = lm_module(name, seed, vocab_size=tokenizer.vocab_size)
        run = read_run_checkpoint(save_run(root, name, module, CLASS_PATH, TEXT_DATA))
        options = ExportOptions(tokenizer=root / "bpe" if name == "moe" else None, check=False)
        folder = root / "exports" / name
        folder.mkdir(parents=True)
        hf.export(run, folder, root / "scratch" / name, options)
        exports[name] = (module, tokenizer, folder)
    return root, exports


@pytest.fixture(scope="module")
def lm_reloaded(lm_exports) -> dict[str, tuple[dict, Reloaded]]:
    """All exports loaded in ONE fresh interpreter without the suite (the export's own check inputs)."""
    root, exports = lm_exports
    inputs = {name: hf.check_inputs(module.net, tokenizer) for name, (module, tokenizer, _) in exports.items()}
    items = [(folder, *inputs[name]) for name, (_, _, folder) in exports.items()]
    reloaded = reload_exports("hf", items, root / "reload")
    return {name: (inputs[name][0], r) for name, r in zip(exports, reloaded, strict=True)}


def test_the_folder_is_self_contained_and_loads_with_the_auto_classes(lm_exports, lm_reloaded):
    _, exports = lm_exports
    for name, (_, reloaded) in lm_reloaded.items():
        assert reloaded.result["suite_importable"] is False, name  # `import models` fails there
        # No entry reaches the suite's source: the repository's own paths (an in-repo .venv's packages aside)
        venv = Path(sys.prefix).resolve()
        inside = [p for p in reloaded.result["sys_path"] if p and Path(p).resolve().is_relative_to(REPO)]
        assert not [p for p in inside if not Path(p).resolve().is_relative_to(venv)], name
        assert reloaded.result["model_class"] == "SuiteLMForCausalLM"
        folder = exports[name][2]
        config = json.loads((folder / "config.json").read_text())
        assert config["auto_map"] == {
            "AutoConfig": "configuration_suite_lm.SuiteLMConfig",
            "AutoModelForCausalLM": "modeling_suite_lm.SuiteLMForCausalLM",
        }
        assert config["trunk"]["norm_scheme"] == exports[name][0].trunk_cfg.norm_scheme
        generation = json.loads((folder / "generation_config.json").read_text())
        assert generation["do_sample"] is False and generation["use_cache"] is False  # predict's temperature 0
        assert "max_new_tokens" not in generation  # the caller's (lm-eval's max_length must not be overridden)
        code = (folder / "modeling_suite_lm.py").read_text()
        assert "from models" not in code and "import models" not in code
        assert sorted(p.suffix for p in folder.glob("model*")) == [".py", ".safetensors"]  # no pickle weights


@pytest.mark.parametrize("name", SCHEMES)
def test_logits_greedy_generate_and_token_ids_equal_the_suites(name, lm_exports, lm_reloaded):
    module, tokenizer, _ = lm_exports[1][name]
    inputs, reloaded = lm_reloaded[name]
    with torch.no_grad():
        want = module.net(inputs["ids"])  # (B, N, V) float32
    torch.testing.assert_close(reloaded.outputs["logits"], want, atol=1e-5, rtol=0)
    hp = module.hparams  # predict's settings (temperature 0: greedy)
    predicted = module.net.generate(inputs["prompt"], hf.CHECK_TOKENS, hp.temperature, hp.top_k)
    assert reloaded.outputs["generated"].tolist() == predicted.tolist()
    assert reloaded.outputs["text_ids"].tolist() == tokenizer.encode(PROBE_TEXT)
    assert len(hf.compare(module.net, tokenizer, inputs, reloaded)) == 3  # the export command's own check passes


def test_the_check_fails_on_a_difference(lm_exports, lm_reloaded):
    module, tokenizer, _ = lm_exports[1]["siamese"]
    inputs, reloaded = lm_reloaded["siamese"]
    shifted = Reloaded({**reloaded.outputs, "logits": reloaded.outputs["logits"] + 2e-5}, reloaded.result)
    with pytest.raises(ReloadFailed, match="logits differ"):
        hf.compare(module.net, tokenizer, inputs, shifted)
    other = reloaded.outputs["generated"].clone()
    other[0, -1] = (other[0, -1] + 1) % 256
    with pytest.raises(ReloadFailed, match="greedy generate"):
        hf.compare(module.net, tokenizer, inputs, Reloaded({**reloaded.outputs, "generated": other}, reloaded.result))


def test_lm_eval_hf_model_scores_a_local_task_as_suite_lm(lm_exports, tmp_path, monkeypatch):
    import transformers.dynamic_module_utils as dynamic
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from experiments.evaluation.downstream.harness import SuiteLM

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "modules"))  # remote code is copied there
    module, tokenizer, folder = lm_exports[1]["siamese"]
    docs = [
        {"question": f"Question: what is {a} plus {b}?\nAnswer:", "choices": [str(a + b), str(a * b + 3)], "answer": 0}
        for a in range(3) for b in range(4)
    ]  # fmt: skip
    (tmp_path / "sums.json").write_text("\n".join(json.dumps(d) for d in docs))
    (tmp_path / "sums.yaml").write_text(
        "task: suite_export_sums\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tmp_path / 'sums.json'}\n"
        'test_split: test\noutput_type: multiple_choice\ndoc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    scores = {}
    models = {
        "hf": HFLM(pretrained=str(folder), trust_remote_code=True, backend="causal", device="cpu", batch_size=4),
        "suite-lm": SuiteLM(module.net, tokenizer, batch_size=4, device="cpu"),
    }
    for label, lm in models.items():
        out = simple_evaluate(
            model=lm,
            tasks=["suite_export_sums"],
            task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
            log_samples=True,
        )
        samples = sorted(out["samples"]["suite_export_sums"], key=lambda s: s["doc_id"])
        scores[label] = torch.tensor([[r[0][0] for r in s["resps"]] for s in samples], dtype=torch.float64)
    assert scores["hf"].shape == (len(docs), 2)
    torch.testing.assert_close(scores["hf"], scores["suite-lm"], atol=1e-4, rtol=0)
    assert scores["hf"].std() > 0.1  # real, differing log-likelihoods, not a constant


def test_an_export_starts_a_suite_run_again(lm_exports):
    module, _, folder = lm_exports[1]["hyper"]
    ids = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(lm_from_export(folder).eval()(ids), module.net(ids), atol=0, rtol=0)
    fields = {"mlp": "swiglu", "norm_layer": "rmsnorm", "bias": False, "qk_norm": False, "drop_path": 0.1}
    fine_tune = LanguageModeling(trunk("hyper", **fields), OptimConfig(), seq_len=64, init_from=str(folder))
    fine_tune.setup("fit")  # fit's setup loads the folder (a different window and drop-path are fine)
    for key, tensor in module.net.state_dict().items():
        assert torch.equal(fine_tune.net.state_dict()[key], tensor), key
    wrong = LanguageModeling(trunk("hyper", **{**fields, "depth": 3}), OptimConfig(), init_from=str(folder))
    with pytest.raises(ValueError, match=r"does not fit this model: depth: 2 in the export, 3 here") as err:
        wrong.setup("fit")
    assert "\n" not in str(err.value)
