"""The guard on the step's numerics (tests/numerics_records.py): the update's bit-for-bit records on this CPU kind,
held together with lab/numerics.csv, the table of the commits that changed them (lab.reproduce reads it)."""
import json
import warnings

import pytest

import train
from ppo import LOSS_AGGS
from tests import numerics_records as records


@pytest.fixture(scope="module")
def measured():
    return records.measure(with_stats=True)  # {case: (digest, stats)}: 15 updates, ~1 s


def test_the_records_name_the_numerics_tables_last_row():
    # a commit that changes the numerics adds a table row and rewrites the records, which name that row
    saved = records.read_records()
    assert saved["table"] == records.table_mark(), (
        "tests/data/numerics_records.json was written under another lab/numerics.csv: run "
        "python -m tests.numerics_records --write")
    rows = records.table_rows()
    assert "200e2ee" in [row["commit"] for row in rows] and all(row["change"] for row in rows)


def test_the_cases_cover_zero_advantage_groups_both_passes_ar_kl_bf16_and_every_loss_agg():
    mine = list(records.cases().values())
    assert {settings.get("loss_agg", "token-mean") for settings in mine} == set(LOSS_AGGS)
    assert any(s.get("lopti_eta") and s.get("alpha") for s in mine)  # AR with Lopti's two passes
    assert {s.get("lopti_order", "low-first") for s in mine if s.get("lopti_eta")} == {"low-first", "high-first"}
    assert any(s.get("kl_coef") for s in mine) and any(not s.get("kl_coef") for s in mine)
    assert any(s.get("dtype") == "bf16" for s in mine)
    advantages = records.ADVANTAGES
    groups = [advantages[i:i + 4] for i in range(0, 16, 4)]
    assert [not any(group) for group in groups] == [True, False, True, False]  # a zero group opens each mini-batch


def test_the_fixed_batch_opens_every_branch_a_setting_opens(measured):
    # issue 82: at eta 0.5 every token sat in the low pass, and 3 changes of the step left every digest as it was
    for name, settings in records.cases().items():
        stats = measured[name][1]
        if settings.get("lopti_eta"):  # both passes non-empty, each with a step in every mini-batch
            assert 0 < stats["lopti_low_share"] < 1, name
            steps = 2 * settings.get("ppo_epochs", 1) * settings.get("mini_batches", 1)
            assert stats["optimizer_steps"] == steps, name
        if settings.get("ppo_epochs", 1) > 1:  # the second epoch clips tokens each way and caps some
            assert stats["clip_frac_low"] > 0 and stats["clip_frac_high"] > 0 and stats["dual_clip_frac"] > 0, name
        if settings.get("kl_coef"):
            assert stats["kl"] > 0, name


def mutated(monkeypatch, name, mutation):
    """The digest of case `name` under a change of the step (monkeypatched into train for this call)."""
    if mutation == "drop the high pass":
        passes = train.lopti_passes
        monkeypatch.setattr(train, "lopti_passes", lambda *a, **k: [p for p in passes(*a, **k) if p[0] != "high"])
    elif mutation == "ignore --lopti-order":
        passes = train.lopti_passes
        monkeypatch.setattr(train, "lopti_passes", lambda *a, **k: passes(*a[:4]))
    else:  # the KL term on every valid token, not only the pass's
        loss = train.policy_loss
        monkeypatch.setattr(train, "policy_loss", lambda *a, **k: loss(*a, **{**k, "kl_mask": None}))
    return records.digest(records.update(records.cases()[name])[0])


@pytest.mark.parametrize("mutation, name", [("drop the high pass", "ar-lopti/token-mean"),
                                            ("ignore --lopti-order", "lopti-high-first-kl"),
                                            ("KL on every token", "ar-lopti-kl")])
def test_each_change_the_guard_missed_before_moves_a_digest(measured, monkeypatch, mutation, name):
    assert mutated(monkeypatch, name, mutation) != measured[name][0]


def test_the_update_is_bit_for_bit_its_record_on_this_cpu(measured):
    kind = records.cpu_kind()
    recorded = records.read_records()["kinds"].get(kind)
    if recorded is None:  # loud: a warning in the summary, not only an "s"
        message = (f"no numerics record of this CPU kind ({kind}): the step's bit-for-bit guard did not run here; "
                   "record it with python -m tests.numerics_records --write")
        warnings.warn(message)
        pytest.skip(message)
    now = {name: value[0] for name, value in measured.items()}
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
    assert saved == {"table": {"rows": 2, "last_change": "two", "cases": records.table_mark()["cases"]},
                     "kinds": {"CPU A": {"case": "cccc"}}}
    monkeypatch.setattr(records, "ADVANTAGES", [0.0] * 16)  # new cases: recorded again, the others dropped
    records.write({"case": "dddd"}, "CPU B")
    assert json.loads(path.read_text())["kinds"] == {"CPU B": {"case": "dddd"}}
