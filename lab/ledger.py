"""The results ledger: the shipped numbers behind docs/results.md, docs/performance.md and lab/referees.md, read and
written here only. A results file is two CSVs under lab/results/: NAME.csv (cell, made, metric, value: one row per
metric) and NAME.cells.csv (cell, made, commit, date, load, machine, command: once per cell and CPU), `made` a short
hash of the provenance. ledger_rows joins them into rows of FIELDS; write_results splits such rows back. A seeded
CPU run's numbers follow the code path torch's kernels and MKL take by the CPU's vendor and vector ISA unless
ATEN_CPU_CAPABILITY pins it (docs/results.md, "Determinism"): code_path names it for a row or for this process.
"""
import contextlib
import csv
import hashlib
import math
import os
import platform
import re
import time

FIELDS = ("cell", "metric", "value", "commit", "date", "load", "machine", "command")
VALUE_FIELDS = ("cell", "made", "metric", "value")
MADE_FIELDS = ("cell", "made", "commit", "date", "load", "machine", "command")
PINS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR")  # the variables that pin torch's and MKL's code path
ISA_ORDER = ("default", "avx2", "avx512")  # x86: a CPU with one of these can run every path before it


def cells_path(path):
    """The cell table beside a results file: NAME.csv -> NAME.cells.csv."""
    return path[:-len(".csv")] + ".cells.csv"


def made_id(cell, made):
    """The short hash that ties a cell's value rows to its provenance row."""
    text = "\x1f".join([cell, *(made[key] for key in MADE_FIELDS[2:])])
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def read_csv(path, fields, check_row=None):
    """[(line number, row)] of one ledger CSV whose header is `fields`; a link, a wrong header, a row of the wrong
    length, an over-long field or what check_row raises is one line naming file:line. [] if the file is absent."""
    name = os.path.basename(path)
    if os.path.islink(path):
        raise SystemExit(f"reproduce: error: {path} is a link; the ledger is never read or written through one: "
                         f"restore it with git checkout -- lab/results/{name}")
    if not os.path.isfile(path):
        return []
    rows = []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if tuple(header or ()) != fields:
                raise ValueError(f"its header is {','.join(header or ['(empty)'])}; expected {','.join(fields)}")
            for values in reader:
                if not values:
                    continue  # a blank line
                if len(values) != len(fields):
                    raise ValueError(f"{len(values)} fields; expected {len(fields)} ({','.join(fields)})")
                row = dict(zip(fields, values))
                if check_row:
                    check_row(row)
                rows.append((reader.line_num, row))
        except (ValueError, csv.Error) as error:
            line = undecodable_line(path) if isinstance(error, UnicodeDecodeError) else reader.line_num
            raise SystemExit(f"reproduce: error: {path}:{line}: {error}; restore it with "
                             f"git checkout -- lab/results/{name}") from None
    return rows


def undecodable_line(path):
    """The line of path where its first byte that is not UTF-8 stands (the text reader decodes ahead of the CSV
    reader, so its line count is behind)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        data.decode()
    except UnicodeDecodeError as error:
        return data.count(b"\n", 0, error.start) + 1
    return 0


def finite_value(row):
    try:
        number = float(row["value"])
    except ValueError:
        number = None
    if number is None or not math.isfinite(number):
        raise ValueError(f"value {row['value'][:40]!r} is not a finite number")


def ledger_rows(path):
    """Every row of a results file (`path`: NAME.csv), joined with its cell table into a dict of FIELDS and checked
    as it is read: each value a finite number, each `made` a row of the cell table for the same cell. A tampered
    file is one line naming file:line; nothing is written. [] if the file does not exist. A cell-table row no value
    names is allowed (a ship stopped between its two writes leaves one) and dropped at the next ship."""
    values = read_csv(path, VALUE_FIELDS, finite_value)
    table = cells_path(path)
    made = {}
    for line, row in read_csv(table, MADE_FIELDS):
        if row["made"] in made:
            raise SystemExit(f"reproduce: error: {table}:{line}: made {row['made']} twice; restore it with "
                             f"git checkout -- lab/results/{os.path.basename(table)}")
        made[row["made"]] = row
    rows = []
    for line, row in values:
        origin = made.get(row["made"])
        if origin is None or origin["cell"] != row["cell"]:
            raise SystemExit(f"reproduce: error: {path}:{line}: made {row['made'][:40]!r} of cell "
                             f"{row['cell'][:60]!r} is no row of {os.path.basename(table)}; restore both with "
                             f"git checkout -- lab/results/")
        rows.append({"cell": row["cell"], "metric": row["metric"], "value": row["value"],
                     **{key: origin[key] for key in MADE_FIELDS[2:]}})
    return rows


def write_results(path, rows):
    """Replace a results file by rows of FIELDS: the cell table first (the new provenance beside the old), then the
    values, then the cell table without what no value names. Each write is atomic (write_file), so a stop between
    them leaves a file that reads: the old values, or the new, each with its provenance."""
    table, new = cells_path(path), {}
    for row in rows:
        made = {key: row[key] for key in MADE_FIELDS[2:]}
        new.setdefault((row["cell"], made_id(row["cell"], made)), made)
    old = {(row["cell"], row["made"]): row for _, row in read_csv(table, MADE_FIELDS)}
    cells = sorted(({"cell": cell, "made": key, **made} for (cell, key), made in new.items()),
                   key=lambda row: (row["cell"], row["machine"], row["made"]))
    write_file(table, MADE_FIELDS, cells + [row for key, row in old.items() if key not in new])
    write_file(path, VALUE_FIELDS, [{"cell": row["cell"], "made": made_id(row["cell"], row), "metric": row["metric"],
                                     "value": row["value"]} for row in rows])
    write_file(table, MADE_FIELDS, cells)


@contextlib.contextmanager
def taking_turns(folder):
    """Two ships into one results file each read it, add their rows and write it back: the later would drop the
    earlier's rows. They take turns on an exclusive flock of the results folder itself (its open descriptor: no
    lock file left behind); where fcntl does not exist (Windows) there is no lock."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    os.makedirs(folder, exist_ok=True)  # as write_file would
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def write_file(path, fields, rows):
    """Replace one CSV atomically (replaced_file: a new .NAME.csv.tmp-PID beside it, flushed to disk, renamed over
    it; removed however this ends, and one a killed ship left is removed by the next; .gitignore'd). A full disk, a
    read-only folder, or a link, hard link or FIFO in the file's place is one line; the old file stays as it was."""
    from harness.files import RunError, replaced_file, write_failed
    try:
        if os.path.islink(path):
            raise OSError(f"{path} is a link; the ledger is never written through one: restore it with git checkout")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with replaced_file(path, "w") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
    except (OSError, RunError) as error:
        message = write_failed(path, error, otherwise="", elsewhere="") if isinstance(error, OSError) else error
        raise SystemExit(f"reproduce: error: {message}; {path} is as it was") from None


