"""The docs stay reference pages: short, dated nowhere, and every figure they show is committed.

A page that grows past 4,000 words or gains a date, a session or an issue number has turned back into a
lab notebook; its history belongs in `benchmarks/results/<script>.md`, which the page links once.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in ROOT.glob("*.py") if (ROOT / "docs" / f"{p.stem}.md").exists())
PAGES = [ROOT / "docs" / f"{s}.md" for s in SCRIPTS]
MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
DATED = [
    re.compile(r"\b(19|20)\d\d-\d\d-\d\d\b"),  # 2026-11-21
    re.compile(rf"\b({MONTHS}) \d{{1,2}}\b"),  # November 21
    re.compile(rf"\b\d{{1,2}} ({MONTHS})\b"),  # 21 November
    re.compile(r"\b[Ii]ssues? \d+"),  # issue 17, issues 15–17
    re.compile(r"\b(first|second|third|fourth|this|last|earlier) session\b", re.IGNORECASE),
]


def words(text: str) -> int:
    return len(text.split())


def test_every_script_has_a_page():
    assert len(SCRIPTS) == 7, SCRIPTS


@pytest.mark.parametrize("page", PAGES, ids=SCRIPTS)
def test_page_is_under_4000_words(page):
    assert words(page.read_text()) <= 4000


@pytest.mark.parametrize("page", PAGES, ids=SCRIPTS)
def test_page_has_no_dates_sessions_or_issue_numbers(page):
    hits = [m.group(0) for rx in DATED for m in rx.finditer(page.read_text())]
    assert hits == []


@pytest.mark.parametrize("page", PAGES, ids=SCRIPTS)
def test_page_has_the_reference_sections_in_order(page):
    heads = re.findall(r"^## (.+)$", page.read_text(), re.MULTILINE)
    want = ["Overview", "Usage", "Files", "Logged metrics", "Implementation details", "Results"]
    found = [next((i for i, h in enumerate(heads) if h.startswith(w)), -1) for w in want]
    assert -1 not in found, f"missing sections: {[w for w, i in zip(want, found) if i < 0]}"
    assert found == sorted(found), heads
    assert any(h.startswith("Known limitations") for h in heads[found[-1] :])


@pytest.mark.parametrize("page", PAGES, ids=SCRIPTS)
def test_page_links_its_history_once(page):
    history = f"benchmarks/results/{page.stem}.md"
    assert (ROOT / history).exists()
    assert len(re.findall(rf"\]\((\.\./)?{re.escape(history)}\)", page.read_text())) == 1


# every Markdown file a reader may open: the README, the docs and the records (results histories, runs' READMEs)
MARKDOWN = sorted({*ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md"), *(ROOT / "benchmarks").rglob("*.md")})


@pytest.mark.parametrize("page", MARKDOWN, ids=[str(p.relative_to(ROOT)) for p in MARKDOWN])
def test_images_and_local_links_exist(page):
    for target in re.findall(r"\]\(([^)#\s]+)\)", page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (page.parent / target).exists(), f"{page.name} links to a missing {target}"


def test_readme_table_cells_are_short():
    """One line per script; Status and Headline <= 15 words, as CleanRL's table reads."""
    rows = [r for r in (ROOT / "README.md").read_text().splitlines() if r.startswith("| [`")]
    assert len(rows) == 7
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for cell in cells[1:]:
            assert words(re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", cell)) <= 15, cell


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md"], ids=[*SCRIPTS, "README"])
def test_code_blocks_copy_as_they_are(page):
    """A fence indented inside a list item copies with its indentation (IndentationError in Python)."""
    indented = [line for line in page.read_text().splitlines() if re.match(r"^\s+```", line)]
    assert indented == []


# A quick command is timed where it is shown: a comment "# ... ≤ N min on a [loaded ]2-core CPU ..." right above
# it in its code block, and a line of benchmarks/results/quick_commands.jsonl that ran exactly that command to the
# end (exit 0) within N minutes and within the 10 minutes a quick command may take.
TIMED = re.compile(r"^#.*≤ (\d+) min on a (loaded )?2-core CPU")
QUICK_RECORDS = ROOT / "benchmarks" / "results" / "quick_commands.jsonl"


def timed_commands(text: str) -> list[tuple[int, str]]:
    """(the minutes stated, the command below them as one line) for each timed command of a page's code blocks."""
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if m := TIMED.match(line.strip()):
            j = i + 1
            while lines[j].lstrip().startswith("#"):
                j += 1
            command = lines[j]
            while command.endswith("\\"):
                j += 1
                command = command[:-1] + " " + lines[j]
            found.append((int(m.group(1)), " ".join(command.split())))
    return found


def quick_records() -> dict[str, dict]:
    """The latest record of each command in quick_commands.jsonl."""
    records = [json.loads(x) for x in QUICK_RECORDS.read_text().splitlines() if x.strip()]
    return {" ".join(r["command"].split()): r for r in records}


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md"], ids=[*SCRIPTS, "README"])
def test_quick_command_is_timed_beside_it(page):
    timed, records = timed_commands(page.read_text()), quick_records()
    assert timed, f"{page.name}: no quick command with '# ... ≤ N min on a 2-core CPU ...' above it"
    for minutes, command in timed:
        assert command in records, f"{page.name}: no record in quick_commands.jsonl of: {command}"
        record = records[command]
        assert record["exit_code"] == 0 and not record["timed_out"], record
        assert record["wall_s"] <= 60 * minutes <= 600, (minutes, record["wall_s"])


def test_timed_commands_are_read_as_a_user_copies_them():
    page = (
        "```bash\n# a quick run (≤ 7 min on a 2-core CPU, measured while other jobs ran)\n# (more words)\n"
        "python x.py --a 1 \\\n    --b 2\n```\n# ≤ 3 min on a 2-core CPU\nbash y.sh quick\n"
    )
    assert timed_commands(page) == [(7, "python x.py --a 1 --b 2"), (3, "bash y.sh quick")]
