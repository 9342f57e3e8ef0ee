"""The shared input checks: every refusal is one InputError line naming the value, its origin and what is valid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fileio.checks import InputError, NotJSONError, new_file, number, output_dir, read_json, utf8_text


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [("2e9", int, 2_000_000_000), ("1_000", int, 1000), (" 7 ", int, 7), (1000.0, int, 1000), ("1e-3", float, 0.001),
     (3, float, 3.0), ("-0.5", float, -0.5)],
)  # fmt: skip
def test_number_reads_every_spelling_of_a_finite_number(value, kind, expected):
    got = number(value, "x", kind=kind)
    assert got == expected and type(got) is kind


@pytest.mark.parametrize(
    ("value", "needle"),
    [("1e400", "'1e400' is not a finite number"), ("inf", "'inf' is not a finite number"),
     ("nan", "'nan' is not a finite number"), (float("-inf"), "-inf is not a finite number"),
     ("9" * 400, "is not a finite number"), ("abc", "'abc' is not a number"), (True, "True is not a number"),
     (None, "None is not a number"), ([1], "[1] is not a number")],
)  # fmt: skip
def test_number_refuses_what_is_not_finite(value, needle):
    with pytest.raises(InputError) as err:
        number(value, "budget.tokens", where="command line --budget")
    message = str(err.value)
    assert message.startswith("budget.tokens=") and needle in message and "(command line --budget)" in message
    assert "\n" not in message


def test_number_ranges_and_whole_numbers():
    assert number("0", "a", kind=int, low=0) == 0
    with pytest.raises(InputError, match=r"^a='0' must be > 0 \(f\.yaml\)$"):
        number("0", "a", low=0, low_open=True, where="f.yaml")
    with pytest.raises(InputError, match=r"^a=1\.0 must be > 0 and < 1$"):
        number(1.0, "a", low=0, high=1, low_open=True, high_open=True)
    with pytest.raises(InputError, match=r"^a='1\.5' is not a whole number; valid: integers$"):
        number("1.5", "a", kind=int)
    with pytest.raises(InputError, match=r"^a=-5 must be >= 1$"):
        number(-5, "a", kind=int, low=1)


def test_a_whole_bound_is_written_in_full():
    """A seed's upper bound reads 4294967295, not 4.29497e+09 (which is not the bound a user can type)."""
    with pytest.raises(InputError, match=r"^--seed='5e9' must be >= 0 and <= 4294967295 \(command line\)$"):
        number("5e9", "--seed", kind=int, low=0, high=2**32 - 1, where="command line")
    with pytest.raises(InputError, match=r"must be > 0.5 and < 1e\+30"):
        number(2e30, "x", low=0.5, high=1e30, low_open=True, high_open=True)


def test_new_file_and_output_dir(tmp_path: Path):
    existing = tmp_path / "stats.npz"
    existing.write_bytes(b"x")
    assert new_file(tmp_path / "sub" / "new.npz", "--out") == tmp_path / "sub" / "new.npz"
    assert new_file(existing, "--out", overwrite=True) == existing
    with pytest.raises(InputError, match=r"^--out .*stats\.npz exists; valid: another path, or --overwrite"):
        new_file(existing, "--out")
    with pytest.raises(InputError, match=r"^--out .*stats\.npz/deeper/x\.npz lies under .*stats\.npz, which is a file"):
        new_file(existing / "deeper" / "x.npz", "--out")
    with pytest.raises(InputError, match="is a directory; valid: a file path"):
        new_file(tmp_path, "--out")
    assert output_dir(tmp_path / "a" / "b", "--export") == tmp_path / "a" / "b"
    with pytest.raises(InputError, match=r"^--export .*stats\.npz is a file, not a directory"):
        output_dir(existing, "--export")
    with pytest.raises(InputError, match=r"lies under .*stats\.npz, which is a file"):
        output_dir(existing / "x", "--export")
    assert existing.read_bytes() == b"x"  # checks never write


@pytest.mark.parametrize(
    ("text", "error", "needle"),
    [("[1, 2]", InputError, "holds an array, not an object"), ('"s"', InputError, "holds a string, not an object"),
     ("{broken", NotJSONError, "is not valid JSON (Expecting property name"), ("[" * 100_000 + "]" * 100_000,
     InputError, "is nested too deeply to read"), ("1" * 5000, InputError, "is not valid JSON"),
     (b"\xff\xfe{}", NotJSONError, "is not UTF-8 text (byte 0)")],
    ids=["array", "string", "broken", "deep", "huge-int", "bytes"],
)  # fmt: skip
def test_read_json_refuses_in_one_line(tmp_path: Path, text, error, needle):
    path = tmp_path / "summary.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(error) as err:
        read_json(path, "run summary", dict)
    assert str(err.value).startswith(f"run summary {path} ") and needle in str(err.value), err.value
    assert "\n" not in str(err.value)


def test_read_json_size_limit_and_a_good_file(tmp_path: Path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"a": "x" * 3000}))
    with pytest.raises(InputError, match=r"is 3,009 bytes; valid: a JSON file of at most 2,048 bytes"):
        read_json(path, "config", dict, max_bytes=2048)
    assert read_json(path, "config", dict)["a"] == "x" * 3000
    with pytest.raises(InputError, match="does not exist"):
        read_json(tmp_path / "none.json", "config")


def test_utf8_text_names_the_undecodable_byte():
    assert utf8_text("café", "prompt") == "café"
    with pytest.raises(InputError) as err:
        utf8_text("caf\udce9 au lait", "data.init_args.prompts[0]")  # b"caf\xe9" decoded with surrogateescape
    assert str(err.value) == (
        "data.init_args.prompts[0] holds a byte that is not UTF-8 at character 3 ('caf\\\\udce9 au lait'); "
        "valid: UTF-8 text"
    )
