"""Data files of the data tasks (tasks/_data.py): every malformed input is a one-line error naming file and line."""

import json

import pytest

from tasks._data import load_splits

FIELDS = ("prompt", "reference")


def good(i):
    return json.dumps({"prompt": f"p{i}", "reference": f"r{i}"}) + "\n"


def load(path):
    return load_splits(path, FIELDS, key="prompt")


@pytest.mark.parametrize("bad_line, message", [
    (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply"),
    (b'{"prompt": "p", "reference": "\xff\xfe"}', "not UTF-8 (byte 31 of the line)"),
    (b'{"prompt": "caf\xc3"}', "not UTF-8"),                   # a multi-byte character cut short
    (b"{not json", "not valid JSON"),
    (b'{"prompt": "p", "reference": 7}', "field 'reference' missing or not a string"),
    (b"[1, 2]", "expected a JSON object"),
])
def test_bad_lines_are_one_line_errors_with_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(good(0).encode() + b"\n" + bad_line + b"\n" + good(1).encode())
    with pytest.raises(ValueError) as error:
        load(path)
    assert str(error.value).startswith(f"{path}:3: ") and message in str(error.value)
    assert "\n" not in str(error.value)


def test_byte_order_mark_and_blank_lines_are_fine(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(good(i) for i in range(20)).encode() + b"\n\n")
    splits = load(path)
    assert len(splits["train"]) + len(splits["test"]) == 20


def test_folder_with_train_and_test_or_shards(tmp_path):
    split = tmp_path / "split"
    split.mkdir()
    (split / "train.jsonl").write_text("".join(good(i) for i in range(8)))
    (split / "test.jsonl").write_text("".join(good(i) for i in range(6, 10)))
    splits = load(split)
    assert len(splits["train"]) == 6 and len(splits["test"]) == 4  # rows 6 and 7 are test rows only
    shards = tmp_path / "shards"
    (shards / "data").mkdir(parents=True)
    (shards / "data" / "train-00000-of-00002.jsonl").write_text("".join(good(i) for i in range(30)))
    (shards / "data" / "train-00001-of-00002.jsonl").write_text("".join(good(i) for i in range(30, 50)))
    (shards / "data" / "notes.jsonl").write_text("not read\n")  # not a shard name: never opened
    splits = load(shards)
    assert len(splits["train"]) + len(splits["test"]) == 50 and splits["test"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no train and test files"):
        load(tmp_path / "empty")


def test_parquet_rows_and_errors(tmp_path):
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    path = tmp_path / "rows.parquet"
    pandas.DataFrame([{"prompt": f"p{i}", "reference": f"r{i}", "extra": i} for i in range(20)]).to_parquet(path)
    splits = load(path)
    assert len(splits["train"]) + len(splits["test"]) == 20 and set(splits["train"][0]) == set(FIELDS)
    pandas.DataFrame([{"prompt": "p", "reference": "r"}, {"prompt": "q", "reference": None}]).to_parquet(path)
    with pytest.raises(ValueError, match=f"^{path}: row 2: field 'reference' missing or not a string$"):
        load(path)
    pandas.DataFrame([{"prompt": "p"}]).to_parquet(path)
    with pytest.raises(ValueError, match=rf"^{path}: no column\(s\) \['reference'\]"):
        load(path)
    path.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match=f"^{path}: cannot read parquet"):
        load(path)