# ---------------------------------------------------------------------------------------------------------------
# Machines and code paths
# ---------------------------------------------------------------------------------------------------------------
def machine_isa():
    """The vector ISA torch's CPU kernels and MKL pick on this machine: avx512 or avx2 (x86), else the platform."""
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    return "avx512" if " avx512f" in flags else "avx2" if " avx2" in flags else platform.machine()


def this_machine():
    """This machine as a results row names it: "CPU model, ISA, N cores"."""
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    return f"{cpu}, {machine_isa()}, {os.cpu_count()} cores"


def cpu_kind(machine):
    """The part of a results row's machine that decides its numbers: CPU model and ISA, not the core count."""
    return machine.rsplit(",", 1)[0] if machine.endswith(" cores") else machine


def pins(environment):
    """{variable: value} of PINS set in an environment (a dict, or a command's leading KEY=VALUE words)."""
    if isinstance(environment, str):
        environment = dict(re.findall(r"\b(" + "|".join(PINS) + r")=(\S+)", environment))
    return {key: environment[key] for key in PINS if environment.get(key)}


def code_path(machine, environment=None):
    """The code path a run's numbers follow: "CPU model, ISA", the ISA being ATEN_CPU_CAPABILITY's where the
    environment pins it, else the machine's own."""
    model, _, isa = cpu_kind(machine).rpartition(", ")
    pinned = pins(environment or {}).get("ATEN_CPU_CAPABILITY")
    return f"{model}, {pinned.lower() if pinned else isa}"


def can_run(machine, path):
    """Whether this `machine` can take `path` (a code_path) by pinning: the same CPU model, and an ISA its own
    includes (an AVX-512 x86 CPU runs the avx2 path). Another vendor or model cannot: MKL's and torch's kernels
    differ there even pinned (docs/results.md, "Determinism")."""
    model, _, isa = cpu_kind(machine).rpartition(", ")
    wanted_model, _, wanted = path.rpartition(", ")
    return model == wanted_model and isa in ISA_ORDER and wanted in ISA_ORDER and \
        ISA_ORDER.index(wanted) <= ISA_ORDER.index(isa)


def pin_for(path):
    """The environment that puts this machine on `path`'s ISA: torch's ATEN_CPU_CAPABILITY and MKL's MKL_CBWR."""
    isa = path.rpartition(", ")[2]
    return {"ATEN_CPU_CAPABILITY": isa, "MKL_CBWR": {"default": "COMPATIBLE"}.get(isa, isa.upper())}


def load_average():
    """The 1-, 5- and 15-minute load averages now, as a results row writes them ("" where the OS has none)."""
    return " ".join(open("/proc/loadavg").read().split()[:3]) if os.path.exists("/proc/loadavg") else ""


def provenance(load=None):
    """The commit (with -dirty for uncommitted changes to Python files: a results file a ship has just written does
    not count), date, load (default: now's) and machine of a measurement made now."""
    from experiments.runs import git
    commit = git("rev-parse", "--short", "HEAD") + ("-dirty" if git("status", "--porcelain", "--untracked-files=no",
                                                                     "--", "*.py") else "")  # code, not results files
    return {"commit": commit or "unknown", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load": load_average() if load is None else load, "machine": this_machine()}


ACTIVITY = ("clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_max", "kl")  # a run's activity


def activity(metrics_path):
    """The training rows' clip/ratio/KL series of one run -> {key: [(step, value)]}."""
    from harness.metrics import read_metrics
    rows = [r for r in read_metrics(metrics_path) if not r.get("eval")]
    return {key: [(r["step"], r[key]) for r in rows if key in r] for key in ACTIVITY}


def ratio_is_one(series):
    """Every step's token-mean ratio and maximum ratio are 1 (then every ratio is 1: none above, mean 1)."""
    return bool(series["ratio_mean"]) and all(v == 1.0 for _, v in series["ratio_mean"] + series["ratio_max"])
