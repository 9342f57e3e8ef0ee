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
from experiments.sharing.card import write_card
from experiments.sharing.checkpoint import read_run_checkpoint
from experiments.sharing.hf_tokenizer import PROBE_TEXT, probe_text
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
        write_card(run, hf.export(run, folder, root / "scratch" / name, options), folder)
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
    text = probe_text(tokenizer)  # the probe with NUL / the end-of-text string inside
    assert PROBE_TEXT in text
    assert reloaded.outputs["text_ids"].tolist() == tokenizer.encode(text)
    assert reloaded.outputs["auto_text_ids"].tolist() == tokenizer.encode(text)
    assert reloaded.result["decoded"] == [tokenizer.decode(ids) for ids in hf.decode_probes(module.net)]
    assert reloaded.result["auto_decoded"] == reloaded.result["decoded"]
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
    wrong_ids = reloaded.outputs["auto_text_ids"].clone()
    wrong_ids[0] = 0  # e.g. a character taken for the end-of-text token
    with pytest.raises(ReloadFailed, match="AutoTokenizer gives other ids"):
        hf.compare(
            module.net, tokenizer, inputs, Reloaded({**reloaded.outputs, "auto_text_ids": wrong_ids}, reloaded.result)
        )
    decoded = [*reloaded.result["decoded"][:-1], "?"]
    with pytest.raises(ReloadFailed, match="PreTrainedTokenizerFast decodes"):
        hf.compare(module.net, tokenizer, inputs, Reloaded(reloaded.outputs, {**reloaded.result, "decoded": decoded}))


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


# Every character whose UTF-8 is one byte or that byte-level BPE uses as a byte's symbol (U+0100 "Ā" ...),
# and a mixed-script text with NUL and the end-of-text string inside.
MIXED = "ASCII, Latin-1 ßÿé, Ā ĀĊ Ġ, 日本語, 🙂👍🏽, NUL\x00here, \x00\x00 and \x01\x7f\r\n"


def test_the_byte_tokenizer_export_gives_the_suites_ids_both_ways(tmp_path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from experiments.sharing.hf_tokenizer import to_transformers

    suite = ByteTokenizer()
    to_transformers(suite, 32).save_pretrained(tmp_path)
    loaded = {
        "in process": to_transformers(suite, 32),
        "PreTrainedTokenizerFast": PreTrainedTokenizerFast.from_pretrained(tmp_path),
        "AutoTokenizer": AutoTokenizer.from_pretrained(tmp_path),  # (no config.json here: nothing to ask)
    }
    texts = [chr(b) for b in range(256)] + list(bytes_to_unicode().values()) + [MIXED]
    for route, exported in loaded.items():
        for text in texts:
            assert exported(text)["input_ids"] == suite.encode(text), (route, text)
        for b in range(256):  # every id alone: a byte of a character cut apart decodes as U+FFFD, as the suite's
            assert exported.decode([b]) == suite.decode([b]), (route, b)
        ids = suite.encode(MIXED)
        for cut in range(0, len(ids), 3):  # windows starting mid-character
            assert exported.decode(ids[cut:]) == suite.decode(ids[cut:]), (route, cut)
        assert exported.eos_token_id == 0 and exported.pad_token_id == 0 and exported.bos_token_id is None


def test_the_cards_tokenizer_route_loads_silently_without_remote_code(lm_exports):
    """The card's ``PreTrainedTokenizerFast.from_pretrained(DIR)`` in a fresh interpreter without a terminal:
    no question about custom code, no warning, the suite's ids on the mixed text."""
    import subprocess

    _, exports = lm_exports
    folder = exports["pre"][2]
    code = (
        "import sys; from transformers import PreTrainedTokenizerFast\n"
        "t = PreTrainedTokenizerFast.from_pretrained(sys.argv[1])\n"
        "print(t(sys.argv[2])['input_ids'])"
    )
    card = (folder / "README.md").read_text()
    assert (
        "tokenizer = PreTrainedTokenizerFast.from_pretrained(" in card and "AutoTokenizer.from_pretrained(" not in card
    )
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(folder.parent / "home")}
    done = subprocess.run(
        [sys.executable, "-I", "-c", code, str(folder), MIXED.replace("\x00", "")[:24]],
        capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "" and "custom code" not in done.stdout
    assert json.loads(done.stdout) == ByteTokenizer().encode(MIXED.replace("\x00", "")[:24])


def test_lm_eval_hf_model_gives_the_suites_rolling_loglikelihoods(lm_exports, tmp_path, monkeypatch):
    """One perplexity convention: lm-eval's ``hf`` model on the export and the suite's adapter on the network
    score each document from the same token (the end-of-text), so the byte perplexities agree."""
    import transformers.dynamic_module_utils as dynamic
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from experiments.evaluation.downstream.harness import SuiteLM

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    module, tokenizer, folder = lm_exports[1]["siamese"]
    docs = ["In the beginning God created the heaven and the earth.", "Ā and ü: 日本 🙂", "x" * 70, "\nAnd"]
    requests = [Instance("loglikelihood_rolling", {}, (doc,), i) for i, doc in enumerate(docs)]
    hf_model = HFLM(pretrained=str(folder), trust_remote_code=True, backend="causal", device="cpu", batch_size=2)
    suite = SuiteLM(module.net, tokenizer, batch_size=2, device="cpu")
    assert hf_model.prefix_token_id == suite.prefix_token_id == 0
    got = torch.tensor(hf_model.loglikelihood_rolling(requests, disable_tqdm=True), dtype=torch.float64)
    want = torch.tensor(suite.loglikelihood_rolling(requests, disable_tqdm=True), dtype=torch.float64)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
