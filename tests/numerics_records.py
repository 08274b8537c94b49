"""The update's numerics, recorded bit for bit: one update of a tiny policy on a fixed batch, per case (zero-advantage
groups; Lopti's two passes in both orders, each non-empty; AR;
the KL term on a pass's tokens; the clip, the dual clip and the gradient clip each taken by
some tokens or steps; every --loss-agg), reduced to a digest of the weights it ends at, one set of digests per CPU kind (lab/ledger.py's code_path: CPU model and
instruction set, since each sums in its own order: docs/results.md, "Determinism").

    python -m tests.numerics_records            # this CPU's digests against tests/data/numerics_records.json
    python -m tests.numerics_records --write    # record every kind this CPU takes: its own
        # and, on an AVX-512 x86 CPU, the AVX2 path (ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2),
        # which gave the AVX2-only CPU's digests (both AMD EPYC, at 381f0cf)

A change of these digests is a change of the step's numerics: every trained row in lab/results made before it reruns
at its own commit, not at HEAD (lab.reproduce). So the commit that changes them adds a row to lab/numerics.csv (what
changed) and rewrites the records, which name the table's last row; tests/test_numerics_records.py holds the two
together, and --write refuses changed digests under an unchanged table. A new table row drops the other CPU kinds'
records (they were made before the change): each kind records its own again where one runs.

The one call site is `update` below (train.update_batch with a harness Config): where the update's signature moves,
change it there and run --write; the digests, not this file, say whether the numerics moved.
"""
import copy
import csv
import hashlib
import inspect
import json
import os
import subprocess
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = os.path.join(REPO, "tests", "data", "numerics_records.json")
TABLE = os.path.join(REPO, "lab", "numerics.csv")
# 4 groups of M = 4: the first and the third all zero (no gradient without the KL term: 200e2ee stopped forwarding
# such rows, which moved the micro-batches' boundaries); each of the 2 mini-batches opens with one of them
ADVANTAGES = [0.0, 0.0, 0.0, 0.0, 0.9, -0.3, -0.6, 0.0, 0.0, 0.0, 0.0, 0.0, 1.2, -0.4, -0.4, -0.4]
# the untrained policy's p_old is 0.014-0.038: eta 0.0185 puts 57 % of the learning tokens in
# the low pass, and each pass steps in each mini-batch (at eta 0.5 the high pass was empty: issue
# 82); the clips are narrow enough that the second epoch clips some tokens, caps some by the dual
# clip and clips some steps' gradients
ETA = 0.0185
AR_LOPTI = dict(alpha=0.3, lopti_eta=ETA, mini_batches=2, ppo_epochs=2, dual_clip=1.1,
                clip_low=0.15, clip_high=0.2, grad_clip=0.25)


def cases():
    """{name: settings}: GRPO alone; AR + Lopti (low first, both passes) under each loss aggregation; the same with
    the KL term; Lopti high first; in fp32 and under bf16 autocast (the one update since issue 79)."""
    from ppo import LOSS_AGGS
    out = {"grpo": {}, "bf16/ar-lopti": {**AR_LOPTI, "dtype": "bf16"}}
    for agg in LOSS_AGGS:
        out[f"ar-lopti/{agg}"] = {**AR_LOPTI, "loss_agg": agg}
    out["ar-lopti-kl"] = {**AR_LOPTI, "kl_coef": 0.1}
    out["lopti-high-first-kl"] = {"lopti_eta": ETA, "lopti_order": "high-first", "kl_coef": 0.1}
    return out


def batch():
    """(tokenizer, input_ids [16, 11], attention_mask, completion_mask [16, 6], advantages [16]): fixed tokens, rows
    8-11 left-padded by 2, completions of 2 to 6 tokens. Drawn here, not sampled: a change of generate is not one of
    the update."""
    from harness.tiny import build_char_tokenizer
    tokenizer = build_char_tokenizer()
    draw = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, len(tokenizer), (16, 11), generator=draw)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[8:12, :2] = 0
    input_ids[8:12, :2] = tokenizer.pad_token_id
    completion_mask = (torch.arange(6)[None] < 2 + torch.arange(16)[:, None] % 5).long()
    return tokenizer, input_ids, attention_mask, completion_mask, torch.tensor(ADVANTAGES)


