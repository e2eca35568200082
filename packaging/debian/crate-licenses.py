#!/usr/bin/env python3
"""The Rust crates compiled into the shipped binaries, and their licenses.

Reads `cargo metadata --format-version 1` (for one target platform) on
stdin and prints, for MODE:

  copyright  one DEP-5 `Files:` paragraph per crate, for debian/copyright
  spdx       the SPDX expression of the whole package (the RPM License:
             tag): every license term of our code and of those crates,
             joined with AND, as Fedora's Rust guidelines combine them

The crates are those the PACKAGEs reach through normal dependencies (what
the build compiles and links; proc macros included, since the code they
write is compiled in), not dev- or build-dependencies. cargo metadata
resolves features for the whole workspace, so a crate that only another
member's feature pulls in may be listed too: a license too many, never one
too few.

packaging/build-packages.sh licenses writes both into debian/copyright and
the spec; packaging/check-packages.sh fails while they differ from this.

usage: crate-licenses.py copyright|spdx PACKAGE...
"""

import json
import re
import sys


def linked_packages(metadata, roots):
    """The packages the roots reach by normal dependencies, roots included."""
    packages = {p["id"]: p for p in metadata["packages"]}
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    wanted = [i for i in metadata["workspace_members"] if packages[i]["name"] in roots]
    missing = set(roots) - {packages[i]["name"] for i in wanted}
    if missing:
        sys.exit(f"crate-licenses: no workspace member named {', '.join(sorted(missing))}")
    seen = set()
    while wanted:
        current = wanted.pop()
        if current in seen:
            continue
        seen.add(current)
        for dep in nodes[current]["deps"]:
            if any(kind["kind"] is None for kind in dep["dep_kinds"]):
                wanted.append(dep["pkg"])
    return [packages[i] for i in seen]


# --- SPDX expressions ------------------------------------------------------

TOKEN = re.compile(r"\(|\)|[^\s()]+")


def parse(expression):
    """An SPDX expression as nested ("or"|"and", [...]) and ("license", text)
    nodes; the old "MIT/Apache-2.0" form reads as OR."""
    tokens = TOKEN.findall(expression.replace("/", " OR "))
    node, rest = parse_or(tokens)
    if rest:
        raise ValueError(f"cannot read the license expression {expression!r}")
    return node


def parse_or(tokens):
    node, tokens = parse_and(tokens)
    terms = [node]
    while tokens and tokens[0].upper() == "OR":
        node, tokens = parse_and(tokens[1:])
        terms.append(node)
    return (("or", terms) if len(terms) > 1 else terms[0]), tokens


def parse_and(tokens):
    node, tokens = parse_license(tokens)
    terms = [node]
    while tokens and tokens[0].upper() == "AND":
        node, tokens = parse_license(tokens[1:])
        terms.append(node)
    return (("and", terms) if len(terms) > 1 else terms[0]), tokens


def parse_license(tokens):
    if not tokens:
        raise ValueError("a license expression ends too early")
    if tokens[0] == "(":
        node, tokens = parse_or(tokens[1:])
        if not tokens or tokens[0] != ")":
            raise ValueError("a license expression lacks a closing parenthesis")
        return node, tokens[1:]
    name, tokens = tokens[0], tokens[1:]
    if tokens and tokens[0].upper() == "WITH":
        name, tokens = f"{name} WITH {tokens[1]}", tokens[2:]
    return ("license", name), tokens


def clauses(node):
    """The expression as AND of ORs: a sorted tuple of alternatives per
    clause, so that "MIT OR Apache-2.0" and "Apache-2.0 OR MIT" are one."""
    kind, value = node
    if kind == "license":
        return [(value,)]
    if kind == "and":
        return [c for term in value for c in clauses(term)]
    combined = [()]
    for term in value:
        combined = [a + b for a in combined for b in clauses(term)]
    return [tuple(sorted(set(c))) for c in combined]


def spdx(own, linked):
    """One SPDX expression: our own clauses first, then the crates' other
    clauses, single licenses before choices."""
    rest = sorted(set(linked) - set(own), key=lambda c: (len(c) > 1, c))
    words = [" OR ".join(c) for c in list(dict.fromkeys(own)) + rest]
    if len(words) > 1:
        words = [f"({w})" if " OR " in w else w for w in words]
    return " AND ".join(words)


def dep5_license(expression):
    """DEP-5's way of writing it: lower-case operators, "with X exception",
    and a comma before "and" where a clause is a choice (DEP-5 has no
    parentheses; the comma binds loosest)."""
    parts = []
    for clause in clauses(parse(expression)):
        names = [re.sub(r" WITH (\S+?)(-exception)?$", r" with \1 exception", n) for n in clause]
        parts.append(" or ".join(names))
    joiner = ", and " if any(" or " in p for p in parts) else " and "
    return joiner.join(parts)


# --- output ----------------------------------------------------------------


def copyright_paragraph(package):
    """Files: as `cargo vendor --versioned-dirs` lays the crate out."""
    name, version = package["name"], package["version"]
    holders = package.get("authors") or [f"The authors of the {name} crate"]
    if not package.get("license"):
        sys.exit(f"crate-licenses: {name} {version} names no license (license-file only): describe it by hand")
    lines = [f"Files: vendor/{name}-{version}/*", f"Copyright: {holders[0]}"]
    lines += [f" {holder}" for holder in holders[1:]]
    lines.append(f"License: {dep5_license(package['license'])}")
    return "\n".join(lines)


def main(argv):
    if len(argv) < 3 or argv[1] not in ("copyright", "spdx"):
        sys.exit(__doc__.rsplit("usage: ", 1)[1].strip())
    mode, roots = argv[1], argv[2:]
    metadata = json.load(sys.stdin)
    packages = linked_packages(metadata, set(roots))
    ours = {p["id"] for p in packages if p["id"] in metadata["workspace_members"]}
    crates = sorted((p for p in packages if p["id"] not in ours), key=lambda p: (p["name"], p["version"]))
    if mode == "copyright":
        print("\n\n".join(copyright_paragraph(p) for p in crates))
    else:
        own = [c for p in packages if p["id"] in ours for c in clauses(parse(p["license"]))]
        linked = [c for p in crates for c in clauses(parse(p["license"]))]
        print(spdx(own, linked))


if __name__ == "__main__":
    main(sys.argv)
