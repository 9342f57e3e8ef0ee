"""README's result tables come from the code that prints them: export a comparison, regenerate, check."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from experiments.__main__ import main as dispatch
from experiments.reliability.errors import SuiteError
from experiments.results import compare, export, readme
from tests.experiments.test_compare import PRE, SIAMESE, seeded, write_sweep

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path]:
    """A repository folder with a 2 x 3-seed comparison exported into docs/results/seeds."""
    root = tmp_path_factory.mktemp("repo")
    sweep_dir = write_sweep(root / "runs" / "lm" / "seeds", seeded("pre", PRE) + seeded("siamese", SIAMESE))
    (sweep_dir / "pre-s1" / "checkpoints").mkdir()
    (sweep_dir / "pre-s1" / "checkpoints" / "last.ckpt").write_bytes(b"x" * 4096)
    compare.main([str(sweep_dir), "--export", str(root / "docs/results/seeds")])
    return root, sweep_dir


def test_export_copies_the_small_files_only(exported):
    root, sweep_dir = exported
    target = root / "docs/results/seeds"
    names = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    exported_names = ["sweep.yaml", "comparison.md", "comparison.csv", "comparison_cells.csv", "curves.png",
                      *[f"{s}-s{i}/summary.json" for s in ("pre", "siamese") for i in (1, 2, 3)]]  # fmt: skip
    assert names == sorted([*exported_names, export.MANIFEST])
    assert json.loads((target / export.MANIFEST).read_text())["files"] == sorted(exported_names)
    assert (target / "comparison.md").read_text() == (sweep_dir / "comparison.md").read_text()
    # The export alone rebuilds the same tables (what README is generated from on a fresh clone).
    assert compare.load_comparison(target).markdown() == (sweep_dir / "comparison.md").read_text()


def test_export_never_overwrites_without_being_asked(exported, capsys, tmp_path):
    root, sweep_dir = exported
    target = root / "docs/results/seeds"
    with pytest.raises(SystemExit) as exc:
        dispatch(["compare", str(sweep_dir), "--export", str(target)])
    assert exc.value.code == 2
    assert "already holds an exported comparison; valid: --overwrite" in capsys.readouterr().err
    # An export that had one run more (the sweep dropped it since): its files are the suite's to remove.
    bigger = tmp_path / "bigger"
    shutil.copytree(sweep_dir, bigger)
    shutil.copytree(sweep_dir / "pre-s1", bigger / "stale-s9")
    record = yaml.safe_load((bigger / "sweep.yaml").read_text())
    record["runs"].append("stale-s9")
    (bigger / "sweep.yaml").write_text(yaml.safe_dump(record, sort_keys=False))
    export.export(bigger, target, overwrite=True)
    assert (target / "stale-s9" / "summary.json").is_file()
    # Files the user put there, even with names an export uses, are not the suite's: never deleted.
    (target / "mine-s9").mkdir()
    (target / "mine-s9" / "summary.json").write_text("{}")
    (target / "notes.txt").write_text("mine")
    (target / "my-plot.png").write_bytes(b"png")
    compare.main([str(sweep_dir), "--export", str(target), "--overwrite"])
    assert not (target / "stale-s9").exists() and (target / "notes.txt").read_text() == "mine"
    assert (target / "mine-s9" / "summary.json").read_text() == "{}" and (target / "my-plot.png").is_file()
    with pytest.raises(SystemExit) as exc:
        dispatch(["compare", str(root / "nowhere")])
    assert exc.value.code == 2 and "is not a directory; valid: a sweep directory" in capsys.readouterr().err


def test_readme_blocks_are_regenerated_and_checked(exported, capsys):
    root, sweep_dir = exported
    kinds = ("table", "pivot", "runs", "figures")
    text = "# Results\n\nSome prose that stays.\n\n" + "".join(
        f"<!-- results:docs/results/seeds:{kind} -->\nstale\n<!-- /results -->\n\ntext after {kind}\n" for kind in kinds
    )
    path = root / "README.md"
    path.write_text(text)
    assert readme.main([str(path), "--check"]) == 1  # stale blocks
    assert "out of date: docs/results/seeds:table (line 5)" in capsys.readouterr().err
    assert readme.main([str(path)]) == 0
    new = path.read_text()
    assert "Some prose that stays." in new and all(f"text after {kind}" in new for kind in kinds)
    printed = (sweep_dir / "comparison.md").read_text()
    table = new.split("<!-- results:docs/results/seeds:table -->\n")[1].split("<!-- /results -->")[0]
    assert table in printed and "| siamese | 1.516 ± 0.052 (n = 3) |" in table  # README == what compare prints
    assert "![curves](docs/results/seeds/curves.png)" in new
    assert readme.main([str(path), "--check"]) == 0
    path.write_text(new.replace("1.516 ± 0.052", "1.510 ± 0.052"))  # edited by hand
    assert readme.main([str(path), "--check"]) == 1
    path.write_text(text.replace(":pivot -->", ":chart -->"))
    with pytest.raises(SuiteError, match=r"results block kind 'chart' \(.*README.md line 10\); valid: table, pivot"):
        readme.main([str(path)])


def test_the_repository_readme_matches_the_exported_comparisons(capsys):
    text = (ROOT / "README.md").read_text()
    if not readme.blocks(text):
        pytest.skip("README.md has no <!-- results:... --> blocks yet")
    assert readme.main([str(ROOT / "README.md"), "--check"]) == 0, capsys.readouterr().err
