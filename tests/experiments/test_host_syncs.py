"""What a training step reads on the host: gradient clipping reads nothing, the divergence check reads the losses once
every ``every_n_steps`` batches. A tensor on the meta device has no value, so any host read of one raises: the
steps that must not read run on meta tensors (as the MoE's grouped path is checked), the reads that must happen on
real ones, against torch's own clipping and a hand count of the checks."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from experiments.monitoring.divergence import DivergenceDetector
from experiments.parallel.clip import clip_grad_norm, grad_norm


def _params(device: str, scale: float) -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, device=device)) for shape in ((4, 3), (5,), ())]
    for p in params:
        p.grad = torch.randn(p.shape, device=device) * scale
    return params


# "eps": a norm of ~1e-6 against max_norm 1e-6, where torch's eps (1e-6 in norm + eps) sets a third of the factor:
# a sign or a placement of eps that differs from torch's changes the clipped gradients by far more than rtol
@pytest.mark.parametrize(("scale", "max_norm"), [(0.01, 1.0), (10.0, 1.0), (3e-7, 1e-6)],
                         ids=["below", "clipped", "eps"])  # fmt: skip
def test_clipping_equals_torch_and_reads_nothing_on_the_host(scale: float, max_norm: float):
    ours, theirs = _params("cpu", scale), _params("cpu", scale)
    norm = clip_grad_norm(ours, max_norm=max_norm)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm=max_norm)
    assert (scale < 1 and max_norm == 1.0) or float(expected) > max_norm  # the clipped cases really clip
    torch.testing.assert_close(norm, expected)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)
    if max_norm == 1.0 and scale < 1:  # below max_norm: multiplied by exactly 1
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours, _params("cpu", scale), strict=True))
    meta = _params("meta", scale)  # float() / .cpu() of a meta tensor raises: the old clipping read the norm
    assert clip_grad_norm(meta, max_norm=1.0).device.type == "meta"
    assert grad_norm(meta).device.type == "meta"


def _run(detector: DivergenceDetector, losses: list) -> list[tuple[int, bool]]:
    """Feeds one training batch per loss (one process); returns (global_step, should_stop) after each."""
    trainer = SimpleNamespace(global_step=0, should_stop=False, world_size=1, strategy=None)
    module = SimpleNamespace(log=lambda *args, **kwargs: None)
    seen = []
    for loss in losses:
        trainer.global_step += 1
        detector.on_train_batch_end(trainer, module, {"loss": loss}, None, 0)
        seen.append((trainer.global_step, trainer.should_stop))
        if trainer.should_stop:
            break
    return seen


def test_the_divergence_check_reads_the_losses_every_n_steps_and_stops_at_the_check():
    # Between checks the losses wait on the device: meta tensors (which no host read takes) pass untouched
    assert _run(DivergenceDetector(every_n_steps=3), [torch.ones((), device="meta")] * 2) == [(1, False), (2, False)]
    with pytest.raises(Exception, match="meta"):  # every step, as before: the first batch reads its loss
        _run(DivergenceDetector(), [torch.ones((), device="meta")])
    losses = [torch.tensor(v) for v in (1.0, 1.1, math.nan, 1.0, 1.0, 1.0)]
    every = DivergenceDetector(every_n_steps=1)
    assert _run(every, losses)[-1] == (3, True) and every.diverged_at == 3
    third = DivergenceDetector(every_n_steps=4)  # checks after batches 4, 8: the NaN of batch 3 stops batch 4
    assert _run(third, losses) == [(1, False), (2, False), (3, False), (4, True)] and third.diverged_at == 3
    # max_loss and the history behave as checked each step: the spike count and median see every batch in order
    big = DivergenceDetector(every_n_steps=2, max_loss=5.0, min_steps=1, spike_factor=1.05)
    assert _run(big, [torch.tensor(v) for v in (1.0, 1.2, 1.0, 6.0)])[-1] == (4, True)
    assert big.diverged_at == 4 and big.spikes == 1 and list(big.history) == [1.0, pytest.approx(1.2), 1.0]


def test_what_the_last_checks_did_not_see_is_checked_at_the_end_of_training():
    detector = DivergenceDetector(every_n_steps=10)
    assert _run(detector, [torch.tensor(1.0), torch.tensor(math.inf)])[-1] == (2, False)
    detector.on_train_end(SimpleNamespace(world_size=1, strategy=None), None)
    assert detector.diverged_at == 2
