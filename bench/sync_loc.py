"""Size of the sync stack: lines of non-test code in ``sdk/sync`` and ``store_node/store_sync``.

Issue 28 asks that these go down. Two counts, for the working tree and for a baseline
revision read from git in the same run:

- ``sync_loc.lines``: every line of every tracked ``.py`` file under the two folders;
- ``sync_loc.code``: lines that hold code, as ``cloc`` counts them: not blank, not a
  comment, not part of a docstring (a module's, class's or function's first string).

Each is also printed as a ratio to the baseline (``sync_loc.lines_ratio``,
``sync_loc.code_ratio``, target below 1). ``--files N`` prints the N largest files by
code lines as ``#`` comments.

Usage: ``python bench/sync_loc.py [--baseline REV] [--files N]`` (baseline ``86136b4``,
the commit issue 28 was read from).
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Recorder

FOLDERS = ("sdk/sync", "store_node/store_sync")
_SKIP = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def count(source: str) -> tuple[int, int]:
    """``(lines, code lines)`` of one Python source text."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        first = body[0] if body else None
        if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
            docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _SKIP:
            code.update(n for n in range(token.start[0], token.end[0] + 1) if n not in docstrings)
    return source.count("\n"), len(code)


def tree(rev: str | None) -> dict[str, tuple[int, int]]:
    """Counts per file, for the working tree's tracked files (``rev`` None) or a revision."""
    listing = ["git", "ls-files"] if rev is None else ["git", "ls-tree", "-r", "--name-only", rev]
    names = subprocess.run([*listing, *FOLDERS], check=True, capture_output=True, text=True)
    counts = {}
    for name in names.stdout.split():
        if not name.endswith(".py"):
            continue
        if rev is None:
            source = Path(name).read_text()
        else:
            shown = ["git", "show", f"{rev}:{name}"]
            source = subprocess.run(shown, check=True, capture_output=True, text=True).stdout
        counts[name] = count(source)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="86136b4")
    parser.add_argument("--files", type=int, default=0)
    ns = parser.parse_args()
    record = Recorder("sync_loc")
    now, before = tree(None), tree(ns.baseline)
    for i, name in enumerate(("lines", "code")):
        value, base = sum(c[i] for c in now.values()), sum(c[i] for c in before.values())
        tags = {"baseline": ns.baseline, "baseline_value": base}
        record.record(f"sync_loc.{name}", value, "lines", **tags)
        ratio = round(value / base, 4)
        record.record(f"sync_loc.{name}_ratio", ratio, "ratio", target="< 1", **tags)
    for name, (lines, code) in sorted(now.items(), key=lambda kv: -kv[1][1])[: ns.files]:
        was = before.get(name, (0, 0))[1]
        print(f"# {code:5d} code {lines:5d} lines (was {was:5d} code) {name}")


if __name__ == "__main__":
    main()
