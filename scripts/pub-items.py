#!/usr/bin/env python3
"""The library's `pub` items and whether anything outside the library names them.

Per crate of the workspace (src/ and each crates/*/src). An item is a
declaration under the crate's sources (src/main.rs aside: the binary is a
separate crate) that starts with a bare `pub` (not `pub(crate)` and the
like) and declares a fn (methods included), struct, enum, union, trait,
const, static, type or mod. `pub use` re-exports are not items; `pub` fields
are counted apart (--fields), as they follow their struct.

"Outside" is what uses the crate as a library: the other crates' sources,
tests/, benches/, examples/ and src/main.rs (their code, comments and string literals left out), the
bodies of the library's exported macros (they expand there), and the
documented library API: the ```rust blocks of README.md and docs/*.md
and the code spans of README's "Using the elector as a library" section.
An item counts as named outside when its name occurs there as a whole word
(a module: as a step of a path, `name::`, `::name` or in a `use` group):
a name shared with anything outside (`new`, `run`) keeps the item, so the
figure of items never named is a lower bound.

Usage: scripts/pub-items.py [--list] [--fields]
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ITEM = re.compile(
    r'^\s*pub\s+(?:(?:const|async|unsafe|extern(?:\s+"[^"]*")?)\s+)*'
    r'(fn|struct|enum|union|trait|const|static(?:\s+mut)?|type|mod)\s+(r#)?(\w+)'
)
FIELD = re.compile(r'^\s*pub\s+(r#)?(\w+)\s*:(?!:)')


def strip_code(text):
    """Rust source without comments and string/char literals."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find('"' + m.group(1), m.end())
            i = n if end < 0 else end + 1 + len(m.group(1))
            out.append(' "" ')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append(' "" ')
        elif c == "'" and (m := re.compile(r"'(\\.[^']*|[^\\'])'").match(text, i)):
            i = m.end()
            out.append(" ' ' ")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def crate_sources():
    """The src/ folder of each crate: the `leasehold` package's and each under crates/."""
    return [ROOT / "src", *sorted(p / "src" for p in (ROOT / "crates").iterdir() if (p / "src").is_dir())]


def outside_words(own):
    """The words of what uses the crate whose sources are `own` from outside."""
    texts = []
    for src in crate_sources():
        if src != own:
            texts += [strip_code(p.read_text()) for p in sorted(src.rglob("*.rs"))]
    for folder in ("tests", "benches", "examples"):
        texts += [strip_code(p.read_text()) for p in sorted((ROOT / folder).rglob("*.rs"))]
    texts.append(strip_code((ROOT / "src/main.rs").read_text()))
    # An exported macro's body expands in the crates that call it.
    for path in sorted(own.rglob("*.rs")):
        text = strip_code(path.read_text())
        for m in re.finditer(r"#\[macro_export\]\s*macro_rules!\s*\w+\s*\{", text):
            depth, i = 1, m.end()
            while depth:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            texts.append(text[m.end() : i])
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        texts += re.findall(r"```rust[^\n]*\n(.*?)```", text, re.S)
        if doc.name == "README.md":
            section = text.split("## Using the elector as a library", 1)[1]
            section = re.split(r"^## ", section, maxsplit=1, flags=re.M)[0]
            texts += re.findall(r"`([^`\n]+)`", section)
    text = "\n".join(texts)
    words = set(re.findall(r"\w+", text))
    # A module is named by a path through it: `name::`, `::name`, or a
    # member of a `use` group (`::{name, …}`).
    paths = set(re.findall(r"(\w+)\s*::", text)) | set(re.findall(r"::\s*(\w+)", text))
    for group in re.findall(r"::\s*\{([^;]*?)\}\s*;", text, re.S):
        paths |= set(re.findall(r"\w+", group))
    return words, paths


def declarations(own, pattern, group):
    for path in sorted(own.rglob("*.rs")):
        if path == ROOT / "src/main.rs":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if m := pattern.match(line):
                yield path.relative_to(ROOT), number, m, m.group(group)


def main():
    for own in crate_sources():
        print(f"{own.relative_to(ROOT)}:")
        report(own)


def report(own):
    words, paths = outside_words(own)
    for label, pattern, group in (("items", ITEM, 3), ("fields", FIELD, 2)):
        if label == "fields" and "--fields" not in sys.argv:
            continue
        found = list(declarations(own, pattern, group))
        unnamed = [
            (p, n, m, name)
            for p, n, m, name in found
            if name not in (paths if label == "items" and m.group(1) == "mod" else words)
        ]
        share = 100 * len(unnamed) / len(found) if found else 0
        print(f"  pub {label}: {len(found)}, never named outside: {len(unnamed)} ({share:.0f} %)")
        if "--list" in sys.argv:
            for p, n, m, name in unnamed:
                kind = m.group(1) if label == "items" else "field"
                print(f"    {p}:{n}: {kind} {name}")


if __name__ == "__main__":
    main()
