"""The numbers derived from the shipped rows (means ± SE, paired differences with their 95% intervals) are the tools'
printouts: each tool that reads the rows runs here, and every "m ± se" and "m [low, high]" of the docs' blocks that
quote it is one of the printed ones (issue 76: byte-identical by hand until then, untested)."""
import contextlib
import io
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AMD = "AMD EPYC, avx512"
# (the tool's module and arguments, [(doc, the heading, list item or table row that opens a block quoting it)])
QUOTES = [
    (("headline", "--machine", AMD), [("docs/results.md", "## SoftmaxGRPO vs GRPO on many hard prompts"),
                                      ("README.md", "- **SoftmaxGRPO − GRPO**")]),
    (("summary", "countdown3-lopti", "--machine", AMD), [("docs/results.md", "### GRPO vs AR vs Lopti vs AR+Lopti"),
                                                         ("README.md", "- **AR + Lopti − GRPO**")]),
    (("summary", "countdown", "--machine", "AMD EPYC, avx2"), [("docs/results.md",
                                                                "- **compare.py --preset countdown**")]),
    (("referee_tuning", "--shipped", AMD), [("lab/referees.md", "### 1. The same tuning grid"),
                                            ("lab/referees.md", "| 1 |")]),
    (("referee_clipping", "--shipped", AMD), [("lab/referees.md", "### 2. Clipping"), ("lab/referees.md", "| 2 |")]),
    (("referee_table3", "--shipped", AMD), [("lab/referees.md", "### 3. Table 3"), ("lab/referees.md", "| 3 |")]),
]
SIGNED = r"[+\-]?\d+\.\d+"
TRIPLE = re.compile(rf"({SIGNED})(?: (?:±|\+-) \d+\.\d+)? \[(?:95% interval )?({SIGNED}), ({SIGNED})\]")
PAIR = re.compile(rf"({SIGNED}) (?:±|\+-) (\d+\.\d+)")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*(\[`])")  # the number rule's sentences (test_doc_numbers)
TYPED = ("typed", "estimated", "inferred")  # a sentence so labelled answers for its numbers itself


def derived(text):
    """The set of "m ± se" pairs and "m [low, high]" triples of a text, as strings ("−" read as "-", "+" dropped),
    leaving out the sentences that say they are typed, estimated or inferred."""
    text = " ".join(sentence for sentence in SENTENCE_END.split(text.replace("−", "-"))
                    if not any(label in sentence.lower() for label in TYPED))

    def plain(*numbers):
        return tuple(number.lstrip("+") for number in numbers)
    return {plain(*match) for match in TRIPLE.findall(text)} | {plain(*match) for match in PAIR.findall(text)}


def block(doc, opening):
    """The lines of `doc` from the one that starts with `opening` to the next heading (a heading), the next list
    item or blank line (a list item) or the line's end (a table row)."""
    lines = open(os.path.join(ROOT, doc), encoding="utf-8").read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(opening))
    end = start + 1
    while end < len(lines) and not (lines[end].startswith("#") if opening.startswith("#") else opening.startswith(
            "|") or not lines[end].strip() or lines[end].startswith(("- ", "#"))):
        end += 1
    return "\n".join(lines[start:end])


@pytest.fixture(scope="module")
def printouts(tmp_path_factory):
    """{tool arguments: its printout}, each tool run in this process with its figure drawn into a temporary folder."""
    import importlib
    out, folder = {}, tmp_path_factory.mktemp("figures")
    for arguments, _ in QUOTES:
        module = importlib.import_module(f"lab.{arguments[0]}")
        previous = getattr(module, "FIGURE", None)
        module.FIGURE = str(folder / f"{arguments[0]}.png")
        text = io.StringIO()
        try:
            with contextlib.redirect_stdout(text):
                module.main([*arguments[1:], *(["--figure", module.FIGURE] if arguments[0] == "headline" else [])])
        finally:
            module.FIGURE = previous
        out[arguments] = text.getvalue()
    return out


@pytest.mark.parametrize("arguments, quotes", QUOTES, ids=[" ".join(arguments[:2]) for arguments, _ in QUOTES])
def test_every_derived_number_a_doc_quotes_is_its_tools_printout(printouts, arguments, quotes):
    printed = derived(printouts[arguments])
    assert printed, f"python -m lab.{' '.join(arguments)} printed no derived number"
    for doc, opening in quotes:
        quoted = derived(block(doc, opening))
        assert quoted, f"{doc}: the block opening {opening!r} quotes no derived number"
        assert not quoted - printed, (f"{doc}, the block opening {opening!r}: not printed by python -m "
                                      f"lab.{' '.join(arguments)}: {sorted(quoted - printed)}")


def test_the_reader_takes_the_docs_typography_and_the_tools():
    assert derived("−0.018 [95% interval −0.038, +0.002]; 0.557 ± 0.036") == {("-0.018", "-0.038", "0.002"),
                                                                            ("0.557", "0.036")}
    assert derived("| -0.018 [-0.038, +0.002] none resolved | 0.557 +- 0.036 |") == derived("−0.018 [−0.038, "
                                                                                         "+0.002], 0.557 ± 0.036")
    assert derived("Q2 -0.040 ± 0.013 [-0.076, -0.003]") == {("-0.040", "0.013"), ("-0.040", "-0.076", "-0.003")}
    assert derived("It rose +0.133 [−0.092, +0.359]. Typed: +0.5 [+0.1, +0.9].") == {("0.133", "-0.092", "0.359")}


def labelled_numbers(doc):
    """[(line, sentence, its block, its section)] of the sentences of a doc that say "from the shipped rows" (and
    not typed, estimated or inferred), each with the decimals the number rule reads in it (test_doc_numbers)."""
    from tests import test_doc_numbers as rule
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group().count("\n"), open(os.path.join(ROOT, doc)).read(), flags=re.S)
    out = []
    for start, lines in rule.sections(text):
        for line, text_block in rule.blocks(lines, start):
            for sentence in [text_block] if text_block.startswith("|") else rule.SENTENCE_END.split(text_block):
                if "from the shipped rows" in sentence.lower() and not any(x in sentence.lower() for x in TYPED):
                    plain = re.sub(r"`[^`]*`|\]\([^)]*\)|https?://\S+", " ", sentence)
                    numbers = [m[1] for m in rule.NUMBER.finditer(plain)
                               if not rule.NOT_A_CLAIM.search(plain[max(0, m.start() - 16):m.start()])]
                    out.append((line, sentence, text_block, "\n".join(lines), numbers))
    return out


def named(arguments):
    """How a doc names a tool of QUOTES: lab.headline, lab.summary PRESET, lab.referee_tuning."""
    return f"lab.{arguments[0]}" + (f" {arguments[1]}" if arguments[0] == "summary" else "")


def test_every_number_a_label_says_comes_from_the_rows_is_its_tools_or_its_rows(printouts):
    # issue 82 (U3): "from the shipped rows" exempted ~170 decimals that no test checked; each is now, at its printed
    # precision, printed by the tool whose block quotes it (QUOTES) or that its block or section names, or a row value
    # its block or section cites (the number rule's); else label it typed with its source
    from tests import test_doc_numbers as rule
    table = rule.result_rows()
    printed = {arguments: [float(x) for x in re.findall(r"\d+\.\d+", text)] for arguments, text in printouts.items()}
    missing = []
    for doc in ("README.md", "docs/results.md", "docs/performance.md", "lab/referees.md"):
        for line, sentence, text_block, section, numbers in labelled_numbers(doc):
            flat = " ".join(sentence.split())
            tools = [arguments for arguments, quotes in QUOTES if any(
                flat in " ".join(block(d, opening).split()) for d, opening in quotes if d == doc)] or [
                arguments for arguments in printed if named(arguments) in " ".join((text_block + section).split())]
            values = []
            for number in numbers:
                digits = len(number.split(".")[1])
                if float(number) not in {round(v, digits) for v in values + [x for t in tools for x in printed[t]]}:
                    missing.append(f"{doc}:{line}: {number}" + ("" if tools else " (its block names no tool)"))
    assert not missing, "labelled from the shipped rows, printed by no tool (label it typed, with its source):\n" + "\n".join(missing)
