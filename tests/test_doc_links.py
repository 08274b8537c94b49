"""Every relative link of the pages (README.md, DESIGN.md, docs/*.md, lab/*.md) resolves: its file exists and its
#anchor is a heading of that page, spelled as GitHub spells it (issue 62: pages and figures moved between docs/ and
lab/ keep their links)."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^)\s]+)\)")  # a markdown link's target (an image's too)


def anchor(heading):
    """GitHub's anchor of a heading's text: its visible words lowercased, punctuation but '-' and '_' dropped, each
    space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.replace("`", ""))
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text):
    """The anchors of a markdown text's headings (outside code blocks); a repeated one gets -1, -2, ..., as on
    GitHub."""
    found, seen = set(), {}
    for line in re.sub(r"```.*?```", "", text, flags=re.S).splitlines():
        heading = re.match(r"#{1,6} (.*?)\s*$", line)
        if heading:
            name = anchor(heading.group(1))
            found.add(f"{name}-{seen[name]}" if name in seen else name)
            seen[name] = seen.get(name, 0) + 1
    return found


def broken_links(path):
    """["line N: target (why)"] of the relative links of one markdown file (outside code blocks and code spans)."""
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"```.*?```", lambda match: "\n" * match.group().count("\n"), text, flags=re.S)
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            name, _, part = target.partition("#")
            where = os.path.normpath(os.path.join(os.path.dirname(path), name)) if name else path
            if not os.path.exists(where):
                out.append(f"line {number}: {target} (no such file)")
            elif part and part not in anchors(open(where, encoding="utf-8").read() if where.endswith(".md") else ""):
                out.append(f"line {number}: {target} (no such heading)")
    return out


def test_a_heading_gets_githubs_anchor():
    assert anchor("GRPO vs AR vs Lopti vs AR+Lopti on the same hard prompts (5 seeds)") == \
        "grpo-vs-ar-vs-lopti-vs-arlopti-on-the-same-hard-prompts-5-seeds"
    assert anchor("5-7. Lopti's token weights and gradients per probability quartile") == \
        "5-7-loptis-token-weights-and-gradients-per-probability-quartile"
    assert anchor("SoftmaxGRPO vs GRPO on many hard prompts (`python -m lab.compare --preset countdown3`)") == \
        "softmaxgrpo-vs-grpo-on-many-hard-prompts-python--m-labcompare---preset-countdown3"
    assert anchors("# A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1"}


def test_a_link_to_a_missing_file_or_heading_is_found(tmp_path):
    (tmp_path / "b.md").write_text("# Here\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#here) [gone](c.md) [wrong](b.md#there) `[code](d.md)` [web](https://x.org/y)\n")
    assert broken_links(str(page)) == ["line 1: c.md (no such file)", "line 1: b.md#there (no such heading)"]


def test_every_relative_link_of_the_pages_resolves():
    pages = [os.path.join(ROOT, name) for name in ("README.md", "DESIGN.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "*.md")) + glob.glob(os.path.join(ROOT, "lab", "*.md")))
    broken = {os.path.relpath(page, ROOT): found for page in pages if (found := broken_links(page))}
    assert not broken, broken
