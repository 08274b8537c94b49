"""The results ledger is replaced, never cut: a ship that fails midway (a full disk, a read-only folder, a link in the
file's place) is one line, and the shipped rows are byte for byte as they were."""
import errno
import os
import shutil

import pytest

from lab import reproduce


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    """A copy of the shipped results, and the path of the default cell's file in it."""
    shutil.copytree(reproduce.RESULTS, tmp_path / "results")
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path / "results"))
    return tmp_path / "results" / reproduce.CELLS["default"][2]


MADE = {"commit": "abc", "date": "2026-12-02", "load": "0", "machine": "test"}


def test_a_ship_that_meets_a_full_disk_midway_leaves_every_row(ledger, monkeypatch, capsys):
    before = ledger.read_bytes()
    real_fsync = os.fsync

    def full(fd):  # the rows went into the file's buffer; the disk refuses them
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(SystemExit) as exit_info:
        reproduce.ship("default", {"final_reward": 0.5}, made=MADE)
    monkeypatch.setattr(os, "fsync", real_fsync)
    message = str(exit_info.value.code)
    assert message.startswith("reproduce: error:") and "free some disk space" in message and "\n" not in message
    assert ledger.read_bytes() == before and sorted(os.listdir(ledger.parent)) == sorted(os.listdir(
        os.path.join(os.path.dirname(os.path.dirname(reproduce.__file__)), "lab", "results")))


def test_a_read_only_folder_is_one_line_and_the_file_stays(ledger, monkeypatch):
    before = ledger.read_bytes()

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    monkeypatch.setattr(reproduce.tempfile, "mkstemp", read_only)
    with pytest.raises(SystemExit, match="reproduce: error: .*not writable"):
        reproduce.ship("default", {"final_reward": 0.5}, made=MADE)
    assert ledger.read_bytes() == before


def test_a_link_in_the_ledgers_place_is_never_written_through(ledger, tmp_path):
    target = tmp_path / "mine.csv"
    target.write_text("my own rows\n")
    os.remove(ledger)
    ledger.symlink_to(target)
    with pytest.raises(SystemExit, match="is a link"):
        reproduce.ship("default", {"final_reward": 0.5}, made=MADE)
    assert target.read_text() == "my own rows\n" and os.path.islink(ledger)


def test_a_ship_that_succeeds_keeps_the_other_cpus_rows(ledger):
    others = [row for row in reproduce.ledger_rows(str(ledger)) if reproduce.cpu_kind(row["machine"])
              != reproduce.cpu_kind(MADE["machine"])]
    reproduce.ship("default", {"final_reward": 0.5}, made=MADE)
    rows = reproduce.ledger_rows(str(ledger))
    assert [row for row in rows if row["machine"] == "test"][0]["value"] == "0.5"
    assert all(row in rows for row in others) and oct(os.stat(ledger).st_mode & 0o777) == "0o644"


# A tampered ledger: each reader of the shipped rows (reproduce --list, a cell's comparison, headline) ends in one line
# naming the file and its line, never a traceback; the file is not touched.
def tamper(ledger, how):
    lines = ledger.read_text().splitlines(keepends=True)
    if how == "header":  # a missing column
        lines[0] = lines[0].replace(",made", "")
    elif how in ("number", "nan"):  # the value, a row's last field (cell, made, metric, value)
        lines[3] = lines[3].rstrip("\n").rsplit(",", 1)[0] + (",0.5x\n" if how == "number" else ",nan\n")
    elif how == "short":
        lines[3] = ",".join(lines[3].split(",")[:2]) + "\n"
    elif how == "long":  # one field too many
        lines[3] = lines[3].rstrip("\n") + ",extra\n"
    elif how == "huge":  # a field over csv's size limit
        lines[3] = lines[3].rstrip("\n") + "x" * 200_000 + "\n"
    ledger.write_text("".join(lines))
    return 4 if how != "header" else 1


@pytest.mark.parametrize("how", ["header", "number", "nan", "short", "long", "huge"])
def test_a_tampered_ledger_is_one_line_naming_its_line(ledger, capsys, how):
    line = tamper(ledger, how)
    before = ledger.read_bytes()
    for call in (lambda: reproduce.main(["--list"]), lambda: reproduce.main(["default"]),
                 lambda: reproduce.ship("default", {"final_reward": 0.5}, made=MADE)):
        with pytest.raises(SystemExit) as exit_info:
            call()
        message = str(exit_info.value.code)
        assert message.startswith(f"reproduce: error: {ledger}:{line}:") and "\n" not in message, message
    assert ledger.read_bytes() == before


def test_headline_reads_a_tampered_ledger_in_one_line(tmp_path, monkeypatch):
    from lab import headline
    shutil.copytree(reproduce.RESULTS, tmp_path / "results")
    monkeypatch.setattr(reproduce, "RESULTS", str(tmp_path / "results"))
    ledger = tmp_path / "results" / reproduce.CELLS["countdown3-grpo-seed0"][2]
    line = tamper(ledger, "number")
    with pytest.raises(SystemExit, match=f"{ledger}:{line}: value"):
        headline.main([])


