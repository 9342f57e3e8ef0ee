"""The sweep's TensorBoard layout, read back by TensorBoard's own custom-scalars plugin."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from tensorboard import context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.custom_scalar.custom_scalars_plugin import CustomScalarsPlugin
from torch.utils.tensorboard import SummaryWriter

from experiments.cli import main
from experiments.results import tb_layout
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]

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
    layout = tb_layout.build_layout("val/loss", depth=2, tags={"val/loss", "train/loss", "train/lr/pg1", *DIAG})
    assert list(layout) == ["losses", "stability", "residual RMS", "schedule"]  # the learning rate last
    assert layout["schedule"] == {"learning rate": ["Multiline", [r"^train/lr(/|$)"]]}
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


def test_the_comparison_url_pins_the_validation_curves_unsmoothed_on_time_series():
    url = urlsplit(tb_layout.comparison_url("val/ppl"))
    assert (url.scheme, url.netloc, url.path, url.fragment) == ("http", "localhost:6006", "/", "timeseries")
    query = parse_qs(url.query, strict_parsing=True)
    assert query["smoothing"] == ["0"]
    assert json.loads(query["pinnedCards"][0]) == [
        {"plugin": "scalars", "tag": "val/loss"},
        {"plugin": "scalars", "tag": "val/ppl"},
    ]
    pins = json.loads(parse_qs(urlsplit(tb_layout.comparison_url()).query)["pinnedCards"][0])
    assert pins == [{"plugin": "scalars", "tag": "val/loss"}]  # the metric is the loss: pinned once


def test_a_step_run_opens_time_series_on_its_losses(tmp_path: Path):
    """TIME SERIES sorts groups by tag prefix and expands the first two: for a step-based LM run those are the
    training and validation curves, with no ``epoch`` card and the learning rate inside ``train/``."""
    main(["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), f"--runs_root={tmp_path}", "--experiment=x",
          f"--data.init_args.data_dir={tmp_path / 'data'}", "--trainer.max_steps=4", "--trainer.val_check_interval=2",
          "--trainer.log_every_n_steps=1", "--trainer.limit_val_batches=1", *tiny_lm()])  # fmt: skip
    tags = tb_layout.run_tags(tmp_path / "lm" / "x" / "pre")
    assert "epoch" not in tags
    assert {"train/loss", "train/lr/pg1", "val/loss", "val/ppl"} <= tags
    groups = sorted({tag.split("/", 1)[0] for tag in tags})  # TensorBoard's order for lowercase prefixes
    assert groups == ["train", "val"]
