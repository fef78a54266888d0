#!/usr/bin/env python3
"""Checks that the object files of each module call each other without a
circle: file A "calls" file B when A's object refers to a global symbol B's
defines (nm), or when A calls through a function pointer that some file
binds to a function of B (below). One TAP line per directory; on a circle,
the files in it and who calls what. Usage: check_calls.py DIR_WITH_OBJECTS...

With --layers NAME=DIR..., lowest first, it also checks that no object of a
layer refers to a symbol defined in a layer above it (one TAP line more):
the rooms of gateway/ stacked on common/, modeldb/ and planner/, where a
call from a lower room into a higher one is what must never happen.

A call circle between files means no file can be understood, tested or
replaced alone (STYLE.md). A table of function pointers does not change
that, so calls through one count: where a designated initializer or an
assignment binds a member to a function of the checked objects
(`static const ops_t ops = {.pump = ds_pump}`, `x->done = on_done`), a call
through that member (`ds->ops->pump(ds)`, `job.done(job)`, `(*t->pump)(t)`)
is a call to that function. The rule is conservative: the member is known
by its name only, so a member bound to several functions anywhere counts as
a call to every one of them from every file that calls through it. The
sources are found through the compile_commands.json of the build that made
the objects, or as NAME.c beside NAME.c.o. The layers check counts only
direct calls: a callback registered at creation is how an answer comes back
up a layer (docs/architecture.md), and it is no circle between layers since
the lower one never names the higher one.

--allow-circle LAYER:FILE,FILE... accepts the circle of exactly those files
(object names without .c.o) in that layer: a circle known and owned by
someone, listed where the check is run. Any other circle fails, and so does
an allowed one that is no longer there (remove it from the list). A
circle of some of an allowed circle's files passes (as the same circle,
shrunk), with a note saying so."""

import json
import os
import re
import subprocess
import sys


def symbols(objs):
    """{object: (global symbols defined, symbols used, functions defined)},
    read with one nm for all of them; local functions keep their name
    without GCC's clone suffixes (.isra.0, .constprop.0, .part.0, .cold)."""
    out = {o: (set(), set(), set()) for o in objs}
    if not objs:
        return out
    text = subprocess.run(["nm", "-A"] + list(objs), capture_output=True, text=True,
                          check=True).stdout
    for ln in text.splitlines():
        obj, _, rest = ln.partition(":")
        parts = rest.split()
        if obj not in out or len(parts) < 2:
            continue
        defined, used, funcs = out[obj]
        if len(parts) == 2:  # no value: undefined (U, or w/v when weak)
            used.add(parts[1])
            continue
        kind, name = parts[1], parts[2]
        if kind.isupper() or kind == "u":
            defined.add(name)
        if kind in ("T", "t", "W"):
            funcs.add(name.split(".")[0])
    return out


# ---- calls through function pointers ------------------------------------

_CODE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_IDENT = r"[A-Za-z_]\w*"
# .member = fn   x.member = fn   x->member = &fn   (then , ; } or ))
_BIND = re.compile(r"(?:\.|->)\s*(%s)\s*=(?!=)\s*&?\s*(%s)\s*(?=[,;})])" % (_IDENT, _IDENT))
# x->member(   x.member(   (*x->member)(
_CALL = re.compile(r"(?:\.|->)\s*(%s)\s*\(|\(\s*\*\s*[\w\[\].>\- ]*?(?:\.|->)\s*(%s)\s*\)\s*\("
                   % (_IDENT, _IDENT))


