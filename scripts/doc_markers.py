"""The one way a generated table lives in a hand-written page: between a
BEGIN and an END marker line, printed, checked or rewritten by the script
that generates it (scripts/error_table.py, scripts/config_doc.py)."""

import os
import sys


def main(root, doc, begin, end, generated, what, sources, script):
    """argv: none prints the table; --check exits 1 when doc (relative to
    root) holds another one between its markers; --write replaces it."""
    if len(sys.argv) == 1:
        print(generated)
        return 0
    path = os.path.join(root, doc)
    with open(path) as f:
        text = f.read()
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        print("%s has no %s markers" % (doc, what), file=sys.stderr)
        return 1
    new = text[:i] + generated + text[j + len(end):]
    if sys.argv[1] == "--check":
        if new != text:
            print("%s differs from %s: run %s --write" % (doc, sources, script), file=sys.stderr)
            return 1
        return 0
    with open(path, "w") as f:
        f.write(new)
    return 0
