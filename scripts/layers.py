#!/usr/bin/env python3
"""The payrecon crate's modules, which of them each one names, and every circle between them.

    python3 scripts/layers.py          # the graph, one module per line, then any circle
Exits 1 when modules form a circle, naming for each step of it the file and the path that
make it; when config names a module beyond the vocabulary it is written in (the modules it
configures name config, never the other way round); or when a module names one in a layer
above its own, or sits in no layer, as docs/ARCHITECTURE.md's numbered list under "Layers"
places them (so that list cannot go stale).

A module here is a top-level module of `src/` (a file or a folder). A file names another
module when a path in it (a `use`, grouped `use crate::{a, b::c}` included, or a path written
in the code) resolves, through `crate::`, `super::`, `self::` or a child module's name, to a
file of that module. Comments, strings and `#[cfg(test)]` modules are left out: tests may
name anything. lib.rs, main.rs, cli/ and test_utils.rs sit on top and are not in the graph.
"""
import pathlib, re, sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
ON_TOP = {"lib", "main", "cli", "test_utils"}
# What configuration is written in: amounts, records and the product catalog, none of which
# names another module of the crate.
CONFIG_VOCABULARY = {"catalog", "money", "records"}
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_path(path):
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "mod" or parts == ["lib"]:
        parts = parts[:-1]
    return tuple(parts)


def code_only(text):
    """The text with comments and string and character literals blanked out."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i) if "\n" in text[i:] else n
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (i == 0 or not text[i - 1].isalnum()):
            end = text.find('"' + m.group(1), m.end())
            i = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif m := re.compile(r"'(\\.|[^'\\])'").match(text, i):
            i = m.end()
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def without_test_modules(code):
    while m := re.search(r"#\[cfg\(test\)\]\s*(pub(\([a-z]+\))?\s+)?mod\s+" + IDENT + r"\s*\{", code):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        code = code[: m.start()] + code[i:]
    return code


def expand(tree):
    """`a::{b, c::{d, e}}` as the paths a::b, a::c::d and a::c::e."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^((?:" + IDENT + r"::)*)\{(.*)\}$", tree)
    if not m:
        return [re.sub(r"\bas\b.*$", "", tree)]
    items, depth, start = [], 0, 0
    for i, c in enumerate(m.group(2) + ","):
        depth += {"{": 1, "}": -1}.get(c, 0)
        if c == "," and depth == 0:
            if m.group(2)[start:i]:
                items.append(m.group(2)[start:i])
            start = i + 1
    return [m.group(1) + path for item in items for path in expand(item)]


FILES = {module_path(p): p for p in SRC.rglob("*.rs")}


def resolve(here, children, path):
    """The file a path written in the module `here` names, if it is one of this crate's."""
    segments = path.split("::")
    if segments[0] == "crate":
        target = []
    elif segments[0] in ("self", "super"):
        target = list(here)
        while segments and segments[0] in ("self", "super"):
            if segments.pop(0) == "super":
                target = target[:-1]
        segments.insert(0, "crate")
    elif segments[0] in children:
        target = list(here)
        segments.insert(0, "crate")
    else:
        return None
    target += [s for s in segments[1:] if s != "self"]
    while tuple(target) not in FILES:
        target.pop()
    return FILES[tuple(target)]


def top(path):
    return module_path(path)[0] if module_path(path) else "lib"


edges = {}  # file -> {file: path that names it}
for path in sorted(FILES.values()):
    if top(path) in ON_TOP:
        continue
    here = module_path(path)
    code = without_test_modules(code_only(path.read_text()))
    children = set(re.findall(r"\bmod\s+(" + IDENT + r")\s*;", code))
    written = []
    for tree in re.findall(r"\buse\s+([^;]+);", code):
        written += expand(tree)
    code = re.sub(r"\buse\s+[^;]+;", "", code)
    written += re.findall(r"\b(?:crate|super|self)(?:::" + IDENT + ")+", code)
    written += re.findall(r"\b(?:" + "|".join(children or ["\0"]) + r")(?:::" + IDENT + ")+", code)
    for name in written:
        target = resolve(here, children, name)
        if target and target != path and top(target) not in ON_TOP:
            edges.setdefault(path, {}).setdefault(target, name)

modules = sorted({top(p) for p in FILES.values()} - ON_TOP)
graph = {m: {} for m in modules}  # module -> {module: (file, path, target file)}
for source, targets in edges.items():
    for target, name in targets.items():
        if top(target) != top(source):
            graph[top(source)].setdefault(top(target), (source, name, target))


def circles():
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                found.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = "done"

    for node in modules:
        if node not in state:
            visit(node)
    return found


for module in modules:
    print(f"{module:10} -> {', '.join(sorted(graph[module])) or '-'}")
found = circles()
for circle in found:
    print("circle: " + " -> ".join(circle))
    for a, b in zip(circle, circle[1:]):
        source, name, target = graph[a][b]
        print(f"  {source.relative_to(SRC.parent)} names {name} ({target.relative_to(SRC.parent)})")
def documented_layers():
    """Module -> layer number (1 the top) from ARCHITECTURE.md's numbered list of layers."""
    text = (SRC.parent / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    placed = {}
    for number, item in re.findall(r"(?ms)^(\d+)\. \*\*(.*?)(?=^\d+\. \*\*|^\S|\Z)", section):
        for name in re.findall(r"`([a-z_]+)/?`", item):
            if name in graph:
                placed.setdefault(name, int(number))
    return placed


layer = documented_layers()
unplaced = [m for m in modules if m not in layer]
upward = [(a, b) for a in modules for b in graph[a] if a in layer and b in layer and layer[b] < layer[a]]
for module in unplaced:
    print(f"{module} is in no layer of docs/ARCHITECTURE.md")
for a, b in upward:
    source, name, target = graph[a][b]
    print(f"{a} (layer {layer[a]}) names {b} (layer {layer[b]}, above it): "
          f"{source.relative_to(SRC.parent)} names {name}")

beyond = sorted(set(graph["config"]) - CONFIG_VOCABULARY)
for module in beyond:
    source, name, target = graph["config"][module]
    print(f"config names {module}, a module it configures: "
          f"{source.relative_to(SRC.parent)} names {name} ({target.relative_to(SRC.parent)})")
sys.exit(1 if found or beyond or unplaced or upward else 0)
