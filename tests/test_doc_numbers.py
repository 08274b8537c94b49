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
LABELS = ("typed", "estimated", "inferred", "from the shipped rows")  # a sentence saying one answers for its numbers
# where a block's sentences part (not after an abbreviation: "Eq. (2)" is one sentence's)
SENTENCE_END = re.compile(r"(?<=[.!?])(?<!Eq\.)(?<!Fig\.)(?<!e\.g\.)(?<!i\.e\.)(?<!vs\.)\s+(?=[A-Z*(\[`])")
NUMBER = re.compile(r"(?<![\w.^/#-])(\d+\.\d+)(?![\w.]*\w)")  # a decimal, not part of a name, version or path
# what a decimal right after these words is: a reference, a version or a default, not a measured claim
NOT_A_CLAIM = re.compile(r"(arxiv|prop\.|proposition|eq\.|§|section|theorem|lemma|fig\.|figure|table|transformers|"
                         r"torch|torchao|torchvision|verl|python|cuda|version|pin|default)\W{0,3}$"
                         r"|(^|[^\w])(τ|α|η|β|T|p)( =| ≥| ≤)? $", re.I)  # a setting's or an input's value: τ 0.1, p ≥ 0.9
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


def slug(heading):
    """A markdown heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip("# ").lower()).replace(" ", "-")


def results_sections(table):
    """{anchor: the row values docs/results.md's section under that heading cites} (for a link to results.md#anchor)."""
    text = open(os.path.join(ROOT, "docs", "results.md"), encoding="utf-8").read()
    return {slug(lines[0]): cited("\n".join(lines), table, {}) for _, lines in sections(text)
            if lines[0].startswith("#")}


def cited(text, table, anchors):
    """The row values a piece of markdown cites: every row of each results csv it links (results/<name>.csv), of each
    cell it names (a word that is a cell's name, in backquotes or a command), and of each docs/results.md section it
    links by its anchor (results.md#anchor: that section's). A link to results.md without an anchor cites nothing."""
    values = [value for name in set(re.findall(r"results/(\w+\.csv)", text)) for cell in table.get(name, {}).values()
              for value in cell]
    cells = {cell: got for cells in table.values() for cell, got in cells.items()}
    values += [value for word in set(re.findall(r"[\w.+-]+", text)) if word in cells for value in cells[word]]
    return values + [value for anchor in set(re.findall(r"results\.md#([\w-]+)", text))
                     for value in anchors.get(anchor, [])]


def unrowed(text, table, anchors=None):
    """[(line, number)] of the decimals of a markdown text with neither a row nor a label. Each decimal (outside code
    spans, code blocks and link targets, not a reference, version or default: NOT_A_CLAIM) must equal, at its printed
    precision, a row value that its own block (blocks: a paragraph, a list item, a table row) cites, or, where the
    block cites none, that its section cites (cited); or stand in a sentence that says one of LABELS (a label
    answers for its sentence, not its block; a table row is one sentence, a labelled table's header its table's).
    anchors: the values docs/results.md's sections cite, by anchor (results_sections)."""
    found, anchors = [], anchors if anchors is not None else {}
    text = re.sub(r"```.*?```", lambda match: "\n" * match.group().count("\n"), text, flags=re.S)
    for start, lines in sections(text):
        in_section = cited("\n".join(lines), table, anchors)
        for line, block in blocks(lines, start):
            values = cited(block, table, anchors) or in_section
            block = " ".join(sentence for sentence in ([block] if block.startswith("|") else SENTENCE_END.split(block))
                             if not any(label in sentence.lower() for label in LABELS))  # a label: its sentence's
            block = re.sub(r"`[^`]*`|\]\([^)]*\)|https?://\S+", " ", block)
            for match in NUMBER.finditer(block):
                if NOT_A_CLAIM.search(block[max(0, match.start() - 16):match.start()]) or \
                        re.fullmatch(r"\d{4}\.\d{4,5}", match.group(1)):  # an arXiv id
                    continue
                digits = len(match.group(1).split(".")[1])
                if float(match.group(1)) not in {round(value, digits) for value in values}:
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
    # issue 76: a label answers for its sentence, not its block (of 9 README numbers altered, 2 were flagged)
    assert unrowed("## S\nA run gave 0.42 (typed). Another gave 0.43.\n", table) == [(1, "0.43")]
    assert unrowed("## S\nA run gave 0.42. Another gave 0.43 (typed, e.g. by hand).\n", table) == [(1, "0.42")]
    assert unrowed("## S\nRecipe − Eq. (2), typed: 0.42. Fig. 3: 0.43.\n", table) == [(1, "0.43")]


def test_the_number_rule_ties_each_number_to_the_rows_its_block_cites():
    """Issue 70's audit: a README decimal passed if any row anywhere equalled it (a section linking results.md could
    cite every csv: 99 of 101 two-decimal values in [0, 1] passed). Now a block's numbers must be in the rows it
    cites itself (else its section's), a link to results.md cites only the section its anchor names, and a plain
    link to results.md cites nothing."""
    table = {"a.csv": {"cell-a": [0.25]}, "b.csv": {"cell-b": [0.5]}}
    anchors = {"the-a-runs": [0.25]}
    assert unrowed("## R\nSee [results](docs/results.md): 0.5 and 0.25.\n", table) == [(1, "0.5"), (1, "0.25")]
    assert unrowed("## R\n[a](results/a.csv) gave 0.25.\n\n[b](results/b.csv) gave 0.25.\n", table) == [(4, "0.25")]
    assert unrowed("## R\n`cell-b` gave 0.5, not 0.25.\n", table) == [(1, "0.25")]
    assert unrowed("## R\n[there](results.md#the-a-runs): 0.25, 0.5.\n", table, anchors) == [(1, "0.5")]
    assert unrowed("## R\nrows: [a](results/a.csv).\n\nThe same run: 0.25.\n", table) == []  # its section's
    assert unrowed("## R\nτ 0.1, p = 0.5, torchao 0.18: settings, not claims.\n", table) == []
    # the audit's count: of the 101 values 0.00-1.00, a README-style block linking results.md passes none now
    text = "## R\n[results](docs/results.md): " + ", ".join(f"{k / 100:.2f}" for k in range(101)) + ".\n"
    assert len(unrowed(text, result_rows())) == 101


def test_every_number_in_the_docs_has_its_row_or_its_label():
    table, debt = result_rows(), json.load(open(DEBT))
    over = {}
    anchors = results_sections(table)
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md"),
                                                                         os.path.join(ROOT, "lab", "referees.md")]:
        name = os.path.relpath(path, ROOT)
        found = unrowed(open(path, encoding="utf-8").read(), table, anchors)
        counted = collections.Counter(number for _, number in found)
        extra, paid = counted - collections.Counter(debt.get(name, {})), collections.Counter(debt.get(name)) - counted
        if extra:
            over[name] = [f"line {line}: {number}" for line, number in found if number in extra]
        if paid:  # the debt only shrinks: a number that left lowers its count here
            over[name + " (lower in tests/data/unrowed_numbers.json)"] = sorted(paid)
    assert not over, ("numbers without a results row or a label (docs/tests.md, 'Numbers in the docs'): "
                      f"{json.dumps(over, indent=1)}")


