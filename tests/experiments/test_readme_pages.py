"""``python -m experiments readme`` over every page: README.md and docs/*.md, each block's path relative to the
repository root, its figure links relative to the page; ``--check`` covers them all."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.results import compare, readme
from tests.experiments.test_compare import PRE, SIAMESE, seeded, write_sweep

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def repository(tmp_path: Path, monkeypatch) -> Path:
    """A repository with an exported comparison, README.md and two docs pages (one holding blocks)."""
    sweep_dir = write_sweep(tmp_path / "runs" / "lm" / "seeds", seeded("pre", PRE) + seeded("siamese", SIAMESE))
    compare.main([str(sweep_dir), "--export", str(tmp_path / "docs/results/seeds")])
    (tmp_path / "README.md").write_text("# x\n\n<!-- results:docs/results/seeds:table -->\nstale\n<!-- /results -->\n")
    (tmp_path / "docs" / "results.md").write_text(
        "# Results\n\n<!-- results:docs/results/seeds:pivot -->\nstale\n<!-- /results -->\n\nprose\n\n"
        "<!-- results:docs/results/seeds:figures -->\n<!-- /results -->\n"
    )
    (tmp_path / "docs" / "other.md").write_text("# No blocks here\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_one_command_regenerates_and_checks_every_page(repository: Path, capsys):
    assert readme.main(["--check"]) == 1
    captured = capsys.readouterr()
    assert "README.md: out of date: docs/results/seeds:table (line 3)" in captured.err
    assert "docs/results.md: out of date: docs/results/seeds:pivot (line 3)" in captured.err
    assert "other.md" not in captured.out  # a page without blocks is not reported
    assert readme.main([]) == 0
    page = (repository / "docs" / "results.md").read_text()
    # the marker names the export from the repository root; the figure link is relative to the page
    assert "<!-- results:docs/results/seeds:pivot -->\n| scheme |" in page and "prose" in page
    assert "![curves](results/seeds/curves.png)" in page and (repository / "docs/results/seeds/curves.png").is_file()
    assert "Evidence of each Δ" in page  # the pivot's notes carry each comparison's evidence
    assert "![curves](docs/results/seeds/curves.png)" not in page
    assert readme.main(["--check"]) == 0
    assert "docs/results.md: 2 results block(s), 0 out of date" in capsys.readouterr().out
    (repository / "docs" / "results.md").write_text(page.replace("(n = 3)", "(n = 4)", 1))  # edited by hand
    assert readme.main(["--check"]) == 1 and "docs/results.md: out of date" in capsys.readouterr().err
    assert readme.main(["README.md", "--check"]) == 0  # one page named: only that page


def test_figures_on_a_page_at_the_root_link_from_the_root(repository: Path):
    (repository / "README.md").write_text("<!-- results:docs/results/seeds:figures -->\n<!-- /results -->\n")
    assert readme.main(["README.md"]) == 0
    assert "![curves](docs/results/seeds/curves.png)" in (repository / "README.md").read_text()


def test_the_repository_pages_match_their_exports_and_every_page_with_a_block_is_covered(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    pages = [p for p in readme.default_pages() if readme.blocks(p.read_text())]
    assert Path("README.md") in pages and Path("docs/results.md") in pages
    assert readme.main(["--check"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert all(f"{page}: " in out for page in pages)
