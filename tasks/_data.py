"""Loading the data-file tasks (gsm8k, deepmath, text_match): rows of string fields, split into train and test.

`data` is one .jsonl or .parquet file (rows go to test when crc32(key field) % 10 == 0, else to train), or a
folder holding train and test files (train.jsonl / test.jsonl or train.parquet / test.parquet; training rows
whose key also appears in test are dropped), or a folder of a hub snapshot's shards (train-*.parquet / test-*
.jsonl ... anywhere below it; test shards are the test split, and without any, rows are split by hash). No other
file is read. Parquet needs pandas and pyarrow (imported only then).
Malformed input raises a one-line ValueError naming the file and line (JSONL) or row (parquet); so does a path
that is not a regular file (a device such as /dev/zero, a FIFO) and a line longer than MAX_LINE_BYTES.
"""

import json
import os
import random
import re
import stat
import zlib

TEST_EVERY = 10
MAX_LINE_BYTES = 16 << 20  # a JSONL row longer than 16 MiB is not a task row
SHARD = re.compile(r"(train|test)([-_.].*)?\.(jsonl|parquet)")  # a hub snapshot's shard names


def regular_file(path):
    """ValueError unless `path` is a regular file: never read a device (/dev/zero), a FIFO or a socket."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise ValueError(f"{path}: cannot open data file ({error.strerror})") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path}: not a regular file; pass a .jsonl or .parquet file or a folder of them")


def _checked_row(row, fields, parse):
    """`row` after the field checks and `parse`; raises ValueError with the reason (no location)."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object with fields {list(fields)}")
    for field in fields:
        if not isinstance(row.get(field), str):
            raise ValueError(f"field '{field}' missing or not a string")
    return parse(row) if parse is not None else row


def read_jsonl(path, fields, parse=None):
    """Rows of `path` as dicts holding the string `fields`, each passed through `parse` (which raises
    ValueError on a bad row) when given; blank lines are skipped."""
    rows = []
    regular_file(path)
    try:
        handle = open(path, "rb")  # bytes: a bad UTF-8 sequence is reported with its line
    except OSError as error:
        raise ValueError(f"{path}: cannot open data file ({error.strerror})") from None
    with handle:
        for line_no, raw in enumerate(iter(lambda: handle.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(raw) > MAX_LINE_BYTES:
                raise ValueError(f"{path}:{line_no}: longer than {MAX_LINE_BYTES >> 20} MiB; not a task row")
            try:
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{path}:{line_no}: not UTF-8 (byte {error.start + 1} of the line)") from None
            if not line.strip():
                continue
            try:
                row = _checked_row(json.loads(line), fields, parse)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({error.msg})") from None
            except RecursionError:
                raise ValueError(f"{path}:{line_no}: JSON nested too deeply") from None
            except ValueError as error:
                raise ValueError(f"{path}:{line_no}: {error}") from None
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def read_parquet(path, fields, parse=None):
    """Rows of a parquet file, with the checks of read_jsonl; errors name the row (1-based)."""
    regular_file(path)
    try:
        import pandas  # optional: only for parquet files
    except ImportError:
        raise ValueError(f"{path}: reading parquet needs pandas and pyarrow (pip install pandas pyarrow)") from None
    try:
        frame = pandas.read_parquet(path)
    except ImportError:
        raise ValueError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    except Exception as error:  # missing, truncated or not parquet at all: pyarrow raises many types
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{path}: cannot read parquet ({reason})") from None
    missing = [field for field in fields if field not in frame.columns]
    if missing:
        raise ValueError(f"{path}: no column(s) {missing}; columns: {list(frame.columns)}")
    rows = []
    for row_no, values in enumerate(zip(*(frame[field] for field in fields)), 1):
        try:
            rows.append(_checked_row(dict(zip(fields, values)), fields, parse))
        except ValueError as error:
            raise ValueError(f"{path}: row {row_no}: {error}") from None
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def read_rows(path, fields, parse=None):
    """read_parquet for a .parquet file, read_jsonl for anything else."""
    reader = read_parquet if str(path).endswith(".parquet") else read_jsonl
    return reader(path, fields, parse)


def hash_split(rows, key):
    """{"train", "test"} rows: a row is in test when crc32(row[key]) % TEST_EVERY == 0."""
    in_test = [zlib.crc32(row[key].encode("utf-8")) % TEST_EVERY == 0 for row in rows]
    return {"train": [r for r, t in zip(rows, in_test) if not t], "test": [r for r, t in zip(rows, in_test) if t]}


def load_splits(data, fields, key, parse=None):
    """{"train": rows, "test": rows} from a file or a folder (see the module docstring)."""
    data = os.fspath(data)
    if not os.path.isdir(data):
        return hash_split(read_rows(data, fields, parse), key)
    for ext in (".jsonl", ".parquet"):
        train_path, test_path = os.path.join(data, "train" + ext), os.path.join(data, "test" + ext)
        if os.path.exists(train_path) and os.path.exists(test_path):
            train, test = read_rows(train_path, fields, parse), read_rows(test_path, fields, parse)
            test_keys = {row[key] for row in test}
            return {"train": [row for row in train if row[key] not in test_keys], "test": test}
    shards = sorted(os.path.join(folder, name) for folder, _, names in os.walk(data) for name in names
                    if SHARD.fullmatch(name))
    if not shards:
        raise ValueError(f"{data}: no train and test files, and no train-* / test-* .jsonl or .parquet shards, in "
                         "this folder")
    rows = {split: [row for shard in shards if os.path.basename(shard).startswith(split)
                    for row in read_rows(shard, fields, parse)] for split in ("train", "test")}
    if not rows["test"]:
        return hash_split(rows["train"], key)
    test_keys = {row[key] for row in rows["test"]}
    return {"train": [row for row in rows["train"] if row[key] not in test_keys], "test": rows["test"]}


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