def test_two_ships_at_once_keep_both_cells_rows(ledger, monkeypatch):
    # each ship reads the file, adds its rows and writes it back; the first one pauses between its read and its
    # write (while holding its turn), so without turns the second's write would land between them and be dropped
    import threading
    import time
    real_rows, first = reproduce.ledger_rows, threading.Event()

    def slow_rows(path):
        rows = real_rows(path)
        if not first.is_set():
            first.set()
            time.sleep(0.5)  # the other ship starts now, reads, writes
        return rows
    monkeypatch.setattr(reproduce, "ledger_rows", slow_rows)
    ships = [threading.Thread(target=reproduce.ship, args=(name, {"final_reward": 0.25}), kwargs={"made": MADE})
             for name in ("default-bf16-sr", "default-step-in-backward")]
    ships[0].start()
    first.wait()
    ships[1].start()
    for ship in ships:
        ship.join()
    names = {row["cell"] for row in real_rows(str(ledger)) if row["machine"] == "test"}
    assert names == {"default-bf16-sr", "default-step-in-backward"}


def test_a_shipped_row_names_the_commit_that_ran_not_one_made_while_it_ran(ledger, monkeypatch):
    # the commit is read when the rerun starts; one made while it runs (here: HEAD moves to "later" during the
    # rerun) is not the code that made the numbers
    head, real_provenance, real_rerun = {"commit": "ran"}, reproduce.provenance, reproduce.rerun

    def rerun_while_a_commit_lands(*args, **kwargs):
        values = real_rerun(*args, **kwargs)
        head["commit"] = "later"
        return values
    monkeypatch.setattr(reproduce, "provenance", lambda load=None: {**real_provenance(load), **head})
    monkeypatch.setattr(reproduce, "rerun", rerun_while_a_commit_lands)
    assert reproduce.main(["table3-identity", "--ship"]) == 0
    rows = reproduce.ledger_rows(str(ledger.parent / "table3_identity.csv"))
    assert {row["commit"] for row in rows if row["cell"] == "table3-identity"
            and row["machine"] == reproduce.this_machine()} == {"ran"}


def test_a_ship_killed_midway_leaves_a_temporary_that_git_ignores_and_the_next_ship_removes(ledger, monkeypatch):
    """A kill (SIGKILL: no finally runs) between the write and the rename: simulated by a temporary of a process
    that is gone. git status does not list it, and the next ship of that file removes it."""
    import subprocess
    leftover = ledger.parent / f".{ledger.name}.tmp-999999999-k1ll3d"  # beyond any PID: its process is gone
    leftover.write_text("cell,made\n")
    repo = os.path.dirname(os.path.dirname(reproduce.__file__))
    if subprocess.run(["git", "rev-parse"], cwd=repo, capture_output=True, timeout=30).returncode:
        pytest.skip("not a git checkout")
    checked = subprocess.run(["git", "check-ignore", "-q", "--no-index", f"lab/results/{leftover.name}"],
                             cwd=repo, timeout=30)
    assert checked.returncode == 0  # ignored: git status does not list it
    reproduce.ship("default", {"final_reward": 0.5}, made=MADE)
    assert not leftover.exists() and not [name for name in os.listdir(ledger.parent) if name.startswith(".")]


def test_a_full_disk_names_no_flag_reproduce_does_not_have(ledger, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(SystemExit) as exit_info:
        reproduce.ship("default", {"final_reward": 0.5}, made=MADE)
    assert "free some disk space" in str(exit_info.value.code) and "--output-dir" not in str(exit_info.value.code)


def test_a_byte_that_is_not_utf8_is_reported_at_its_line(ledger):
    lines = ledger.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b",", b",\xff", 1)
    ledger.write_bytes(b"".join(lines))
    with pytest.raises(SystemExit) as exit_info:
        reproduce.main(["--list"])
    assert str(exit_info.value.code).startswith(f"reproduce: error: {ledger}:3: 'utf-8' codec can't decode")



def test_results_mds_per_machine_tables_are_each_machines_rows():
    # issue 82 (U2): a column of the table rested on git history once a ship replaced another CPU's rows
    from lab.ledger import cpu_kind
    kinds = {"Intel Xeon (AVX-512)": "Intel(R) Xeon(R) Processor, avx512", "AMD EPYC (AVX-512)": "AMD EPYC, avx512",
             "AMD EPYC (AVX2 only)": "AMD EPYC, avx2"}
    text = open(os.path.join(reproduce.REPO, "docs", "results.md")).read()
    lines = [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines() if line[:2] == "| "]
    header = next(cells for cells in lines if cells[0] == "cell")[2:]
    values = [("default", cells[0], " → ".join(cells[1:])) for cells in lines if cells[0] in kinds and len(cells) == 3]
    values += [(cells[0].strip("`"), kind, value) for cells in lines if cells[0][:8] in ("`default", "`smoke-a")
               for kind, value in zip(header, cells[2:])]
    for cell, kind, value in values:
        rows = [row for row in reproduce.shipped_rows(cell) if cpu_kind(row["machine"]) == kinds[kind]]
        if "typed" not in value:
            assert (value == "not run") == (not rows), (cell, kind, value)
        if rows and "typed" not in value:
            made = {row["metric"]: float(row["value"]) for row in rows if row["machine"] == rows[0]["machine"]}
            assert [float(x) for x in value.split(" → ")] == [made["before_pass@1"], made["after_pass@1"]], (cell, kind)
    assert len(values) == 3 + 6 * 3
