"""The lm-evaluation-harness adapter: the same log-likelihoods as the native evaluator, and the harness's own
``simple_evaluate`` on a local task (a YAML over JSON files written here) gives the accuracy scored by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lm_eval import simple_evaluate
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model
from lm_eval.tasks import TaskManager

from experiments.evaluation.downstream.config import DownstreamConfig
from experiments.evaluation.downstream.harness import MODEL_NAME, SuiteLM
from experiments.evaluation.downstream.scorer import DownstreamEvaluator
from tests.experiments.evaluation.conftest import WINDOW, tiny_net


def _requests(pairs: list[tuple[str, str]]) -> list[Instance]:
    return [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_loglikelihoods_equal_the_native_evaluators(kind, byte_tokenizer, bpe_tokenizer):
    tokenizer = byte_tokenizer if kind == "byte" else bpe_tokenizer
    net = tiny_net(tokenizer.vocab_size)
    evaluator = DownstreamEvaluator(DownstreamConfig(["copa", "arc_easy"], limit=12, batch_size=5), tokenizer, WINDOW)
    evaluator.evaluate(net)
    harness = SuiteLM(net, tokenizer, batch_size=3, device="cpu")
    compared = 0
    for selection in evaluator.tasks:  # both scored by "acc": the metric keeps the plain sum of log-probs
        native = {(d, c): ll for d, c, ll in evaluator.metrics[selection.name].loglikelihoods}
        task = selection.dataset
        keys, pairs = [], []
        for doc_id in selection.doc_ids:
            doc = task.dataset[doc_id]
            for cont_id, choice in enumerate(task.doc_to_continuations(doc)):
                context = task.doc_to_text(doc)
                # the harness encodes context + choice at once and splits; OLMo encodes each: same ids needed
                if harness._encode_pair(context, choice) == (tokenizer.encode(context), tokenizer.encode(choice)):
                    keys.append((doc_id, cont_id))
                    pairs.append((context, choice))
        assert len(pairs) >= 0.9 * len(selection.rows)
        scores = harness.loglikelihood(_requests(pairs), disable_tqdm=True)
        got = torch.tensor([s for s, _ in scores], dtype=torch.float64)
        want = torch.tensor([native[k] for k in keys], dtype=torch.float64)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        compared += len(pairs)
    assert compared >= 60


def test_is_greedy_and_rolling_loglikelihood_against_a_plain_forward(byte_tokenizer):
    net = tiny_net(256)
    harness = SuiteLM(net, byte_tokenizer, batch_size=4, device="cpu")
    text = "In the beginning"
    ids = byte_tokenizer.encode(text)
    with torch.no_grad():
        logprobs = net(torch.tensor([[harness.prefix_token_id, *ids[:-1]]]))[0].log_softmax(-1)  # (N, V)
    want = logprobs.gather(1, torch.tensor(ids)[:, None]).sum().item()
    (rolling,) = harness.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)], disable_tqdm=True)
    assert rolling == pytest.approx(want, abs=1e-5)
    greedy = [int(logprobs[0].argmax())]  # the most likely first token after the prefix
    ((score, is_greedy),) = harness.loglikelihood(_requests([("", byte_tokenizer.decode(greedy))]), disable_tqdm=True)
    assert is_greedy and score == pytest.approx(logprobs[0, greedy[0]].item(), abs=1e-5)


def test_generate_until_is_greedy_decoding_cut_at_the_stop_string(byte_tokenizer):
    net = tiny_net(256)
    harness = SuiteLM(net, byte_tokenizer, batch_size=4, device="cpu")
    prompt = "And God said"
    reference = net.generate(torch.tensor([byte_tokenizer.encode(prompt)]), 12, temperature=0)[0, -12:].tolist()
    text = byte_tokenizer.decode(reference)
    (full,) = harness.generate_until([Instance("generate_until", {}, (prompt, {"max_gen_toks": 12}), 0)])
    assert full == text
    stop = text[3:5]
    request = Instance("generate_until", {}, (prompt, {"until": [stop], "max_gen_toks": 12}), 0)
    (cut,) = harness.generate_until([request])
    assert cut == text.split(stop)[0]


def test_simple_evaluate_on_a_local_task_gives_the_accuracy_scored_by_hand(tmp_path: Path, byte_tokenizer):
    docs = [
        {"question": f"Question: what is {a} plus {b}?\nAnswer:", "choices": [str(a + b), str(a * b + 3), str(a + 7)],
         "answer": (a + b) % 3}
        for a in range(4) for b in range(5)
    ]  # fmt: skip
    (tmp_path / "sums.json").write_text("\n".join(json.dumps(d) for d in docs))
    (tmp_path / "sums.yaml").write_text(
        "task: suite_local_sums\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tmp_path / 'sums.json'}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    net = tiny_net(256)
    correct = []
    for doc in docs:  # the harness's request: context, then " " + choice (its default target delimiter)
        context = byte_tokenizer.encode(doc["question"])
        scores = []
        for choice in doc["choices"]:
            answer = byte_tokenizer.encode(" " + choice)
            with torch.no_grad():
                logprobs = net(torch.tensor([(context + answer)[:-1]]))[0].log_softmax(-1)
            scores.append(logprobs[-len(answer) :].gather(1, torch.tensor(answer)[:, None]).sum().item())
        correct.append(max(range(3), key=scores.__getitem__) == doc["answer"])
    out = simple_evaluate(
        model=SuiteLM(net, byte_tokenizer, batch_size=8, device="cpu"),
        tasks=["suite_local_sums"],
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        log_samples=False,
    )
    assert out["results"]["suite_local_sums"]["acc,none"] == pytest.approx(sum(correct) / len(docs))
    assert 0 < sum(correct) < len(docs)  # a score between the extremes: the comparison can tell them apart


def test_the_model_is_registered_under_its_name():
    assert get_model(MODEL_NAME) is SuiteLM
    with pytest.raises(ValueError, match="needs --model_args ckpt=PATH"):
        SuiteLM.create_from_arg_string("", {"batch_size": 4})
    with pytest.raises(ValueError, match="batch_size='auto' is not supported"):
        SuiteLM(tiny_net(256), None, batch_size="auto")  # type: ignore[arg-type]
