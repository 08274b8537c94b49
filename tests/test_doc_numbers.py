"""Every number in docs/ and the README has its results row or its label (issue 64; docs/tests.md, "Numbers in the
docs"). Moved out of tests/test_lesson_shape.py so that the lesson's subset (`pytest -m lesson`) carries no docs
linter."""
import collections
import csv
import glob
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- every number in docs/ and the README has its row or its label (issue 64; docs/tests.md, "Numbers in the docs") --
LABELS = ("typed", "from the shipped rows")  # a block that says one of these answers for its numbers
NUMBER = re.compile(r"(?<![\w.^/#-])(\d+\.\d+)(?![\w.]*\w)")  # a decimal, not part of a name, version or path
# what a decimal right after these words is: a reference, a version or a default, not a measured claim
NOT_A_CLAIM = re.compile(r"(arxiv|prop\.|proposition|eq\.|§|section|theorem|lemma|fig\.|figure|table|transformers|"
                         r"torch|torchvision|verl|python|cuda|version|pin|default)\W{0,3}$", re.I)
DEBT = os.path.join(ROOT, "tests", "data", "unrowed_numbers.json")  # the numbers that failed the rule when it came in


def result_rows():
    """{results csv name: {cell: [|value|, ...]}} of lab/results/*.csv (not the .cells.csv provenance files)."""
    table = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "lab", "results", "*.csv"))):
        if path.endswith(".cells.csv"):
            continue
        cells = collections.defaultdict(list)
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                cells[row["cell"]].append(abs(float(row["value"])))
        table[os.path.basename(path)] = dict(cells)
    return table


def sections(text):
    """[(first line number, text)] of a markdown text cut at its headings."""
    out, lines, start = [], [], 1
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("#") and lines:
            out.append((start, lines))
            lines, start = [], number
        lines.append(line)
    return out + [(start, lines)]


def blocks(lines, start):
    """[(line number, text)] of a section's blocks: paragraphs, list items, headings and tables (a table whose header
    row carries a label is one block with it; otherwise each of its rows is one)."""
    out, current, first = [], [], start
    for number, line in enumerate(lines + [""], start):
        own = line.startswith("#") or re.match(r"\s*([-*]|\d+\.) ", line) or line.startswith("|")
        in_labelled_table = line.startswith("|") and current and current[0].startswith("|") and \
            any(label in current[0].lower() for label in LABELS)
        if in_labelled_table:
            current.append(line)
            continue
        if not line.strip() or own:
            if current:
                out.append((first, " ".join(current)))
            current, first = ([line], number) if own else ([], number + 1)
        else:
            first = first if current else number
            current.append(line)
    return out


def section_values(text, table):
    """The row values a section may cite: of each results csv it links, of each cell it names in backquotes, and of
    every csv where it links docs/results.md (the README, whose results point there)."""
    names = set(table) if "results.md" in text else set(re.findall(r"results/(\w+\.csv)", text))
    values = [value for name in names for cell in table.get(name, {}).values() for value in cell]
    named = set(re.findall(r"`([\w.+-]+)`", text))
    return values + [value for cells in table.values() for cell, got in cells.items() if cell in named
                     for value in got]


def unrowed(text, table):
    """[(line, number)] of the decimals of a markdown text with neither a row nor a label: each decimal (outside code
    spans, code blocks and link targets, not a reference, version or default: NOT_A_CLAIM) must equal, at its printed precision, a row value its section cites
    (section_values), or stand in a block (blocks) that says one of LABELS."""
    found = []
    text = re.sub(r"```.*?```", lambda match: "\n" * match.group().count("\n"), text, flags=re.S)
    for start, lines in sections(text):
        values, rounded = section_values("\n".join(lines), table), {}
        for line, block in blocks(lines, start):
            if any(label in block.lower() for label in LABELS):
                continue
            block = re.sub(r"`[^`]*`|\]\([^)]*\)|https?://\S+", " ", block)
            for match in NUMBER.finditer(block):
                if NOT_A_CLAIM.search(block[max(0, match.start() - 16):match.start()]) or \
                        re.fullmatch(r"\d{4}\.\d{4,5}", match.group(1)):  # an arXiv id
                    continue
                digits = len(match.group(1).split(".")[1])
                rounded.setdefault(digits, {round(value, digits) for value in values})
                if float(match.group(1)) not in rounded[digits]:
                    found.append((line, match.group(1)))
    return found


def test_the_number_rule_flags_what_the_audit_found():
    # issue 64's audit, on the text as it was (27cee0c) and as it is; the rows are stand-ins for a cell's csv
    table = {"smollm2_cpu.csv": {"smollm2-cpu-seed0": [0.613, 0.909]}, "other.csv": {"x": [0.995, 0.99]}}
    section = "## SmolLM2\n[rows](results/smollm2_cpu.csv): reward 0.613 → 0.909.\n\n"
    old = section + ("Here an AdamW step of about the lr, 1e-5, is 0.02 of a bf16 spacing at SmolLM2's median\n"
                     "|weight| (0.11) and below half a spacing.\n\n| update | Q1 (p_old < ~0.99) | Q4 (p_old > ~0.995) |\n")
    assert unrowed(old, table) == [(4, "0.02"), (5, "0.11"), (7, "0.99"), (7, "0.995")]
    new = section + "Here (typed arithmetic, no row) a step is 0.02 of a spacing at |weight| (0.11).\n"
    assert unrowed(new, table) == []
    labelled = "## T\n| p | MC ± 95% (the ± typed) |\n|---|---|\n| 0.1 | 5.202 ± 0.064 |\n\n| next | 0.064 |\n"
    assert unrowed(labelled, table) == [(6, "0.064")]  # the label covers its own table only
    assert unrowed("## R\n`cmd --lr 0.5` and [a](results/x_0.5.csv), version 2.13.0\n", table) == []


def test_every_number_in_the_docs_has_its_row_or_its_label():
    table, debt = result_rows(), json.load(open(DEBT))
    over = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]:
        name = os.path.relpath(path, ROOT)
        found = unrowed(open(path, encoding="utf-8").read(), table)
        extra = collections.Counter(number for _, number in found) - collections.Counter(debt.get(name, {}))
        if extra:
            over[name] = [f"line {line}: {number}" for line, number in found if number in extra]
    assert not over, ("numbers without a results row or a label (docs/tests.md, 'Numbers in the docs'): "
                      f"{json.dumps(over, indent=1)}")
