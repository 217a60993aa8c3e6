#!/usr/bin/env python3
"""Production functions over 100 lines, from the line of `fn` to its closing brace. Test code
is left out: `#[cfg(test)]` sections, `tests.rs` and `testing.rs` modules, and the files
under a crate's `tests/`. Tables and match-only dispatchers may be longer when they are
listed in ALLOWED with why (docs/architecture.md lists them too). Prints each function too
long and exits 1 when there is one.

    python3 tests/check_fn_length.py crates
"""
import os, re, sys

LIMIT = 100

# "path::fn": why it is longer (kept in step with docs/architecture.md).
ALLOWED = {}

FN = re.compile(r'^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?'
                r'(?:extern\s+"[^"]*"\s+)?fn\s+(\w+)')


def code_of(line, in_block):
    """The line without comments, strings and char literals (braces in them do not count),
    and whether a block comment is still open after it."""
    out, i, n = [], 0, len(line)
    while i < n:
        if in_block:
            j = line.find('*/', i)
            if j < 0:
                return ''.join(out), True
            in_block, i = False, j + 2
            continue
        if line.startswith('//', i):
            break
        if line.startswith('/*', i):
            in_block, i = True, i + 2
            continue
        c = line[i]
        if c == '"':
            j = i + 1
            while j < n and line[j] != '"':
                j += 2 if line[j] == '\\' else 1
            i = j + 1
            continue
        if c == "'" and i + 2 < n and (line[i + 2] == "'" or line[i + 1] == '\\'):
            j = line.find("'", i + 3 if line[i + 1] == '\\' else i + 2)
            i = j + 1 if j > 0 else n
            continue
        out.append(c)
        i += 1
    return ''.join(out), in_block


def long_functions(path, text):
    lines = text.split('\n')
    end = next((i for i, l in enumerate(lines) if l.startswith('#[cfg(test)]')), len(lines))
    found, open_fns, depth, in_block = [], [], 0, False
    for i in range(end):
        code, in_block = code_of(lines[i], in_block)
        m = FN.match(lines[i])
        if m and not code.rstrip().endswith(';'):
            open_fns.append((m.group(1), i, depth))
        for c in code:
            if c == '{':
                depth += 1
            elif c == '}':
                depth -= 1
                if open_fns and depth == open_fns[-1][2]:
                    name, start, _ = open_fns.pop()
                    if i - start + 1 > LIMIT:
                        found.append((path, start + 1, name, i - start + 1))
    return found


def main(roots):
    too_long = []
    for root in roots:
        for dirpath, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in ('target', 'tests')]
            for f in sorted(files):
                if f.endswith('.rs') and f not in ('tests.rs', 'testing.rs'):
                    p = os.path.join(dirpath, f)
                    with open(p) as fh:
                        too_long += long_functions(p, fh.read())
    bad = [t for t in too_long if f'{t[0]}::{t[2]}' not in ALLOWED]
    for path, line, name, n in bad:
        print(f'{path}:{line}: fn {name} is {n} lines (at most {LIMIT}); split it into named steps')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:] or ['crates']))
