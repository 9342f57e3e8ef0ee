"""The sweep's TensorBoard layout, read back by TensorBoard's own custom-scalars plugin."""

from __future__ import annotations

import json
from pathlib import Path

from tensorboard import context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.custom_scalar.custom_scalars_plugin import CustomScalarsPlugin
from torch.utils.tensorboard import SummaryWriter

from experiments.results import tb_layout

DIAG = ["diag/grad_norm/global", "diag/grad_norm/block_0", "diag/rms/pre/block_0", "diag/rms/post/block_0"]


def fake_run(run_dir: Path, tags: list[str]) -> None:
    """A run's own event file, written the way Lightning's TensorBoardLogger writes scalars."""
    writer = SummaryWriter(log_dir=str(run_dir))
    for step in (1, 2):
        for tag in tags:
            writer.add_scalar(tag, 1.0 / step, step)
    writer.close()


def tensorboard_view(logdir: Path) -> tuple[list[str], dict]:
    """The runs TensorBoard lists and the layout its custom-scalars plugin serves, as the UI gets them."""
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    plugin = CustomScalarsPlugin(base_plugin.TBContext(logdir=str(logdir), multiplexer=multiplexer,
                                                       data_provider=provider))  # fmt: skip
    served = plugin.layout_impl(context.RequestContext(), "")  # the JSON the /layout route sends
    return sorted(multiplexer.Runs()), json.loads(served) if isinstance(served, str) else served


def test_losses_come_first_and_only_logged_charts_appear():
    layout = tb_layout.build_layout("val/ppl", depth=2, tags={"val/loss", "val/ppl", "train/loss", "epoch"})
    assert list(layout) == ["losses"]  # no empty "stability" group without Diagnostics
    assert list(layout["losses"]) == ["val/loss", "val/ppl", "train/loss"]
    layout = tb_layout.build_layout("val/loss", depth=2, tags={"val/loss", "train/loss", *DIAG})
    assert list(layout) == ["losses", "stability", "residual RMS"]
    assert list(layout["stability"]) == ["grad norm, global (pre-clip)", "grad norm per block (pre-clip)"]
    assert list(layout["residual RMS"]) == ["block 0"]  # block 1 logged nothing


def test_the_layout_applies_to_every_run_without_an_empty_run(tmp_path: Path):
    for name in ("pre", "siamese"):
        fake_run(tmp_path / name, ["val/loss", "train/loss", *DIAG])
    fake_run(tmp_path / "post", ["val/loss", "train/loss"])
    (tmp_path / "events.out.tfevents.1.old.sweep").write_bytes(b"")  # where an earlier version put it
    for _ in range(2):  # rebuilt: replaced, not added
        tb_layout.write_layout(tmp_path, ["pre", "siamese", "post"])
    assert not list(tmp_path.glob("events.out.tfevents.*"))
    for name in ("pre", "siamese", "post"):
        assert len(list((tmp_path / name).glob(f"events.out.tfevents.*{tb_layout.LAYOUT_SUFFIX}"))) == 1
    runs, layout = tensorboard_view(tmp_path)
    assert runs == ["post", "pre", "siamese"]  # no run "."
    titles = [c["title"] for c in layout["category"]]
    assert titles == ["losses", "stability", "residual RMS"]  # the comparison first, then what exists
    charts = [chart["title"] for chart in layout["category"][0]["chart"]]
    assert charts == ["val/loss", "train/loss"]  # merged over the three runs: each chart once


def test_a_sweep_without_runs_writes_no_layout(tmp_path: Path):
    assert tb_layout.write_layout(tmp_path, ["never-started"]) is None
    assert not list(tmp_path.rglob("events.out.tfevents.*"))