def update(settings):
    """The call site: one update (train.update_batch) of the tiny policy at seed 0 by AdamW (lr 1e-3), micro-batches
    of 3 rows, one thread -> (its state_dict, the update's stats)."""
    import train
    from harness.config import Config
    from harness.tiny import build_tiny_model
    tokenizer, input_ids, attention_mask, completion_mask, advantages = batch()
    policy = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    ref_model = None
    if settings.get("kl_coef"):  # a reference apart from the policy, so that the k3 term has a gradient
        ref_model = copy.deepcopy(policy).eval()
        draw = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for parameter in ref_model.parameters():
                parameter.add_(0.01 * torch.randn(parameter.shape, generator=draw))
    config = Config(**{"micro_batch": 3, "max_new_tokens": 6, "dtype": "fp32", **settings})
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    stats = train.update_batch(policy, optimizer, input_ids, attention_mask, completion_mask,
                               advantages, config, ref_model=ref_model)
    return policy.state_dict(), stats


def digest(state):
    """The first 16 hex digits of the sha256 of every tensor's bytes, in name order."""
    hasher = hashlib.sha256()
    for name in sorted(state):
        hasher.update(name.encode() + state[name].detach().contiguous().numpy().tobytes())
    return hasher.hexdigest()[:16]


def measure(with_stats=False):
    """{case: digest} on this CPU, one thread ({case: (digest, the update's stats)} with_stats)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {name: update(settings) for name, settings in cases().items()}
    finally:
        torch.set_num_threads(threads)
    return {name: (digest(state), stats) if with_stats else digest(state)
            for name, (state, stats) in out.items()}


def cpu_kind():
    """This process's code path: the CPU model and the instruction set its kernels run (a pin counts)."""
    from lab.ledger import code_path, this_machine
    return code_path(this_machine(), os.environ)


def table_rows():
    """lab/numerics.csv's rows: commit, date, change (the commits that changed the step's numerics, oldest first)."""
    with open(TABLE, newline="") as f:
        return list(csv.DictReader(f))


def table_mark():
    """What the records name of the table (its row count and its last row's change) and of the
    fixed cases (a hash of their settings and batch: new cases are recorded without a table row)."""
    rows = table_rows()
    fixture = json.dumps([cases(), ADVANTAGES, inspect.getsource(batch)], sort_keys=True)
    return {"rows": len(rows), "last_change": rows[-1]["change"],
            "cases": hashlib.sha256(fixture.encode()).hexdigest()[:16]}


def read_records():
    if not os.path.isfile(RECORDS):
        return {"table": None, "kinds": {}}
    with open(RECORDS) as f:
        return json.load(f)


def write(now, kind):
    """Record `now` as this CPU kind's digests: refused where they differ from its record and
    neither the table nor the cases changed; a new row or new cases drop the other kinds' records.
    -> the message to print."""
    records, mark = read_records(), table_mark()
    old = records["kinds"].get(kind)
    if records["table"] == mark and old is not None and old != now:
        changed = sorted(name for name in now if old.get(name) != now[name])
        raise SystemExit(f"numerics_records: error: {len(changed)} of {len(now)} digests changed on {kind} "
                         f"({', '.join(changed[:4])}...) and lab/numerics.csv has no new row: add one that says "
                         "what changed the numerics, then --write")
    kinds = records["kinds"] if records["table"] == mark else {}
    with open(RECORDS, "w") as f:
        json.dump({"table": mark, "kinds": {**kinds, kind: now}}, f, indent=1, sort_keys=True)
        f.write("\n")
    return f"wrote {kind}'s {len(now)} digests to {os.path.relpath(RECORDS, REPO)} (table row {mark['rows']})"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    kind, now = cpu_kind(), measure()
    if argv == ["--write"]:
        print(write(now, kind))
        from lab.ledger import machine_isa, pin_for, pins
        if machine_isa() == "avx512" and not pins(os.environ):  # the AVX2 path's records too
            subprocess.run([sys.executable, "-m", "tests.numerics_records", "--write"], check=True,
                           cwd=REPO, env={**os.environ, **pin_for("avx2")})
        return 0
    if argv:
        raise SystemExit("usage: python -m tests.numerics_records [--write]")
    recorded = read_records()["kinds"].get(kind)
    if recorded is None:
        print(f"no record of {kind}: --write makes one")
        return 1
    changed = sorted(name for name in now if recorded.get(name) != now[name])
    print(f"{kind}: {len(now) - len(changed)} of {len(now)} digests as recorded"
          + (f"; changed: {', '.join(changed)}" if changed else ""))
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
