#!/usr/bin/env python3
"""Every relative link in README.md and docs/**/*.md points to an existing file or folder,
and README.md, the front door, stays under 300 lines (dated results live in docs/results/).

usage: scripts/check-doc-links.py [FILE.md ...]   (exit 1 and one line per broken link)
Links are Markdown `[text](target)` and `![alt](target)`; http(s), mailto and pure
`#anchor` targets are skipped, a `#anchor` after a path is dropped, fenced code ignored.
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 300
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def links(path):
    fenced = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                continue
            for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                yield n, m.group(1)


def broken(path):
    for n, target in links(path):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        rel = target.split("#", 1)[0]
        if not os.path.exists(os.path.join(os.path.dirname(path), rel)):
            yield n, target


def main():
    files = sys.argv[1:] or [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    bad, count = 0, 0
    for path in files:
        for n, target in broken(path):
            print(f"{os.path.relpath(path, ROOT)}:{n}: broken link {target}")
            bad += 1
        count += sum(1 for _ in links(path))
    readme = os.path.join(ROOT, "README.md")
    lines = sum(1 for _ in open(readme, encoding="utf-8"))
    if lines >= README_MAX_LINES:
        print(f"README.md: {lines} lines; keep it under {README_MAX_LINES} (move detail to docs/)")
        bad += 1
    print(f"{len(files)} files, {count} links, {bad} problems; README.md {lines} lines")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
