"""The line span of every top-level statement of a script, and its section, for the tables of
benchmarks/results/reading_targets_accounting.md.

Usage: python benchmarks/reading_spans.py SCRIPT.py
Prints one tab-separated row per statement: section (algo: above the `# ---- run management ----` marker, run:
below it), first line, last line, number of lines, name. A span starts at the statement's first decorator or at the
comment lines right above it, and ends where the next top-level statement (or its decorators) starts, so it
includes the blank lines that follow; the spans of one section add up to the section.
"""

import ast
import re
import sys


def spans(path: str) -> list[tuple[str, int, int, str]]:
    text = open(path).read()
    lines, body = text.splitlines(), ast.parse(text).body
    marker = next(i + 1 for i, line in enumerate(lines) if re.match(r"^# *-+ *run management", line))

    def start(node) -> int:
        return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])

    rows = []
    for k, node in enumerate(body):
        first = start(node)
        while first > 1 and lines[first - 2].startswith("#") and first - 1 != marker:
            first -= 1
        end = start(body[k + 1]) - 1 if k + 1 < len(body) else len(lines)
        if isinstance(node, ast.Assign):
            name = ast.unparse(node.targets[0])
        else:
            name = getattr(node, "name", None) or type(node).__name__
        rows.append(("run" if first > marker else "algo", first, end, name))
    return rows


if __name__ == "__main__":
    for section, first, end, name in spans(sys.argv[1]):
        print(f"{section}\t{first}\t{end}\t{end - first + 1}\t{name}")
