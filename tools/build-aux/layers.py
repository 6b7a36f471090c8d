#!/usr/bin/env python3
"""Check the shim's layers: tools/build-aux/layers.py shim/LAYERS OBJ...

shim/LAYERS names the layers, lowest first; each is a folder of shim/, and
every module (a .c/.h pair, or a header or table alone) is in the layer of
its folder: shim/core/guard.c is module guard, of layer core. A module may
use only modules of its own layer or lower ones, and the modules may form
no circle. "Uses" is read two ways, and both are checked:
  - its files' #include "x.h" lines (shim/*/*.c, *.h, *.def), and
  - its object's undefined symbols, resolved against the other objects'
    definitions (like the DT_NEEDED check: what the code really calls).
A folder that is no layer, a module outside a folder, or one module in
two folders is an error too.

Prints one line per violation and exits 1; silent and 0 when all is well.
Standard library only; uses nm from binutils.
"""
import os
import re
import subprocess
import sys


SOURCE = re.compile(r"\.(c|h|def)$")


def read_layers(path, problems):
    """{module: level}, from the folders of the layers path names."""
    shim_dir = os.path.dirname(os.path.abspath(path))
    layers = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) != 2 or not words[0].isdigit():
                problems.append(f"shim/LAYERS:{n}: not 'LEVEL NAME': {line.strip()}")
                continue
            layers[words[1]] = int(words[0])
    layer_of = {}
    for entry in sorted(os.listdir(shim_dir)):
        full = os.path.join(shim_dir, entry)
        if not os.path.isdir(full):
            if SOURCE.search(entry):
                problems.append(f"shim/{entry}: in no layer's folder (shim/LAYERS)")
            continue
        if entry not in layers:
            problems.append(f"shim/{entry}/: a folder that shim/LAYERS does not name")
            continue
        for name in sorted(os.listdir(full)):
            if not SOURCE.search(name):
                continue
            mod = module_of(name)
            if layer_of.get(mod, layers[entry]) != layers[entry]:
                problems.append(f"shim/{entry}/{name}: module {mod} is in two layers' folders")
            layer_of[mod] = layers[entry]
    for name in layers:
        if not os.path.isdir(os.path.join(shim_dir, name)):
            problems.append(f"shim/LAYERS: layer {name} has no folder shim/{name}/")
    return layer_of


def module_of(path):
    base = os.path.basename(path)
    return re.sub(r"\.(c|h|def|o)$", "", base)


def sources(shim_dir):
    """shim/LAYER/FILE of every module's file, as (relative name, path)."""
    for entry in sorted(os.listdir(shim_dir)):
        full = os.path.join(shim_dir, entry)
        if os.path.isdir(full):
            for name in sorted(os.listdir(full)):
                if SOURCE.search(name):
                    yield f"{entry}/{name}", os.path.join(full, name)


def include_edges(shim_dir, layer_of, problems):
    edges = set()
    for name, path in sources(shim_dir):
        mod = module_of(name)
        if mod not in layer_of:
            continue  # said by read_layers
        with open(path) as f:
            for n, line in enumerate(f, 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                target = module_of(m.group(1))
                if target == mod or target == "gpuguard":  # the public header
                    continue
                if target not in layer_of:
                    problems.append(f"shim/{name}:{n}: includes {m.group(1)}, in no layer")
                    continue
                if layer_of[target] > layer_of[mod]:
                    problems.append(
                        f"shim/{name}:{n}: layer {layer_of[mod]} module {mod} includes "
                        f"{m.group(1)} of layer {layer_of[target]}")
                edges.add((mod, target))
    return edges


def nm(obj, *flags):
    out = subprocess.run(["nm", *flags, obj], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            yield parts[-2], parts[-1]


def symbol_edges(objs, layer_of, problems):
    defined = {}
    for obj in objs:
        mod = module_of(obj)
        for kind, sym in nm(obj, "--defined-only"):
            if kind.isupper():  # global
                defined[sym] = mod
    edges = set()
    for obj in objs:
        mod = module_of(obj)
        if mod not in layer_of:
            problems.append(f"{obj}: module {mod} is in no layer of shim/LAYERS")
            continue
        for _kind, sym in nm(obj, "--undefined-only"):
            target = defined.get(sym)
            if target is None or target == mod or target not in layer_of:
                continue
            if layer_of[target] > layer_of[mod]:
                problems.append(f"{obj}: layer {layer_of[mod]} module {mod} calls {sym} of "
                                f"layer {layer_of[target]} module {target}")
            edges.add((mod, target))
    return edges


def circles(edges):
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    layers, objs = argv[1], argv[2:]
    problems = []
    layer_of = read_layers(layers, problems)
    edges = include_edges(os.path.dirname(os.path.abspath(layers)), layer_of, problems)
    edges |= symbol_edges(objs, layer_of, problems)
    for c in circles(edges):
        problems.append("a circle among the shim's modules: " + " -> ".join(c))
    for p in problems:
        print(f"layers: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
