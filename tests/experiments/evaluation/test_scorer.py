"""The downstream evaluator against references that share no code with it: a plain one-choice-at-a-time
scorer written here, a model rigged to know the answers, and the analytic bpb of a uniform model."""

from __future__ import annotations

import math

import pytest
import torch

from experiments.evaluation.downstream.config import DownstreamConfig
from experiments.evaluation.downstream.results import DownstreamResults, TaskResult, task_scores
from experiments.evaluation.downstream.scorer import DownstreamEvaluator, continuation_logits
from tests.experiments.evaluation.conftest import WINDOW, GoldLookup, Uniform, tiny_net

# One task OLMo scores by raw accuracy, one by length-normalized accuracy; 24 questions each.
TASKS = ["copa", "openbook_qa"]
LIMIT = 24


def reference_scores(net, tokenizer, selection, window: int) -> tuple[list[int], list[float]]:
    """Per question: 1 if the best choice is the gold one, else 0 (the sum of log-probs of the choice's tokens
    given the left-truncated context, divided by its length in characters for len_norm); and the gold
    answer's bits per byte. One unpadded forward per (question, choice)."""
    task = selection.dataset
    correct, gold_bpb = [], []
    for doc_id in selection.doc_ids:
        doc = task.dataset[doc_id]  # one prompt per question: doc_id is the dataset index
        context = tokenizer.encode(task.doc_to_text(doc))
        scores, bpbs = [], []
        for choice in task.doc_to_continuations(doc):
            answer = tokenizer.encode(choice)
            tokens = (context + answer)[-(window + 1) :]  # keep the answer, cut the context from the left
            with torch.no_grad():
                logprobs = net(torch.tensor([tokens[:-1]]))[0].double().log_softmax(-1)  # (N, V)
            logprob = logprobs[-len(answer) :].gather(1, torch.tensor(answer)[:, None]).sum().item()
            scores.append(logprob / len(choice) if selection.metric_type == "len_norm" else logprob)
            bpbs.append(-logprob / len(choice.encode()) / math.log(2))
        label = task.doc_to_label(doc)
        correct.append(int(max(range(len(scores)), key=scores.__getitem__) == label))
        gold_bpb.append(bpbs[label])
    return correct, gold_bpb


@pytest.fixture(scope="module", params=["byte", "bpe"])
def setup(request, byte_tokenizer, bpe_tokenizer):
    tokenizer = byte_tokenizer if request.param == "byte" else bpe_tokenizer
    evaluator = DownstreamEvaluator(DownstreamConfig(TASKS, limit=LIMIT, batch_size=7), tokenizer, WINDOW)
    return tokenizer, evaluator


def test_accuracy_equals_scoring_every_choice_one_by_one(setup):
    tokenizer, evaluator = setup
    net = tiny_net(tokenizer.vocab_size)
    results = {t.name: t for t in evaluator.evaluate(net).tasks}
    assert {t.name: t.metric_type for t in evaluator.tasks} == {"copa": "acc", "openbook_qa": "len_norm"}
    for selection in evaluator.tasks:
        assert len(selection.doc_ids) == LIMIT
        correct, gold_bpb = reference_scores(net, tokenizer, selection, WINDOW)
        result = results[selection.name]
        assert result.primary == pytest.approx(sum(correct) / len(correct), abs=1e-6), selection.name
        assert result.scores["bpb"] == pytest.approx(sum(gold_bpb) / len(gold_bpb), rel=1e-4), selection.name
    assert sum(s.truncated_rows for s in evaluator.tasks) > 0  # the window rule was exercised


def test_scores_do_not_depend_on_the_batching(setup):
    tokenizer, evaluator = setup
    net = tiny_net(tokenizer.vocab_size)
    one = DownstreamEvaluator(DownstreamConfig(TASKS, limit=LIMIT, batch_size=1), tokenizer, WINDOW).evaluate(net)
    many = evaluator.evaluate(net)
    for a, b in zip(one.tasks, many.tasks, strict=True):
        assert a.scores[a.metric] == b.scores[b.metric]
        assert a.scores == pytest.approx(b.scores, rel=1e-5)


def test_a_model_that_knows_the_answers_scores_100_percent(setup):
    tokenizer, evaluator = setup
    gold = [
        (row["query"], row["ctx_len"], row["continuation"])
        for selection in evaluator.tasks
        for row in selection.rows
        if row["cont_id"] == row["label_id"]
    ]
    results = evaluator.evaluate(GoldLookup(gold, tokenizer.vocab_size))
    assert [t.primary for t in results.tasks] == [1.0, 1.0]
    assert results.averages()["avg"] == 1.0
    assert all(t.scores["bpb"] < 1e-6 for t in results.tasks)


