#!/usr/bin/env python3
"""Import circles between the modules of each crate, the ones Cargo cannot refuse (it
refuses circles between crates). An edge a -> b when file a names an item of module b
(`crate::b::…`, `super::…`, a glob of its parent, or one of its own children); test
modules are left out. The crate root (`lib.rs`) is a module like the others: `crate::X`
for an item X defined in it is an edge to it. Its re-exports are a facade, not a use:
`crate::X` for a name it re-exports from one of its modules is an edge to that module, and
`pub use a::X` is an edge from the root to `a` only when the root's own code uses X.
Prints every circle of files, and of top-level modules (the root among them), each with
the imports that close it, and exits 1 when there is one.

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
                    # A main.rs beside a lib.rs is another crate, using the library by name.
                    if rel == ['main'] and os.path.exists(os.path.join(src, 'lib.rs')):
                        continue
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

IDENT = r'[A-Za-z_][A-Za-z0-9_]*'
# An item defined in a file: `pub(crate) static X`, `fn x`, `macro_rules! x`, …
DEFINITION = re.compile(
    r'^[ \t]*(?:pub(?:\([^)]*\))?[ \t]+)?(?:(?:const|async|unsafe|extern[ \t]+"[^"]*")[ \t]+)*'
    r'(?:struct|enum|union|trait|type|fn|const|static|mod)[ \t]+(' + IDENT + r')'
    r'|^[ \t]*macro_rules![ \t]*(' + IDENT + r')', re.M)
USE = re.compile(r'\buse\s+([^;]*);')
REEXPORT = re.compile(r'\bpub(?:\([^)]*\))?\s+use\s+([^;]*);')

def use_paths(tree, prefix=()):
    """The paths a use tree imports, with the name each is visible by:
    `a::{b, c::d as e, f::*}` gives (a::b, b), (a::c::d, e), (a::f::*, *)."""
    tree = tree.strip()
    depth = 0
    for i, ch in enumerate(tree):
        if ch == '{':
            if depth == 0:
                head = [p for p in tree[:i].split('::') if p.strip()]
                inner = tree[i + 1:tree.rindex('}')]
                parts, depth2, start = [], 0, 0
                for j, c in enumerate(inner):
                    depth2 += c == '{'
                    depth2 -= c == '}'
                    if c == ',' and depth2 == 0:
                        parts.append(inner[start:j]); start = j + 1
                parts.append(inner[start:])
                out = []
                for part in parts:
                    if part.strip():
                        out += use_paths(part, prefix + tuple(h.strip() for h in head))
                return out
            depth += 1
    path, _, alias = tree.partition(' as ')
    segs = prefix + tuple(p.strip() for p in path.split('::') if p.strip())
    if segs and segs[-1] == 'self':
        segs = segs[:-1]
    if not segs:
        return []
    return [(segs, (alias.strip() or segs[-1]))]

def root_names(mods, texts):
    """What `crate::X` names for each X the crate root defines (the root, `()`) or imports
    from one of its own modules (that module); names from other crates are left out."""
    root = texts.get(())
    if root is None:
        return {}
    names = {}
    for m in DEFINITION.finditer(root):
        if (m.group(1) or m.group(2)) not in ('tests', 'testing'):  # test modules, left out
            names[m.group(1) or m.group(2)] = ()
    for m in USE.finditer(root):
        for segs, name in use_paths(m.group(1)):
            segs = list(segs)
            if segs[0] in ('crate', 'self'):
                segs = segs[1:]
            if not segs or (segs[0],) not in mods:
                continue  # another crate's item (or `std`)
            if name == '*':
                tgt = resolve(mods, segs[:-1])
                if tgt is not None and tgt != ():
                    for d in DEFINITION.finditer(texts.get(tgt, '')):
                        names.setdefault(d.group(1) or d.group(2), tgt)
                continue
            tgt = resolve(mods, segs)
            if tgt is not None and tgt != ():
                names.setdefault(name, tgt)
    return names

def reexports(mods, texts, text):
    """The modules the root's re-exports (`pub use a::X;`) name whose names its own code,
    `text` without the re-exports, uses; with the re-export that names each."""
    out = {}
    for m in REEXPORT.finditer(texts[()]):
        for segs, name in use_paths(m.group(1)):
            segs = list(segs)
            if segs[0] in ('crate', 'self'):
                segs = segs[1:]
            if not segs or (segs[0],) not in mods:
                continue
            tgt = resolve(mods, segs if name != '*' else segs[:-1])
            if tgt is None or tgt == () or tgt in out:
                continue
            if name == '*':
                names = [d.group(1) or d.group(2) for d in DEFINITION.finditer(texts[tgt])]
            else:
                names = [name]
            used = [n for n in names if re.search(r'\b' + re.escape(n) + r'\b', text)]
            if used:
                out[tgt] = f'pub use {"::".join(segs)} (and uses {used[0]})'
    return out

def edges(mods, me, text, roots=None):
    """The modules `me` names, each with the first text that names it."""
    roots = roots or {}
    out = {}
    def add(tgt, why):
        if tgt is not None and tgt != me and tgt not in out:
            out[tgt] = why
    def target(base, path):
        tgt = resolve(mods, base + path)
        if tgt is None and not base and path:
            # `crate::X` with X an item of the root or a name it re-exports
            tgt = roots.get(path[0])
        return tgt
    for m in re.finditer(r'\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)', text):
        head, rest = m.group(1), m.group(2).split('::')[1:]
        if head == 'crate':
            base = []
        elif head == 'self':
            base = list(me)
        else:
            # super of a mod.rs is its parent; super of x.rs is its directory module
            base = list(me[:-1])
        add(target(base, rest), m.group(0))
    # `{a, b::c}` groups
    for m in re.finditer(r'\b(crate|super)::((?:[A-Za-z_][A-Za-z0-9_]*::)*)\{([^}]*)\}', text):
        head, pre = m.group(1), [p for p in m.group(2).split('::') if p]
        base = [] if head == 'crate' else list(me[:-1])
        for item in m.group(3).split(','):
            item = item.strip().split(' as ')[0]
            if not item or item == 'self':
                continue
            add(target(base, pre + item.split('::')), f'{head}::{m.group(2)}{{{item}}}')
    # glob imports of the parent (`use super::*;`)
    if re.search(r'\buse super::\*;', text):
        add(resolve(mods, list(me[:-1])) if me[:-1] else (() if () in mods else None),
            'use super::*')
    # `use child::…` / `child::…` inside a module file for its own children
    for m in re.finditer(r'\buse ([a-z_][a-z0-9_]*)::', text):
        tgt = resolve(mods, list(me) + [m.group(1)])
        if tgt is not None and len(tgt) > len(me):
            add(tgt, m.group(0) + '…')
    return out

def circle(graph, comp, start):
    """The shortest circle through `start` inside the strongly connected `comp`."""
    comp = set(comp)
    prev, todo = {start: None}, [start]
    while todo:
        nxt = []
        for v in todo:
            for w in sorted(graph.get(v, ())):
                if w not in comp:
                    continue
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return path[::-1] + [start]
                if w not in prev:
                    prev[w] = v; nxt.append(w)
        todo = nxt
    return [start]

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

def name(m):
    return '::'.join(m) or 'the crate root'

bad = 0
for src in sys.argv[1:]:
    mods = crate_files(src)
    texts = {m: strip(open(p).read()) for m, p in mods.items()}
    roots = root_names(mods, texts)
    graph = {m: edges(mods, m, texts[m], roots) for m in mods if m != ()}
    if () in mods:
        body = REEXPORT.sub('', texts[()])
        graph[()] = {**reexports(mods, texts, body), **edges(mods, (), body, roots)}
    # The same graph between top-level modules (a folder and everything in it; the root
    # is one of its own), with the first import of each edge.
    top = {}
    for a, targets in graph.items():
        for b, why in targets.items():
            if a[:1] != b[:1]:
                top.setdefault(a[:1], {}).setdefault(b[:1], f'{name(a)}: `{why}`')
    for kind, g in (('files', graph), ('modules', top)):
        for comp in sccs(g):
            if len(comp) > 1:
                bad += 1
                names = ', '.join(name(c) for c in sorted(comp))
                print(f'{src}: import circle between {kind}: {names}')
                # A circle through each module not on one shown yet, with the imports.
                shown = set()
                for start in sorted(comp):
                    if start in shown:
                        continue
                    if shown:
                        print('    and')
                    way = circle(g, comp, start)
                    shown.update(way)
                    for a, b in zip(way, way[1:]):
                        why = g[a][b]
                        if kind == 'files':
                            why = f'{os.path.relpath(mods[a], src)}: `{why}`'
                        print(f'    {name(a)} -> {name(b)}  ({why})')
sys.exit(1 if bad else 0)