def test_docs_tests_md_gives_the_collected_counts():
    # issue 76: the page typed 16 slow tests when there were 18. Its counts are pytest's: the default run's collected
    # and deselected tests, and the slow ones per file (integers escape the number rule, so they are checked here)
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow", "-p",
                           "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    slow, total, default = map(int, re.search(r"(\d+)/(\d+) tests collected \((\d+) deselected\)",
                                              done.stdout).groups())
    per_file = collections.Counter(re.findall(r"^tests/(test_\w+\.py)::", done.stdout, flags=re.M))
    text = open(os.path.join(ROOT, "docs", "tests.md"), encoding="utf-8").read()
    stated = re.search(r"the default run collects (\d+) tests and deselects (\d+)\s+slow ones", text)
    assert stated and (int(stated[1]), int(stated[2])) == (default, slow), (
        f"docs/tests.md: write 'the default run collects {default} tests and deselects {slow} slow ones'")
    paragraph = text[text.index("Checks that take minutes"):text.index("The version floor")]
    listed = {name: int(count) for name, count in re.findall(r"`(test_\w+\.py)`\s+(\d+)", paragraph)}
    assert listed == dict(per_file), f"docs/tests.md's slow tests per file: {dict(sorted(per_file.items()))}"
    assert sum(per_file.values()) == slow and default + slow == total
