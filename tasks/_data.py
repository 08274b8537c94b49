"""Loading the data-file tasks (gsm8k, deepmath, text_match; countdown and knights_knaves given
data=): rows split into train and test (docs/tasks.md says which files and how they are split).

`data` is one .jsonl or .parquet file (parquet needs pandas and pyarrow, imported only then), a
folder holding train and test (or validation, as SoftmaxGRPO's prepare_data.py writes it) files,
training rows whose key is also a test row's dropped, or a folder of a hub snapshot's shards
(train-* / test-*). No other file is read. A single file's held-out rows, by the task's `holdout`:
None, crc32(key) % 10 == 0 (hash_split); k, prepare_data.py's grouped_split (ranked_holdout).
Two row formats: the task's own fields, checked by `parse`, and, when the task gives a `verl` hook,
verl's (`prompt` chat messages and `reward_model.ground_truth`, verl_example), whose messages are
the chat prompt verbatim. Malformed input raises a one-line ValueError naming the file and line
(JSONL) or row (parquet); so does a path that is not a regular file and a line over MAX_LINE_BYTES.
"""

import hashlib
import json
import os
import random
import re
import stat
import sys
import zlib

TEST_EVERY = 10
MAX_LINE_BYTES = 16 << 20  # a JSONL row longer than 16 MiB is not a task row
SHARD = re.compile(r"(train|test)([-_.].*)?\.(jsonl|parquet)")  # a hub snapshot's shard names
TEST_NAMES = ("test", "validation")  # the held-out file of a train/test folder (prepare_data.py: validation)
HOLDOUT_SEED = 42  # prepare_data.py's --seed default
VERL_COLUMNS = ("prompt", "reward_model")
RENDERED_MARKS = ("<|im_start|>", "<|im_end|>", "\nAssistant:")  # a message that is itself a rendered prompt


def regular_file(path):
    """ValueError unless `path` is a regular file: never read a device (/dev/zero), a FIFO or a socket."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise ValueError(f"{path}: cannot open data file ({error.strerror})") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path}: not a regular file; pass a .jsonl or .parquet file or a folder of them")


def plain(value):
    """`value` with numpy arrays and scalars (as pandas reads parquet) turned into Python lists and numbers."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return plain(value.tolist())
    return value


def verl_messages(value):
    """The chat messages of a verl row's `prompt`: a non-empty list of {role, content} strings (other keys are
    dropped), in the file's order and wording."""
    if not isinstance(value, list) or not value:
        raise ValueError("field 'prompt' is not a non-empty list of chat messages")
    for i, message in enumerate(value, 1):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise ValueError(f"field 'prompt': message {i} is not a {{role, content}} pair of strings")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def verl_ground_truth(value):
    """`reward_model['ground_truth']` of a verl row; a string holding a JSON object is decoded (SoftmaxGRPO's
    files), any other string is returned as it is (verl's and AR-Lopti's math files: the answer)."""
    if not isinstance(value, dict) or "ground_truth" not in value:
        raise ValueError("field 'reward_model' has no 'ground_truth'")
    truth = value["ground_truth"]
    if isinstance(truth, str) and truth.lstrip().startswith("{"):
        try:
            decoded = json.loads(truth)
        except (json.JSONDecodeError, RecursionError):
            raise ValueError("reward_model.ground_truth is not valid JSON") from None
        if isinstance(decoded, dict):
            return decoded
    return truth


def rendered_prompt(messages):
    """The text of the only message when it is already a rendered prompt (holds a chat-template token or an
    "Assistant:" turn), else None."""
    if len(messages) == 1 and any(mark in messages[0]["content"] for mark in RENDERED_MARKS):
        return messages[0]["content"]
    return None


def verl_example(row, verl):
    """The example of a verl-format row: verl(ground truth, messages) plus `messages` (and `rendered_prompt`)."""
    messages = verl_messages(plain(row["prompt"]))
    example = dict(verl(verl_ground_truth(plain(row["reward_model"])), messages))
    example["messages"] = messages
    rendered = rendered_prompt(messages)
    if rendered is not None:
        example["rendered_prompt"] = rendered
    return example


