"""Compare the PTX of two sets of plans up to label numbering and kernel symbol names.

usage: plan_ptx.py BASE_DIR NEW_DIR        (each holding the same *.plan file names)

For each plan and each target, the PTX is cut into its kernels (`.entry NAME(` ... the closing
brace); in each kernel the symbol becomes KERNEL and the labels are renumbered in order of
first appearance; the module-level lines (version, target, address size, shared-memory and
global declarations, with kernel names stripped) are compared as they are. The two plans match
when their sets of normalized kernels are equal; the kernels are then paired by content and
the renamed ones listed. Exit 0 when every plan matches, 1 otherwise.
"""
import json
import re
import struct
import sys
from pathlib import Path


def header(path):
    with open(path, "rb") as f:
        pre = f.read(104)
        if pre[:8] != b"DSCPLAN\0":
            sys.exit(f"{path}: not a dsc plan")
        hlen = struct.unpack_from("<Q", pre, 16)[0]
        return json.loads(f.read(hlen))


ENTRY = re.compile(r"^\.(?:visible |weak )?\.entry ([A-Za-z0-9_$.]+)\(", re.M)
LABEL = re.compile(r"\$L__[A-Za-z]+\d+(?:_\d+)?")


def split(ptx):
    """(module-level text, {name: kernel text})"""
    starts = [(m.start(), m.group(1)) for m in ENTRY.finditer(ptx)]
    kernels = {}
    module = ptx[: starts[0][0]] if starts else ptx
    for i, (s, name) in enumerate(starts):
        e = starts[i + 1][0] if i + 1 < len(starts) else len(ptx)
        text = ptx[s:e]
        # (the kernel ends at its closing brace at column 0; what follows is module level)
        end = text.rfind("\n}\n")
        if end >= 0:
            module += text[end + 3 :]
            text = text[: end + 3]
        kernels[name] = text
    return module, kernels


def normalize(name, text):
    text = text.replace(name, "KERNEL")
    seen = {}
    return LABEL.sub(lambda m: seen.setdefault(m.group(0), f"$L{len(seen)}"), text)


def module_norm(module, names):
    for n in sorted(names, key=len, reverse=True):
        module = module.replace(n, "KERNEL")
    return "\n".join(l for l in module.splitlines() if l.strip() and not l.startswith("//"))


def compare(a, b):
    """list of problems, list of (old name, new name) renames"""
    (ma, ka), (mb, kb) = split(a), split(b)
    problems, renames = [], []
    if module_norm(ma, ka) != module_norm(mb, kb):
        problems.append("module-level lines differ")
    na = {}
    for n, t in ka.items():
        na.setdefault(normalize(n, t), []).append(n)
    nb = {}
    for n, t in kb.items():
        nb.setdefault(normalize(n, t), []).append(n)
    for t, names in na.items():
        other = nb.get(t)
        if not other or len(other) != len(names):
            problems.append(f"kernel {names[0]}: no identical kernel in the new PTX")
            continue
        renames += [(x, y) for x, y in zip(sorted(names), sorted(other)) if x != y]
    for t, names in nb.items():
        if t not in na:
            problems.append(f"kernel {names[0]}: new, not in the base PTX")
    return problems, renames, len(ka), len(kb)


def main():
    base, new = Path(sys.argv[1]), Path(sys.argv[2])
    bad = 0
    for p in sorted(base.glob("*.plan")):
        q = new / p.name
        ha, hb = header(p), header(q)
        pa, pb = (ha.get("gpu") or {}).get("ptx", {}), (hb.get("gpu") or {}).get("ptx", {})
        if sorted(pa) != sorted(pb):
            print(f"{p.name}: targets {sorted(pa)} vs {sorted(pb)}")
            bad += 1
            continue
        all_renames = {}
        for t in sorted(pa):
            problems, renames, n, m = compare(pa[t], pb[t])
            all_renames.update(renames)
            status = "identical up to labels and symbols" if not problems else "DIFFERENT"
            print(f"{p.name} {t}: {n} vs {m} kernels, {status}; {len(renames)} renamed")
            for x, y in renames[:20]:
                print(f"    {x} -> {y}")
            for pr in problems[:20]:
                print(f"    {pr}")
            bad += bool(problems)
        # the launch schedule beside the PTX: steps, buffers, argmax entries, kernel symbols
        # mapped through the renames found above (the recorded codegen options left out)
        def schedule(h, renames):
            g = dict(h.get("gpu") or {})
            g.pop("ptx", None)
            g.pop("codegen_options", None)
            text = json.dumps(g, sort_keys=True)
            for x, y in sorted(renames.items(), key=lambda r: -len(r[0])):
                text = text.replace(f'"{x}"', f'"{y}"')
            return text
        same = schedule(ha, all_renames) == schedule(hb, {})
        print(f"{p.name} schedule: {'identical' if same else 'DIFFERENT'} ({len((hb.get('gpu') or {}).get('steps', []))} steps)")
        bad += not same
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
