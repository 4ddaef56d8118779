#!/usr/bin/env python3
"""Every document stays inside the repository.

Fails, naming file, line and target, when
  - a Markdown link or image (inline `[t](x)`, reference `[t]: x`, autolink `<x>`) in any
    Markdown file of the repository (README.md, CHANGELOG.md, docs/**/*.md, ...) points to a
    file that does not exist, to a path outside the repository, to an absolute path, to a
    `file:` URL or to a http(s) URL on this machine (localhost, 127.x, 0.0.0.0, [::1]);
  - a link's `#anchor` names no heading of the Markdown file it points to (GitHub's slugs);
  - any Markdown text, CMakeLists.txt or *.cmake file mentions `../shared` or an absolute path
    under /work (a development machine's layout, not the repository's).
Code blocks and code spans are not links, but they are text: the path rule covers them.

Usage: check_links.py SOURCE_DIR
"""

import os
import re
import sys
import unicodedata
from urllib.parse import unquote, urlsplit

SKIP_DIRS = {".git", "out", "__pycache__"}
FORBIDDEN_TEXT = [
    (re.compile(r"\.\./shared\b"), "names ../shared, a folder outside the repository"),
    (re.compile(r"(?<![\w.~-])/work(?![\w-])"), "names an absolute path under /work"),
]
LOCAL_HOSTS = re.compile(r"^(localhost|127\.\d+\.\d+\.\d+|0\.0\.0\.0|\[::1\])$", re.I)


def repository_files(root):
    """(Markdown files, CMake files) under root, build trees and out/ left out."""
    markdown, cmake = [], []
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")
                         and not (rel == "." and d.startswith(".") and d != ".ci"))
        for name in sorted(files):
            path = os.path.join(folder, name)
            if name.endswith(".md"):
                markdown.append(path)
            elif name == "CMakeLists.txt" or name.endswith(".cmake"):
                cmake.append(path)
    return markdown, cmake


def prose_lines(text):
    """(line number, line) outside fenced code blocks, with code spans blanked."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        opening = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if fence is None and opening:
            fence = opening.group(1)
            continue
        if fence is not None:
            if re.match(r"^\s{0,3}" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$", line):
                fence = None
            continue
        yield number, re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: " " * len(m.group(0)), line)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found, seen = set(), {}
        text = open(path, encoding="utf-8").read()
        for _, line in prose_lines(text):
            m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                base = slug(m.group(1))
                count = seen.get(base, 0)
                seen[base] = count + 1
                found.add(base if count == 0 else f"{base}-{count}")
        # Headings' code spans were blanked by prose_lines; take them from the raw text too.
        for m in re.finditer(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
            found.add(slug(m.group(1)))
        found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
        cache[path] = found
    return cache[path]


def link_targets(text):
    """(line number, target) of every link in text's prose."""
    for number, line in prose_lines(text):
        for m in re.finditer(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)", line):
            yield number, m.group(1)
        m = re.match(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", line)
        if m:
            yield number, m.group(1)
        for m in re.finditer(r"<((?:https?|file|ftp)://[^>\s]+)>", line):
            yield number, m.group(1)


def check_link(root, md_path, target):
    """None when target is fine, else what is wrong with it."""
    if not target:
        return "empty link target"
    parts = urlsplit(target)
    if parts.scheme in ("http", "https"):
        host = parts.hostname or ""
        if LOCAL_HOSTS.match(host) or LOCAL_HOSTS.match(f"[{host}]"):
            return "points to this machine, not to a public address"
        return None
    if parts.scheme == "mailto":
        return None
    if parts.scheme:
        return f"'{parts.scheme}:' links are not allowed (a repository path or http(s) only)"
    path, _, fragment = target.partition("#")
    path = unquote(path)
    if path.startswith("/") or path.startswith("~"):
        return "absolute path: link relative to the Markdown file instead"
    dest = os.path.normpath(os.path.join(os.path.dirname(md_path), path)) if path else md_path
    real_root = os.path.realpath(root)
    if os.path.commonpath([os.path.realpath(dest), real_root]) != real_root:
        return "points outside the repository"
    if not os.path.exists(dest):
        return f"no such file: {os.path.relpath(dest, root)}"
    if fragment and dest.endswith(".md") and unquote(fragment) not in anchors(dest):
        return f"no heading with anchor #{fragment} in {os.path.relpath(dest, root)}"
    return None


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = os.path.abspath(sys.argv[1])
    markdown, cmake = repository_files(root)
    problems, links = [], 0
    for path in markdown:
        text = open(path, encoding="utf-8").read()
        for number, target in link_targets(text):
            links += 1
            why = check_link(root, path, target)
            if why:
                problems.append(f"{os.path.relpath(path, root)}:{number}: link '{target}': {why}")
    for path in markdown + cmake:
        for number, line in enumerate(open(path, encoding="utf-8").read().split("\n"), 1):
            for pattern, why in FORBIDDEN_TEXT:
                if pattern.search(line):
                    problems.append(f"{os.path.relpath(path, root)}:{number}: {why}: {line.strip()}")
    for p in problems:
        print(p)
    print(f"check_links: {len(markdown)} Markdown files, {links} links, {len(cmake)} CMake files: "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