def test_uniform_model_bpb_and_ce_loss_are_the_analytic_values(setup):
    tokenizer, evaluator = setup
    vocab = tokenizer.vocab_size
    results = {t.name: t for t in evaluator.evaluate(Uniform(vocab)).tasks}
    for selection in evaluator.tasks:
        task = selection.dataset
        docs = [task.dataset[doc_id] for doc_id in selection.doc_ids]
        gold = [task.doc_to_continuations(doc)[task.doc_to_label(doc)] for doc in docs]
        # n tokens at ln V nats each, over the answer's bytes (bpb) or characters (ce_loss)
        bpb = [len(tokenizer.encode(s)) * math.log2(vocab) / len(s.encode()) for s in gold]
        ce = [len(tokenizer.encode(s)) * math.log(vocab) / len(s) for s in gold]
        scores = results[selection.name].scores
        assert scores["bpb"] == pytest.approx(sum(bpb) / len(bpb), rel=1e-5)
        assert scores["ce_loss"] == pytest.approx(sum(ce) / len(ce), rel=1e-5)
        if tokenizer.kind == "byte":
            assert scores["bpb"] == pytest.approx(8.0, rel=1e-6)  # one byte per token, 8 bits each


def test_limit_takes_a_seeded_sample_and_the_protocol_says_so(byte_tokenizer):
    a = DownstreamEvaluator(DownstreamConfig(["copa"], limit=10, seed=1), byte_tokenizer, WINDOW)
    b = DownstreamEvaluator(DownstreamConfig(["copa"], limit=10, seed=1), byte_tokenizer, WINDOW)
    c = DownstreamEvaluator(DownstreamConfig(["copa"], limit=10, seed=2), byte_tokenizer, WINDOW)
    assert a.tasks[0].doc_ids == b.tasks[0].doc_ids != c.tasks[0].doc_ids
    protocol = a.protocol()
    assert protocol["tasks"]["copa"] == {
        "metric": "acc", "docs": 10, "rows": 20, "docs_available": 100, "docs_unscorable": 0,
        "rows_context_truncated": a.tasks[0].truncated_rows,
    }  # fmt: skip
    assert protocol["window"] == WINDOW and protocol["tokenizer"] == {"kind": "byte", "vocab_size": 256}


