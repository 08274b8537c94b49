"""The guard on the step's numerics (tests/numerics_records.py): the update's bit-for-bit records on this CPU kind,
held together with lab/numerics.csv, the table of the commits that changed them (lab.reproduce reads it)."""
import json

import pytest

from ppo import LOSS_AGGS
from tests import numerics_records as records


def test_the_records_name_the_numerics_tables_last_row():
    # a commit that changes the numerics adds a table row and rewrites the records, which name that row
    saved = records.read_records()
    assert saved["table"] == records.table_mark(), (
        "tests/data/numerics_records.json was written under another lab/numerics.csv: run "
        "python -m tests.numerics_records --write")
    rows = records.table_rows()
    assert "200e2ee" in [row["commit"] for row in rows] and all(row["change"] for row in rows)


def test_the_cases_cover_both_paths_zero_advantage_groups_both_passes_ar_kl_and_every_loss_agg():
    cases = records.cases()
    for path, fast in (("plain", False), ("fast", True)):
        mine = [settings for name, (f, settings) in cases.items() if name.startswith(path + "/") and f == fast]
        aggs = {settings.get("loss_agg", "token-mean") for settings in mine}
        assert aggs == set(LOSS_AGGS) - ({"token-mean-per-micro-batch"} if not fast else set())
        assert any(s.get("lopti_eta") and s.get("alpha") for s in mine)  # AR with Lopti's two passes
        assert {s.get("lopti_order", "low-first") for s in mine if s.get("lopti_eta")} == {"low-first", "high-first"}
        assert any(s.get("kl_coef") for s in mine) and any(not s.get("kl_coef") for s in mine)
    advantages = records.ADVANTAGES
    groups = [advantages[i:i + 4] for i in range(0, 16, 4)]
    assert [not any(group) for group in groups] == [True, False, True, False]  # a zero group opens each mini-batch


def test_the_update_is_bit_for_bit_its_record_on_this_cpu():
    kind = records.cpu_kind()
    recorded = records.read_records()["kinds"].get(kind)
    if recorded is None:
        pytest.skip(f"no numerics record of this CPU kind ({kind}): python -m tests.numerics_records --write")
    now = records.measure()
    changed = sorted(name for name in recorded if now.get(name) != recorded[name])
    assert set(now) == set(recorded) and not changed, (
        f"the update's numerics changed on {kind} ({', '.join(changed)}): if meant, add a row to lab/numerics.csv "
        "saying what changed them and run python -m tests.numerics_records --write; every trained row made before "
        "then reruns at its own commit (python -m lab.reproduce --list)")


def test_write_refuses_new_digests_under_the_same_table_and_a_new_row_drops_the_other_kinds(tmp_path, monkeypatch):
    path, table = tmp_path / "records.json", tmp_path / "numerics.csv"
    table.write_text("commit,date,change\nabc1234,2026-12-01,one\n")
    monkeypatch.setattr(records, "RECORDS", str(path))
    monkeypatch.setattr(records, "TABLE", str(table))
    records.write({"case": "aaaa"}, "CPU A")
    records.write({"case": "bbbb"}, "CPU B")  # a second kind beside the first
    records.write({"case": "aaaa"}, "CPU A")  # the same digests again: nothing changed
    with pytest.raises(SystemExit, match="1 of 1 digests changed on CPU A .* lab/numerics.csv has no new row"):
        records.write({"case": "cccc"}, "CPU A")
    assert json.loads(path.read_text())["kinds"] == {"CPU A": {"case": "aaaa"}, "CPU B": {"case": "bbbb"}}
    table.write_text(table.read_text() + ",2026-12-06,two\n")  # a new row (its commit: the one that adds it)
    records.write({"case": "cccc"}, "CPU A")
    saved = json.loads(path.read_text())
    assert saved == {"table": {"rows": 2, "last_change": "two"}, "kinds": {"CPU A": {"case": "cccc"}}}
