#!/usr/bin/env python3
"""Import circles between the modules of each crate, the ones Cargo cannot refuse (it
refuses circles between crates). An edge a -> b when file a names an item of module b
(`crate::b::…`, `super::…`, a glob of its parent, or one of its own children); test
modules are left out. Prints every circle of files, and of top-level modules, and exits 1
when there is one.

    python3 tests/check_imports.py crates/*/src src loadtest/*/src
"""
import os, re, sys, itertools

def crate_files(src):
    """Every module file of the crate at `src`, by module path; test-only modules (`tests`,
    `testing`) are left out: tests may use anything."""
    files = {}
    for root, _, names in os.walk(src):
        for n in names:
            if n.endswith('.rs'):
                p = os.path.join(root, n)
                rel = os.path.relpath(p, src)[:-3].split(os.sep)
                if rel[-1] in ('mod', 'lib', 'main'):
                    rel = rel[:-1]
                if any(part in ('tests', 'testing') for part in rel):
                    continue
                files[tuple(rel)] = p
    return files

def strip(text):
    text = re.sub(r'//[^\n]*', '', text)
    # drop #[cfg(test)] mod tests { ... } blocks roughly: from '#[cfg(test)]' to end of file
    i = text.find('#[cfg(test)]\nmod tests {')
    if i >= 0:
        text = text[:i]
    return text

def resolve(mods, path):
    # longest prefix that is a module file
    for k in range(len(path), 0, -1):
        if tuple(path[:k]) in mods:
            return tuple(path[:k])
    return None

def edges(mods, me, text):
    out = set()
    for m in re.finditer(r'\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)', text):
        head, rest = m.group(1), m.group(2).split('::')[1:]
        if head == 'crate':
            base = []
        elif head == 'self':
            base = list(me) if mods.get(me, '').endswith(('mod.rs','lib.rs')) else list(me)
        else:
            # super of a mod.rs is its parent; super of x.rs is its directory module
            base = list(me[:-1])
        # expand `{a, b::c}` groups
        tgt = resolve(mods, base + rest)
        if tgt is not None and tgt != me:
            out.add(tgt)
    for m in re.finditer(r'\b(crate|super)::((?:[A-Za-z_][A-Za-z0-9_]*::)*)\{([^}]*)\}', text):
        head, pre = m.group(1), [p for p in m.group(2).split('::') if p]
        base = [] if head == 'crate' else list(me[:-1])
        for item in m.group(3).split(','):
            item = item.strip().split(' as ')[0]
            if not item or item == 'self':
                continue
            tgt = resolve(mods, base + pre + item.split('::'))
            if tgt is not None and tgt != me:
                out.add(tgt)
    # glob imports of the parent (`use super::*;`)
    if re.search(r'\buse super::\*;', text):
        tgt = resolve(mods, list(me[:-1]))
        if tgt is not None and tgt != me:
            out.add(tgt)
    # `use child::…` / `child::…` inside a module file for its own children
    for m in re.finditer(r'\buse ([a-z_][a-z0-9_]*)::', text):
        tgt = resolve(mods, list(me) + [m.group(1)])
        if tgt is not None and tgt != me and len(tgt) > len(me):
            out.add(tgt)
    return out

def sccs(graph):
    index, low, stack, on, res = {}, {}, [], set(), []
    counter = itertools.count()
    sys.setrecursionlimit(10000)
    def visit(v):
        index[v] = low[v] = next(counter)
        stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            res.append(comp)
    for v in graph:
        if v not in index:
            visit(v)
    return res

bad = 0
for src in sys.argv[1:]:
    mods = crate_files(src)
    graph = {m: edges(mods, m, strip(open(p).read())) for m, p in mods.items()}
    # The same graph between top-level modules (a folder and everything in it).
    top = {}
    for a, targets in graph.items():
        for b in targets:
            if a[:1] and b[:1] and a[:1] != b[:1]:
                top.setdefault(a[:1], set()).add(b[:1])
    for kind, g in (('files', graph), ('modules', top)):
        for comp in sccs(g):
            if len(comp) > 1:
                bad += 1
                names = ', '.join('::'.join(c) or 'lib' for c in sorted(comp))
                print(f'{src}: import circle between {kind}: {names}')
sys.exit(1 if bad else 0)
