#!/usr/bin/env python3
"""Checks that the object files of each module call each other without a
circle: file A "calls" file B when A's object refers to a global symbol B's
defines (nm). One TAP line per directory; on a circle, the files in it and
who calls what. Usage: check_calls.py DIR_WITH_OBJECTS...

With --layers NAME=DIR..., lowest first, it also checks that no object of a
layer refers to a symbol defined in a layer above it (one TAP line more):
the rooms of gateway/ stacked on common/, modeldb/ and planner/, where a
call from a lower room into a higher one is what must never happen.

A call circle between files means no file can be understood, tested or
replaced alone (STYLE.md); callbacks and function pointers (a transport's
vtable, an item's completion) cross such lines without a circle."""

import os
import subprocess
import sys


def symbols(obj):
    out = subprocess.run(["nm", "--defined-only", "-g", obj], capture_output=True, text=True,
                         check=True).stdout
    defined = {ln.split()[-1] for ln in out.splitlines() if ln.strip()}
    out = subprocess.run(["nm", "-u", obj], capture_output=True, text=True, check=True).stdout
    used = {ln.split()[-1] for ln in out.splitlines() if ln.strip()}
    return defined, used


def sccs(nodes, edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
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
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def check(n, d, label_name=None):
    objs = sorted(f for f in os.listdir(d) if f.endswith(".o"))
    name = {f: f[:-len(".c.o")] if f.endswith(".c.o") else f for f in objs}
    info = {f: symbols(os.path.join(d, f)) for f in objs}
    owner = {}
    for f, (defined, _) in info.items():
        for s in defined:
            owner[s] = f
    edges = {f: set() for f in objs}
    why = {}
    for f, (_, used) in info.items():
        for s in used:
            g = owner.get(s)
            if g is not None and g != f:
                edges[f].add(g)
                why.setdefault((f, g), []).append(s)
    circles = [c for c in sccs(objs, edges) if len(c) > 1]
    label = "no call circle between the files of %s" % (label_name or os.path.basename(os.path.normpath(d)))
    if not circles:
        print("ok %d - %s (%d files)" % (n, label, len(objs)))
        return 0
    print("not ok %d - %s" % (n, label))
    for c in circles:
        print("# circle: " + " ".join(name[f] for f in c))
        for f in c:
            for g in sorted(edges[f] & set(c)):
                print("#   %s -> %s: %s" % (name[f], name[g], ", ".join(sorted(why[(f, g)])[:6])))
    return 1


def objects(d):
    return [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".o")]


def check_layers(n, layers):
    """Layers as (name, dir), lowest first: a file may refer only to symbols
    of its own layer or of the layers below it."""
    rank, owner = {}, {}
    info = {}
    for i, (name, d) in enumerate(layers):
        for o in objects(d):
            info[o] = symbols(o)
            rank[o] = i
            for s in info[o][0]:
                owner[s] = o
    bad = {}
    for o, (_, used) in info.items():
        for s in used:
            g = owner.get(s)
            if g is not None and rank[g] > rank[o]:
                bad.setdefault((o, g), []).append(s)
    label = "no call from a lower layer to a higher one (%s)" % " < ".join(n_ for n_, _ in layers)
    if not bad:
        print("ok %d - %s" % (n, label))
        return 0
    print("not ok %d - %s" % (n, label))
    short = lambda o: "%s/%s" % (layers[rank[o]][0], os.path.basename(o)[:-len(".c.o")])
    for (o, g), syms in sorted(bad.items()):
        print("#   %s -> %s: %s" % (short(o), short(g), ", ".join(sorted(syms)[:6])))
    return 1


def main():
    args = sys.argv[1:]
    layered = bool(args) and args[0] == "--layers"
    if layered:
        args = args[1:]
    if not args:
        print("usage: check_calls.py [--layers] [NAME=]DIR...", file=sys.stderr)
        return 2
    layers = [(a.split("=", 1)[0], a.split("=", 1)[1]) if "=" in a else
              (os.path.basename(os.path.normpath(a)), a) for a in args]
    print("1..%d" % (len(layers) + (1 if layered else 0)))
    failed = 0
    for n, (name, d) in enumerate(layers, 1):
        failed += check(n, d, name)
    if layered:
        failed += check_layers(len(layers) + 1, layers)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
