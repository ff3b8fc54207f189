#!/usr/bin/env python3
"""Lists the import circles among the crate's modules.

Every `crate::...` and `super::...` path in a module's code (its unit tests,
after `#[cfg(test)]`, left out) is an arrow from that module to the deepest
module the path names. Modules that reach each other through arrows form a
circle (a strongly connected component, Tarjan's algorithm); each circle of
two or more is printed with its modules, largest first.

    python3 hack/import-circles.py [src]
"""

import os
import re
import sys


def modules(root):
    found = {}
    for d, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(d, f), root)[:-3]
            if rel.endswith("/mod"):
                rel = rel[:-4]
            if rel in ("lib", "main"):
                rel = ""
            found[rel.replace("/", "::")] = os.path.join(d, f)
    return found


def target(mods, here, path):
    parts = path.split("::")
    if parts[0] == "crate":
        base, parts = [], parts[1:]
    else:
        base = here.split("::") if here else []
        while parts and parts[0] == "super":
            base, parts = base[:-1], parts[1:]
    names = base + parts
    for k in range(len(names), 0, -1):
        m = "::".join(names[:k])
        if m in mods:
            return m
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "src"
    mods = modules(root)
    path = re.compile(r"\b((?:crate|super)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
    group = re.compile(r"\buse\s+((?:crate|super)(?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\}", re.S)
    arrows = {m: set() for m in mods}
    for m, file in mods.items():
        text = open(file, encoding="utf-8").read().split("#[cfg(test)]")[0]
        found = [p.group(1) for p in path.finditer(text)]
        for g in group.finditer(text):
            for item in g.group(2).split(","):
                item = item.strip().split(" as ")[0].strip().lstrip("{").strip()
                if item and item != "self":
                    found.append(g.group(1) + "::" + item)
        for p in found:
            t = target(mods, m, p)
            if t is not None and t != m:
                arrows[m].add(t)
    index, low, stack, on, circles, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in arrows[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(arrows):
        if v not in index:
            visit(v)
    for c in sorted(circles, key=len, reverse=True):
        print(f"{len(c)} modules in one circle:")
        for m in c:
            print(f"    {m or '(crate root)'}")
    print(f"{len(circles)} circle(s); the largest has {max((len(c) for c in circles), default=0)} modules")


if __name__ == "__main__":
    main()