def test_questions_whose_answer_does_not_fit_the_window_are_dropped(byte_tokenizer):
    evaluator = DownstreamEvaluator(DownstreamConfig(["copa"]), byte_tokenizer, window=20)
    selection = evaluator.tasks[0]
    assert selection.docs_unscorable > 0
    assert len(selection.doc_ids) == selection.docs_available - selection.docs_unscorable
    assert all(len(row["continuation"]) <= 20 for row in selection.rows)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tasks": ["piqa", "nope_qa"]}, "unknown downstream task 'nope_qa'"),
        ({"tasks": []}, "downstream.tasks is empty"),
        ({"tasks": ["copa", "copa"]}, "names a task twice"),
        ({"limit": 0}, "downstream.limit=0"),
        ({"batch_size": 0}, "downstream.batch_size=0"),
    ],
)
def test_bad_config_is_a_one_line_error(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        DownstreamConfig(**kwargs)
    assert "\n" not in str(err.value)


def test_ranks_score_disjoint_shares_that_cover_every_row(byte_tokenizer):
    evaluator = DownstreamEvaluator(DownstreamConfig(["openbook_qa"], limit=9, batch_size=4), byte_tokenizer, WINDOW)
    shares = []
    for rank in (0, 1):
        batches = list(evaluator.batches(evaluator.tasks[0], rank, world_size=2))
        shares.append([pair for b in batches for pair in zip(b["doc_id"].tolist(), b["cont_id"].tolist(), strict=True)])
    everything = {(r["doc_id"], r["cont_id"]) for r in evaluator.tasks[0].rows}
    assert set(shares[0]).isdisjoint(shares[1]) and set(shares[0]) | set(shares[1]) == everything
    assert abs(len(shares[0]) - len(shares[1])) <= 1


def test_the_shipped_overlay_lists_the_default_tasks():
    import yaml

    from experiments.evaluation.downstream.config import DEFAULT_TASKS
    from tests.experiments.evaluation.test_offline import ROOT

    overlay = yaml.safe_load((ROOT / "configs/lm/downstream.yaml").read_text())["model"]["init_args"]["downstream"]
    assert overlay["tasks"] == list(DEFAULT_TASKS) and overlay["limit"] == 500
    DownstreamConfig(**overlay)  # validates


def test_forwards_run_in_the_runs_precision_context(byte_tokenizer):
    """bf16-mixed: Lightning's own precision plugin context is what the evaluator enters around each forward."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    net = tiny_net(256)
    seen = []
    net.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    evaluator = DownstreamEvaluator(DownstreamConfig(["copa"], limit=8), byte_tokenizer, WINDOW)
    full = evaluator.evaluate(net).tasks[0]
    half = evaluator.evaluate(net, forward_context=MixedPrecision("bf16-mixed", "cpu").forward_context).tasks[0]
    assert seen[0] == torch.float32 and seen[-1] == torch.bfloat16
    assert half.scores["bpb"] == pytest.approx(full.scores["bpb"], rel=2e-2)  # same model, bf16 rounding only


def test_a_stop_request_ends_scoring_between_batches(byte_tokenizer):
    """SIGTERM / Ctrl-C (the trainer's flag) is read before every batch: scoring stops within one batch."""
    net = tiny_net(256)
    forwards = []
    net.register_forward_hook(lambda module, args, out: forwards.append(1))
    evaluator = DownstreamEvaluator(DownstreamConfig(["copa"], limit=8, batch_size=2), byte_tokenizer, WINDOW)
    with pytest.raises(InterruptedError, match="stopped in copa after 2 rows"):
        evaluator.evaluate(net, should_stop=lambda: len(forwards) >= 1)
    assert len(forwards) == 1


def test_continuation_logits_are_the_answer_positions_in_float64():
    """Row i's answer is predicted by positions ctx_len - 1 ... ctx_len + cont_len - 2 (written out here)."""
    logits = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)  # (B, N, V): every entry distinct
    batch = {"ctx_len": torch.tensor([3, 2]), "cont_len": torch.tensor([1, 3]), "doc_id": torch.tensor([7, 8])}
    rebased, gathered = continuation_logits(batch, logits)
    # row 0: positions 2 (then 3, 3: past its one answer token, clamped to the window, never read);
    # row 1: positions 1, 2, 3
    expected = torch.stack([logits[0, [2, 3, 3]], logits[1, [1, 2, 3]]]).double()
    assert gathered.dtype == torch.float64 and torch.equal(gathered, expected)
    assert rebased["ctx_len"].tolist() == [1, 1]  # so the metric reads gathered[i, 0 : cont_len]
    assert rebased["cont_len"] is batch["cont_len"] and rebased["doc_id"] is batch["doc_id"]


def test_averages_and_metric_names_from_hand_written_scores():
    tasks = [
        TaskResult("copa", "acc", {"acc": 0.5, "ce_loss": 1.1, "bpb": 1.2}, 10, 20, 2.0),
        TaskResult("openbook_qa", "len_norm", {"len_norm": 0.25, "bpb": 0.8}, 10, 40, 2.0),
        TaskResult("wikitext", "bpb", {"bpb": 2.5}, 5, 5, 1.0),  # no accuracy: not in avg, in avg_bpb
    ]
    results = DownstreamResults(tasks)
    assert results.averages() == pytest.approx({"avg": (0.5 + 0.25) / 2, "avg_bpb": (1.2 + 0.8 + 2.5) / 3})
    assert results.metrics("test/downstream") == pytest.approx({
        "test/downstream/copa/acc": 0.5, "test/downstream/copa/ce_loss": 1.1, "test/downstream/copa/bpb": 1.2,
        "test/downstream/openbook_qa/len_norm": 0.25, "test/downstream/openbook_qa/bpb": 0.8,
        "test/downstream/wikitext/bpb": 2.5, "test/downstream/avg": 0.375, "test/downstream/avg_bpb": 1.5,
    })  # fmt: skip
    assert results.rows == 65 and results.seconds == 5.0
    lines = results.to_markdown().splitlines()
    assert lines[:2] == ["| task | metric | score (%) | ce_loss | bpb | questions | rows | rows/s |", "|" + "---|" * 8]
    assert lines[2] == "| copa | acc | 50.00 | 1.1000 | 1.2000 | 10 | 20 | 10 |"
    assert lines[4] == "| wikitext | bpb | 2.5000 | - | 2.5000 | 5 | 5 | 5 |"
    assert lines[5] == "| average (3 tasks) | | **37.50** | | **1.5000** | 25 | 65 | 13 |"
    assert DownstreamResults([]).averages() == {}
    # What is missing shows as "-": no accuracy task, no bpb, no time measured; half a second is a rate.
    untimed = DownstreamResults([TaskResult("wikitext", "bpb", {"bpb": 2.5}, 5, 5, 0.0)]).to_markdown()
    assert untimed.splitlines()[2:] == [
        "| wikitext | bpb | 2.5000 | - | 2.5000 | 5 | 5 | - |", "| average (1 tasks) | | - | | **2.5000** | 5 | 5 | - |"
    ]  # fmt: skip
    quick = DownstreamResults([TaskResult("copa", "acc", {"acc": 0.5}, 5, 10, 0.5)]).to_markdown()
    assert quick.splitlines()[2:] == [
        "| copa | acc | 50.00 | - | - | 5 | 10 | 20 |", "| average (1 tasks) | | **50.00** | | - | 5 | 10 | 20 |"
    ]  # fmt: skip


def test_task_scores_report_the_v2_values():
    computed = {"acc_v1": 0.1, "acc_v2": 0.2, "ce_loss_v1": 3.0, "ce_loss_v2": 4.0, "bpb_v2": 5.0}
    assert task_scores("acc", computed) == {"acc": 0.2, "ce_loss": 4.0, "bpb": 5.0}
    assert task_scores("bpb", {"bpb_v1": 1.0, "bpb_v2": 2.0}) == {"bpb": 2.0}  # the primary, once