def code_of(path):
    """The source without comments, and with string and character literals
    emptied (a comment or a message naming ->pump( is no call)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    return _CODE.sub(lambda m: " " if m.group(0)[0] == "/" else m.group(0)[0] * 2, text)


def bindings_in(code):
    """(member, identifier) pairs that the code binds."""
    return set(_BIND.findall(code))


def calls_through(code):
    """Member names the code calls through."""
    return {a or b for a, b in _CALL.findall(code)}


_compile_dbs = {}


def compile_db(d):
    """The {object path: source path} map of the compile_commands.json in d
    or a directory above it (meson writes one at the build's top); {} when
    there is none."""
    d = os.path.abspath(d)
    while True:
        if d in _compile_dbs:
            return _compile_dbs[d]
        db = os.path.join(d, "compile_commands.json")
        if os.path.isfile(db):
            with open(db) as f:
                entries = json.load(f)
            m = {}
            for e in entries:
                if "output" in e and "file" in e:
                    base = e.get("directory", d)
                    m[os.path.normpath(os.path.join(base, e["output"]))] = os.path.normpath(
                        os.path.join(base, e["file"]))
            _compile_dbs[d] = m
            return m
        up = os.path.dirname(d)
        if up == d:
            return {}
        d = up


def source_of(obj):
    """The C file obj was compiled from, or None."""
    obj = os.path.normpath(os.path.abspath(obj))
    src = compile_db(os.path.dirname(obj)).get(obj)
    if src is not None and os.path.isfile(src):
        return src
    beside = obj[:-len(".o")] if obj.endswith(".o") else None
    if beside is not None and beside.endswith(".c") and os.path.isfile(beside):
        return beside
    return None


class Objects:
    """Every object of the directories checked: symbols, and the calls
    through function pointers that the sources make, resolved to the
    objects whose functions the pointers are bound to."""

    def __init__(self, dirs):
        self.info, self.code, self.missing = {}, {}, []
        for d in dirs:
            objs = [o for o in objects(d) if o not in self.info]
            self.info.update(symbols(objs))
            for o in objs:
                src = source_of(o)
                if src is None:
                    self.missing.append(o)
                    self.code[o] = ""
                else:
                    self.code[o] = code_of(src)
        self.owner = {}
        for o, (defined, _, _) in self.info.items():
            for s in defined:
                self.owner[s] = o
        # member -> {(object that defines the function, function)}
        self.bound = {}
        for o, code in self.code.items():
            local_funcs = self.info[o][2]
            for member, ident in bindings_in(code):
                g = self.owner.get(ident)
                if g is not None and ident in self.info[g][2]:
                    target = g
                elif ident in local_funcs:
                    target = o
                else:
                    continue  # not a function of the checked objects
                self.bound.setdefault(member, set()).add((target, ident))

    def pointer_calls(self, o):
        """{(object, "member=>function")} that o calls through pointers."""
        out = set()
        for member in calls_through(self.code[o]):
            for target, fn in self.bound.get(member, ()):
                out.add((target, "->%s=>%s" % (member, fn)))
        return out


# ---- circles --------------------------------------------------------------

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


def short_name(o):
    f = os.path.basename(o)
    return f[:-len(".c.o")] if f.endswith(".c.o") else f


def check(n, d, db, label_name=None, allowed=()):
    """allowed: frozensets of file names whose circle is known and accepted."""
    objs = objects(d)
    mine = set(objs)
    edges = {o: set() for o in objs}
    why = {}
    for o in objs:
        for s in db.info[o][1]:
            g = db.owner.get(s)
            if g in mine and g != o:
                edges[o].add(g)
                why.setdefault((o, g), []).append(s)
        for g, via in db.pointer_calls(o):
            if g in mine and g != o:
                edges[o].add(g)
                why.setdefault((o, g), []).append(via)
    circles = [c for c in sccs(objs, edges) if len(c) > 1]
    label = "no call circle between the files of %s" % (label_name or
                                                        os.path.basename(os.path.normpath(d)))
    names = [frozenset(short_name(o) for o in c) for c in circles]
    # A circle inside a known one is that one (shrunk, perhaps); any other
    # is new. A known circle none is inside is gone: the list must say so.
    home = [next((a for a in sorted(allowed, key=sorted) if c <= a), None) for c in names]
    new = [c for c, a in zip(circles, home) if a is None]
    known = [(c, a) for c, a in zip(circles, home) if a is not None]
    built = {short_name(o) for o in objs}
    # (an allowed circle of files that this build does not make, such as an
    # optional backend's, is not there to be found)
    stale = [a for a in allowed if a not in home and a <= built]
    missing = [o for o in objs if o in db.missing]
    if not new and not stale and not missing:
        extra = ", %d known circle%s allowed" % (len(known), "" if len(known) == 1 else "s") \
            if known else ""
        print("ok %d - %s (%d files%s)" % (n, label, len(objs), extra))
        for c, a in known:
            line = "# known circle (allowed): " + " ".join(short_name(o) for o in c)
            if len(c) < len(a):
                line += " (allowed as %s: shrink the list)" % ",".join(sorted(a))
            print(line)
        return 0
    print("not ok %d - %s" % (n, label))
    for o in missing:
        print("# no source found for %s: its calls through function pointers cannot be seen" %
              short_name(o))
    for c in new:
        print("# circle: " + " ".join(short_name(o) for o in c))
        for o in c:
            for g in sorted(edges[o] & set(c)):
                print("#   %s -> %s: %s" % (short_name(o), short_name(g),
                                            ", ".join(sorted(why[(o, g)])[:6])))
    for a in stale:
        print("# allowed circle no longer found (remove it from the allow-list): " +
              " ".join(sorted(a)))
    return 1


def objects(d):
    return [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".o")]


def check_layers(n, layers, db):
    """Layers as (name, dir), lowest first: a file may refer only to symbols
    of its own layer or of the layers below it."""
    rank = {}
    for i, (name, d) in enumerate(layers):
        for o in objects(d):
            rank[o] = i
    bad = {}
    for o in rank:
        for s in db.info[o][1]:
            g = db.owner.get(s)
            if g is not None and g in rank and rank[g] > rank[o]:
                bad.setdefault((o, g), []).append(s)
    label = "no call from a lower layer to a higher one (%s)" % " < ".join(n_ for n_, _ in layers)
    if not bad:
        print("ok %d - %s" % (n, label))
        return 0
    print("not ok %d - %s" % (n, label))
    short = lambda o: "%s/%s" % (layers[rank[o]][0], short_name(o))
    for (o, g), syms in sorted(bad.items()):
        print("#   %s -> %s: %s" % (short(o), short(g), ", ".join(sorted(syms)[:6])))
    return 1


def main():
    args = sys.argv[1:]
    allowed = {}
    rest = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--allow-circle" or a.startswith("--allow-circle="):
            if a == "--allow-circle":
                i += 1
                if i == len(args):
                    print("--allow-circle needs LAYER:FILE,FILE...", file=sys.stderr)
                    return 2
                a = args[i]
            else:
                a = a.split("=", 1)[1]
            layer, _, files = a.partition(":")
            names = frozenset(f for f in files.split(",") if f)
            if not layer or len(names) < 2:
                print("bad --allow-circle %r: expected LAYER:FILE,FILE..." % a, file=sys.stderr)
                return 2
            allowed.setdefault(layer, set()).add(names)
        else:
            rest.append(a)
        i += 1
    args = rest
    layered = bool(args) and args[0] == "--layers"
    if layered:
        args = args[1:]
    if not args:
        print("usage: check_calls.py [--allow-circle LAYER:FILE,FILE...] [--layers] [NAME=]DIR...",
              file=sys.stderr)
        return 2
    layers = [(a.split("=", 1)[0], a.split("=", 1)[1]) if "=" in a else
              (os.path.basename(os.path.normpath(a)), a) for a in args]
    unknown = set(allowed) - {name for name, _ in layers}
    if unknown:
        print("--allow-circle names no layer checked here: %s" % ", ".join(sorted(unknown)),
              file=sys.stderr)
        return 2
    db = Objects([d for _, d in layers])
    print("1..%d" % (len(layers) + (1 if layered else 0)))
    failed = 0
    for n, (name, d) in enumerate(layers, 1):
        failed += check(n, d, db, name, allowed.get(name, set()))
    if layered:
        failed += check_layers(len(layers) + 1, layers, db)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
