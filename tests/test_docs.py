"""The documents a reader follows stay true to the repository: links resolve, the bench summary quotes its sections.

Every relative link and image in README.md, docs/*.md, bench/README.md and examples/README.md must name a file or
folder of the repository, and a ``#fragment`` a heading of its target (GitHub's anchors: the heading's text in
lower case, punctuation dropped, spaces as hyphens, ``-1``, ``-2`` for repeats). Links to other sites are not
fetched (tests make no network traffic). Text inside fenced code blocks is neither a link nor a heading.

bench/README.md opens with a summary table, one row per benchmark's current figure. Each row links to the
section that holds the measurement, and every number in its figure column must appear in that section (the
heading's own text up to the next heading of the same or a higher level), so a summary row cannot drift from the
record it summarises. The README's results tables are held the same way to the bench sections their rows link to
(ratios, final and best periodic evaluations). A number can also occur in a section by chance, so this catches a
figure that is nowhere in its record, not every mistyped digit.
"""

from __future__ import annotations

import functools
import pathlib
import re
import unicodedata

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = sorted(
    [ROOT / "README.md", ROOT / "bench" / "README.md", ROOT / "examples" / "README.md", *(ROOT / "docs").glob("*.md")]
)
BENCH = ROOT / "bench" / "README.md"
SUMMARY_HEADING = "Summary: the current figure of each benchmark"

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target); a target has no spaces (an optional "title" after a space is dropped).
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its rendered text lower-cased, punctuation and symbols dropped, spaces as
    hyphens (runs of them are kept, as GitHub keeps them)."""
    text = _INLINE_LINK.sub(r"\1", heading).lower()
    kept = "".join(
        c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN" or unicodedata.category(c) in ("Mn", "Mc")
    )
    return kept.replace(" ", "-")


@functools.cache
def headings(text: str) -> list[tuple[int, int, str, str]]:
    """(line number, level, text, anchor) of every heading, anchors numbered for repeats as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = []
    for number, line in prose_lines(text):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.append((number, len(m.group(1)), m.group(2), base if count == 0 else f"{base}-{count}"))
    return out


def section(text: str, anchor: str) -> str:
    """The text under the heading of that anchor, down to the next heading of the same or a higher level."""
    lines = text.splitlines()
    found = headings(text)
    for i, (number, level, _, a) in enumerate(found):
        if a == anchor:
            end = next((n for n, lv, _, _ in found[i + 1 :] if lv <= level), len(lines) + 1)
            return "\n".join(lines[number - 1 : end - 1])
    raise KeyError(anchor)


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link and image outside code blocks; inline code spans are skipped."""
    out = []
    for number, line in prose_lines(text):
        for m in _LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            out.append((number, m.group(1)))
    return out


def broken_links(doc: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    text = doc.read_text(encoding="utf-8")
    bad = []
    for number, target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ... another site, not fetched
            continue
        path_part, _, fragment = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        where = f"{doc.relative_to(root)}:{number}: {target}"
        if not dest.exists():
            bad.append(f"{where} (no such file)")
            continue
        if root not in dest.parents and dest != root:
            bad.append(f"{where} (outside the repository)")
            continue
        if fragment:
            if dest.suffix != ".md":
                bad.append(f"{where} (a fragment of a file that is not markdown)")
            elif fragment not in {a for _, _, _, a in headings(dest.read_text(encoding="utf-8"))}:
                bad.append(f"{where} (no heading with that anchor in {dest.relative_to(root)})")
    return bad


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(doc: pathlib.Path) -> None:
    assert not broken_links(doc), "links that resolve to nothing:\n" + "\n".join(broken_links(doc))


def tables(text: str) -> list[list[dict[str, str]]]:
    """Every table of the text outside code blocks, each a list of rows as {column: cell}."""
    out: list[list[dict[str, str]]] = []
    block: list[list[str]] = []
    for _, line in [*prose_lines(text), (0, "")]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if len(block) > 2:
            out.append([dict(zip(block[0], row, strict=True)) for row in block[2:]])
        block = []
    return out


def unquoted_figures(
    doc: pathlib.Path, rows: list[dict[str, str]], name: str, figures: list[str], record: str
) -> list[str]:
    """What is wrong with rows whose `record` cell links (first link) to a section that must hold every number of
    their `figures` cells: a missing link, a missing heading, a figure without numbers, a number not in the section."""
    problems = []
    for row in rows:
        targets = [t for _, t in links(row[record])]
        if not targets:
            problems.append(f"{row[name]}: its {record} cell links to no section")
            continue
        path_part, _, anchor = targets[0].partition("#")
        target = (doc.parent / path_part).resolve() if path_part else doc
        text = target.read_text(encoding="utf-8")
        if anchor not in {a for _, _, _, a in headings(text)}:
            problems.append(f"{row[name]}: links to {targets[0]}, no such heading")
            continue
        body = section(text, anchor)
        numbers = [n for column in figures for n in _NUMBER.findall(row[column])]
        if not numbers:
            problems.append(f"{row[name]}: its {'/'.join(figures)} quotes no number")
        problems += [f"{row[name]}: {n} is not in {targets[0]}" for n in numbers if n not in body]
    return problems


def test_bench_summary_rows_point_at_sections_that_hold_their_figures() -> None:
    summary = section(BENCH.read_text(encoding="utf-8"), slug(SUMMARY_HEADING))
    rows = tables(summary)[0]
    assert len(rows) >= 10
    assert all(links(row["details"])[0][1].startswith("#") for row in rows), "the summary links into its own file"
    problems = unquoted_figures(BENCH, rows, "what", ["figure"], "details")
    assert not problems, "\n".join(problems)


def test_readme_results_quote_the_sections_they_link() -> None:
    """The README's speed and learning tables: each row's ratio, final and best periodic figures are in the
    bench/README.md section its record cell links to (env frames and wall times may come from the run's files)."""
    readme = ROOT / "README.md"
    results = section(readme.read_text(encoding="utf-8"), "results")
    speed, learning = tables(results)
    problems = unquoted_figures(readme, speed, "what", ["ratio"], "record")
    problems += unquoted_figures(readme, learning, "agent (preset)", ["final", "best periodic"], "record")
    assert len(speed) >= 3 and len(learning) >= 10
    assert not problems, "\n".join(problems)


def test_the_checks_catch_what_they_are_for(tmp_path: pathlib.Path) -> None:
    # The anchors GitHub makes for headings like the bench's, and a repeat numbered.
    text = "# A `b.py`: c–d (e, 2026-11-27)\n```\n# not a heading\n```\n## X ≥ 0.9\n## X ≥ 0.9\n"
    assert [a for *_, a in headings(text)] == ["a-bpy-cd-e-2026-11-27", "x--09", "x--09-1"]
    assert section(text, "x--09") == "## X ≥ 0.9"
    root = tmp_path.resolve()
    (root / "there.md").write_text("# Y\n", encoding="utf-8")
    doc = root / "d.md"
    doc.write_text(
        "[ok](#x) [ok](there.md#y) ![ok](there.md) `[code](nowhere.md)`\n"
        "[gone](missing.md) [bad](#y) [bad](there.md#x) [out](../x.md) [site](https://example.org/a#b)\n# X\n",
        encoding="utf-8",
    )
    assert [b.split(" (")[0] for b in broken_links(doc, root)] == [
        "d.md:2: missing.md",
        "d.md:2: #y",
        "d.md:2: there.md#x",
        "d.md:2: ../x.md",
    ]
