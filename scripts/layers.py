#!/usr/bin/env python3
"""The payrecon crate's modules and which of them each one names (`crate::<module>` and the
`super::` of a nested module), with every import cycle between top-level modules.

    python3 scripts/layers.py          # the graph, one module per line, then the cycles
Exits 1 when there is a cycle.
"""
import pathlib, re, sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
TOP = sorted({p.stem if p.parent == SRC else p.parent.relative_to(SRC).parts[0]
              for p in SRC.rglob("*.rs")} - {"lib", "main", "cli", "test_utils"})

def top_of(path):
    rel = path.relative_to(SRC).parts
    return rel[0][:-3] if len(rel) == 1 else rel[0]

graph = {m: set() for m in TOP}
for path in SRC.rglob("*.rs"):
    module = top_of(path)
    if module not in graph:
        continue
    text = re.sub(r"#\[cfg\(test\)\]\s*mod tests \{.*", "", path.read_text(), flags=re.S)
    for name in re.findall(r"\bcrate::([a-z_]+)", text):
        if name in graph and name != module:
            graph[module].add(name)

def cycles():
    found, state, stack = [], {}, []
    def visit(node):
        state[node] = "open"; stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                found.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop(); state[node] = "done"
    for node in TOP:
        if node not in state:
            visit(node)
    return found

for module in TOP:
    print(f"{module:10} -> {', '.join(sorted(graph[module])) or '-'}")
found = cycles()
for cycle in found:
    print("cycle: " + " -> ".join(cycle))
sys.exit(1 if found else 0)