def _checked_row(row, fields, parse, columns=(), verl=None):
    """`row` after the field checks and `parse` (or, for a verl-format row when `verl` is given, verl_example);
    raises ValueError with the reason (no location)."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object with fields {list(fields) + list(columns)}")
    if verl is not None and all(column in row for column in VERL_COLUMNS):
        return verl_example(row, verl)
    for field in fields:
        if not isinstance(row.get(field), str):
            raise ValueError(f"field '{field}' missing or not a string")
    for column in columns:
        if row.get(column) is None:
            raise ValueError(f"field '{column}' missing")
    return parse(row) if parse is not None else row


def read_jsonl(path, fields, parse=None, columns=(), verl=None):
    """Rows of `path` as dicts holding the string `fields` and the `columns`, each passed through `parse` (which
    raises ValueError on a bad row) when given, or verl rows through verl_example; blank lines are skipped."""
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
                row = _checked_row(json.loads(line), fields, parse, columns, verl)
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


def read_parquet(path, fields, parse=None, columns=(), verl=None):
    """Rows of a parquet file, with the checks of read_jsonl (only the columns used are read); errors name the
    row (1-based)."""
    regular_file(path)
    try:
        import pandas  # optional: only for parquet files
    except ImportError:
        raise ValueError(f"{path}: reading parquet needs pandas and pyarrow (pip install pandas pyarrow)") from None
    try:
        import pyarrow.parquet
        names = list(pyarrow.parquet.read_schema(path).names)
        use_verl = verl is not None and all(column in names for column in VERL_COLUMNS)
        wanted = list(VERL_COLUMNS) if use_verl else list(fields) + list(columns)
        missing = [name for name in wanted if name not in names]
        frame = None if missing else pandas.read_parquet(path, columns=wanted)
    except ImportError:
        raise ValueError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    except Exception as error:  # missing, truncated or not parquet at all: pyarrow raises many types
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{path}: cannot read parquet ({reason})") from None
    if missing:
        raise ValueError(f"{path}: no column(s) {missing}; columns: {[n for n in names if n != '__index_level_0__']}")
    rows = []
    for row_no, values in enumerate(zip(*(frame[name] for name in wanted)), 1):
        row = {name: plain(value) for name, value in zip(wanted, values)}
        try:
            rows.append(_checked_row(row, fields, parse, columns, verl))
        except ValueError as error:
            raise ValueError(f"{path}: row {row_no}: {error}") from None
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def read_rows(path, fields, parse=None, columns=(), verl=None):
    """read_parquet for a .parquet file, read_jsonl for anything else."""
    reader = read_parquet if str(path).endswith(".parquet") else read_jsonl
    return reader(path, fields, parse, columns, verl)


def row_key(row, key):
    """The split key of a row: the JSON of a verl row's messages (sorted keys, as prepare_data.py hashes them),
    else key(row) for a callable `key`, else row[key]."""
    if "messages" in row:
        return json.dumps(row["messages"], sort_keys=True)
    return key(row) if callable(key) else row[key]


def _parted(rows, in_test):
    return {"train": [r for r, t in zip(rows, in_test) if not t], "test": [r for r, t in zip(rows, in_test) if t]}


def hash_split(rows, key):
    """{"train", "test"} rows: a row is in test when crc32(its key) % TEST_EVERY == 0."""
    return _parted(rows, [zlib.crc32(row_key(row, key).encode("utf-8")) % TEST_EVERY == 0 for row in rows])


def ranked_holdout(rows, key, size, seed=HOLDOUT_SEED):
    """{"train", "test"} rows as prepare_data.py's grouped_split holds out: id = sha256 hex of the key; the
    min(size, max(1, distinct ids // 10)) ids first in the order of sha256(f"{seed}:{id}") are the test split."""
    ids = [hashlib.sha256(row_key(row, key).encode("utf-8")).hexdigest() for row in rows]
    ranked = sorted(set(ids), key=lambda uid: hashlib.sha256(f"{seed}:{uid}".encode()).digest())
    held = set(ranked[:min(size, max(1, len(ranked) // TEST_EVERY))])
    return _parted(rows, [uid in held for uid in ids])


def _held_out(rows, key, holdout):
    return hash_split(rows, key) if holdout is None else ranked_holdout(rows, key, holdout)


def _without_test_keys(train, test, key, where):
    """Drop the training rows whose key is also a test row's, and say how many (a surprise otherwise: a small
    generated file can lose whole kinds of rows)."""
    test_keys = {row_key(row, key) for row in test}
    kept = [row for row in train if row_key(row, key) not in test_keys]
    if len(kept) < len(train):
        print(f"note: {where}: {len(train) - len(kept)} of {len(train)} training rows repeat a test row's prompt and "
              "are left out of training", file=sys.stderr)
    return {"train": kept, "test": test}


def load_splits(data, fields, key, parse=None, *, columns=(), verl=None, holdout=None):
    """{"train": rows, "test": rows} from a file or a folder (see the module docstring). `key`: a field name or
    a function of the row; `holdout`: None (crc32) or the official held-out size k."""
    data = os.fspath(data)
    read = lambda path: read_rows(path, fields, parse, columns, verl)  # noqa: E731
    if not os.path.isdir(data):
        return _held_out(read(data), key, holdout)
    for ext in (".jsonl", ".parquet"):
        train_path = os.path.join(data, "train" + ext)
        for test_name in TEST_NAMES:
            test_path = os.path.join(data, test_name + ext)
            if os.path.exists(train_path) and os.path.exists(test_path):
                return _without_test_keys(read(train_path), read(test_path), key, data)
    shards = sorted(os.path.join(folder, name) for folder, _, names in os.walk(data) for name in names
                    if SHARD.fullmatch(name))
    if not shards:
        raise ValueError(f"{data}: no train and test files, and no train-* / test-* .jsonl or .parquet shards, in "
                         "this folder")
    rows = {split: [row for shard in shards if os.path.basename(shard).startswith(split)
                    for row in read(shard)] for split in ("train", "test")}
    if not rows["test"]:
        return _held_out(rows["train"], key, holdout)
    return _without_test_keys(rows["train"], rows["test"], key, data)


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


def hub_dataset(task, hub_name, *args, **options):
    """datasets.load_dataset(hub_name, *args, **options), or a one-line ValueError."""
    try:
        import datasets  # optional: only for users who have it and are online
    except ImportError:
        raise ValueError(f"{task}: data={hub_name!r} needs the `datasets` package; "
                         "or pass data=PATH") from None
    try:
        return datasets.load_dataset(hub_name, *args, **options)
    except Exception as error:  # offline, hub down, ...: one clear line, not a long traceback
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{task}: could not load {hub_name} with `datasets` ({first_line}); "
                         "pass data=PATH") from None


def truth_answer(truth):
    """The answer string of a math task's ground truth, read as the official scorers read it: SoftmaxGRPO's
    JSON object -> its "answer"; verl's / AR-Lopti's plain string -> the string itself (numbers: str())."""
    answer = truth.get("answer") if isinstance(truth, dict) else truth
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError("reward_model.ground_truth has no answer string")
    return answer.strip()


def last_user_text(messages):
    """The content of the last user message (the question, for the compact style), or of the last message."""
    return next((m["content"] for m in reversed(messages) if m["role"] == "user"), messages[-1]["content"])
