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


# ---------------------------------------------------------------------------------------------------------
# verl-format rows and the official held-out rule (SoftmaxGRPO prepare_data.py's grouped_split).
import hashlib  # noqa: E402

from tasks._data import ranked_holdout, rendered_prompt, verl_ground_truth  # noqa: E402


def truth_hook(truth, messages):
    if not isinstance(truth, dict) or "answer" not in truth:
        raise ValueError("ground truth has no 'answer'")
    return {"answer": truth["answer"]}


def verl_row(i, truth=None):
    return {"data_source": "x", "prompt": [{"role": "user", "content": f"q{i}"}],
            "reward_model": {"style": "rule", "ground_truth": json.dumps(truth or {"answer": str(i)})}}


def test_verl_rows_keep_their_messages_and_decode_a_json_ground_truth(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(verl_row(i)) + "\n" for i in range(20)))
    splits = load_splits(path, FIELDS, key="prompt", verl=truth_hook)
    rows = splits["train"] + splits["test"]
    assert sorted(r["answer"] for r in rows) == sorted(str(i) for i in range(20))
    assert all(r["messages"] == [{"role": "user", "content": f"q{r['answer']}"}] for r in rows)
    assert verl_ground_truth({"ground_truth": "42"}) == "42"  # a plain answer string stays a string
    assert verl_ground_truth({"ground_truth": {"numbers": [1]}}) == {"numbers": [1]}


@pytest.mark.parametrize("row, message", [
    ({"prompt": "just text", "reward_model": {"ground_truth": "{}"}}, "field 'prompt' is not a non-empty list"),
    ({"prompt": [{"role": "user"}], "reward_model": {"ground_truth": "{}"}}, "message 1 is not a {role, content}"),
    ({"prompt": [{"role": "user", "content": "q"}], "reward_model": {}}, "field 'reward_model' has no 'ground_truth'"),
    ({"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "{oops"}}, "not valid JSON"),
    ({"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "{}"}}, "has no 'answer'"),
])
def test_malformed_verl_rows_are_one_line_errors(tmp_path, row, message):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(verl_row(0)) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError) as error:
        load_splits(path, FIELDS, key="prompt", verl=truth_hook)
    assert str(error.value).startswith(f"{path}:2: ") and message in str(error.value)
    assert "\n" not in str(error.value)
    if not isinstance(row["prompt"], list):
        return  # a parquet column cannot mix lists and strings
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    parquet = tmp_path / "rows.parquet"
    pandas.DataFrame([verl_row(0), row]).to_parquet(parquet)
    with pytest.raises(ValueError, match=f"^{parquet}: row 2: "):
        load_splits(parquet, FIELDS, key="prompt", verl=truth_hook)


def test_ranked_holdout_is_the_official_count_and_order():
    rows = [{"q": f"question {i}"} for i in range(2_345)] + [{"q": "question 7"}]  # one repeated prompt
    splits = ranked_holdout(rows, "q", 500)
    distinct = {r["q"] for r in rows}
    assert len({r["q"] for r in splits["test"]}) == min(500, len(distinct) // 10) == 234
    assert not {r["q"] for r in splits["train"]} & {r["q"] for r in splits["test"]}  # a prompt is on one side
    ids = sorted((hashlib.sha256(q.encode()).hexdigest() for q in distinct),
                 key=lambda uid: hashlib.sha256(f"42:{uid}".encode()).digest())[:234]
    assert {hashlib.sha256(r["q"].encode()).hexdigest() for r in splits["test"]} == set(ids)
    assert len(ranked_holdout(rows[:30], "q", 500)["test"]) == 3
    assert len(ranked_holdout(rows[:5], "q", 500)["test"]) == 1  # max(1, ...)


def test_verl_holdout_hashes_the_messages_as_prepare_data_does(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [verl_row(i) for i in range(40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    splits = load_splits(path, FIELDS, key="prompt", verl=truth_hook, holdout=500)
    uids = {hashlib.sha256(json.dumps(r["prompt"], sort_keys=True).encode()).hexdigest(): r for r in rows}
    first = sorted(uids, key=lambda uid: hashlib.sha256(f"42:{uid}".encode()).digest())[:4]
    assert sorted(r["messages"][0]["content"] for r in splits["test"]) == \
        sorted(uids[uid]["prompt"][0]["content"] for uid in first)


def test_folder_with_train_and_validation_files(tmp_path):
    (tmp_path / "train.jsonl").write_text("".join(good(i) for i in range(8)))
    (tmp_path / "validation.jsonl").write_text("".join(good(i) for i in range(7, 10)))
    splits = load(tmp_path)
    assert len(splits["train"]) == 7 and len(splits["test"]) == 3


def test_rendered_prompt_is_recognised():
    assert rendered_prompt([{"role": "user", "content": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"}])
    assert rendered_prompt([{"role": "user", "content": "A chat.\nUser: hi\nAssistant: <think>"}])
    assert rendered_prompt([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]) is None
