#!/usr/bin/env python3
"""Content-preserving reorder of a Go-1.15-era vendor/modules.txt for Go >= 1.21.

Kubernetes 1.20's vendor/modules.txt has package lines sitting under wildcard
"# path => replacement" headers; newer Go attributes them to a module without a
version and refuses the file. Every package line is moved under the versioned
"# path version [=> ...]" header of the module that owns it (longest path prefix);
wildcard headers go last. No line is added or dropped.
"""

import sys

path = sys.argv[1] if len(sys.argv) > 1 else "vendor/modules.txt"
with open(path) as source:
    lines = source.read().splitlines()

versioned = []  # [header, [## lines], [packages]]
wildcards = []
packages = []
cur = None
for ln in lines:
    if ln.startswith("## "):
        if cur is None:
            raise SystemExit(f"annotation outside a versioned module: {ln}")
        cur[1].append(ln)
    elif ln.startswith("# "):
        f = ln[2:].split()
        if len(f) >= 3 and f[1] == "=>":
            wildcards.append(ln)
            cur = None
        else:
            cur = [ln, [], []]
            versioned.append(cur)
    elif ln.strip():
        packages.append(ln)

by_path = {v[0][2:].split()[0]: v for v in versioned}
for p in packages:
    best = None
    for mod in by_path:
        if (p == mod or p.startswith(mod + "/")) and (best is None or len(mod) > len(best)):
            best = mod
    if best is None:
        raise SystemExit(f"no module for package {p}")
    by_path[best][2].append(p)

out = []
for h, ann, pk in versioned:
    out.append(h)
    out.extend(ann)
    out.extend(pk)
out.extend(wildcards)
assert sorted(out) == sorted(line for line in lines if line.strip()), "content changed"
with open(path, "w") as target:
    target.write("\n".join(out) + "\n")
print(f"{len(versioned)} modules, {len(packages)} packages, {len(wildcards)} wildcard replacements")
