"""Loading the data-file tasks (gsm8k, text_match): JSONL rows of string fields, split into train and test.

`data` is either one .jsonl file (rows go to test when crc32(key field) % 10 == 0, else to train) or a
folder holding train.jsonl and test.jsonl (training rows whose key also appears in test are dropped).
Malformed input raises a one-line ValueError naming the file and line.
"""

import json
import os
import random
import zlib

TEST_EVERY = 10


def read_jsonl(path, fields, parse=None):
    """Rows of `path` as dicts holding the string `fields`, each passed through `parse` (which raises
    ValueError on a bad row) when given; blank lines are skipped."""
    rows = []
    try:
        handle = open(path, encoding="utf-8")
    except OSError as error:
        raise ValueError(f"{path}: cannot open data file ({error.strerror})") from None
    with handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_no}: expected a JSON object with fields {list(fields)}")
            for field in fields:
                if not isinstance(row.get(field), str):
                    raise ValueError(f"{path}:{line_no}: field '{field}' missing or not a string")
            if parse is not None:
                try:
                    row = parse(row)
                except ValueError as error:
                    raise ValueError(f"{path}:{line_no}: {error}") from None
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def load_splits(data, fields, key, parse=None):
    """{"train": rows, "test": rows} from a .jsonl file or a folder with train.jsonl / test.jsonl."""
    data = os.fspath(data)
    if os.path.isdir(data):
        train = read_jsonl(os.path.join(data, "train.jsonl"), fields, parse)
        test = read_jsonl(os.path.join(data, "test.jsonl"), fields, parse)
        test_keys = {row[key] for row in test}
        return {"train": [row for row in train if row[key] not in test_keys], "test": test}
    rows = read_jsonl(data, fields, parse)
    in_test = [zlib.crc32(row[key].encode("utf-8")) % TEST_EVERY == 0 for row in rows]
    return {"train": [r for r, t in zip(rows, in_test) if not t], "test": [r for r, t in zip(rows, in_test) if t]}


def sample_rows(splits, split, n, seed, salt):
    """Up to `n` rows of `split` in an order shuffled by (salt, split, seed); n=None gives all of them."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rows = splits[split]
    if not rows:
        raise ValueError(f"{salt}: the data has no {split} rows")
    order = list(range(len(rows)))
    random.Random(f"{salt}-{split}-{seed}").shuffle(order)
    return [rows[i] for i in order[: len(rows) if n is None else n]]
