"""Before/after tables of two or more `bench.nfslab.wire` runs of one profile.

usage: python compare.py PROFILE LABEL=DIR [LABEL=DIR ...] > summary-PROFILE.md
(each DIR holds the run's wire.json; the direct arm is taken from the first).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def per_unit(run: dict) -> Counter:
    total = Counter(run["work"]) + Counter(run.get("unmount", {}))
    return Counter({k: v / run["units"] for k, v in total.items() if v})


def fmt(x: float) -> str:
    return "." if not x else f"{x:.2f}".rstrip("0").rstrip(".")


def main() -> None:
    profile = sys.argv[1]
    sets = []
    for arg in sys.argv[2:]:
        label, _, path = arg.partition("=")
        data = json.loads((Path(path) / "wire.json").read_text())
        runs = {(r["workload"], r["arm"]): r for r in data["runs"]}
        sets.append((label, runs))
    spec = json.loads((Path(sys.argv[2].partition("=")[2]) / "wire.json").read_text())["spec"]
    workloads = list(dict.fromkeys(w for w, _ in sets[0][1]))
    print(f"# NFS RPCs per file through fusethrottle, before and after ({profile})\n")
    print(
        f"{spec['files']} files of {spec['size']} bytes in {spec['dirs']} directories, stream "
        f"{spec['stream_mib']} MiB; counts per file (stream: per MiB), workload + unmount, "
        "SEQUENCE not counted; speed = NFS-direct seconds / ft seconds, same VM and run.\n"
    )
    head = ["workload", "direct"]
    for label, _ in sets:
        head += [f"ft {label}", f"x direct {label}", f"speed {label}"]
    print("| " + " | ".join(head) + " |")
    print("| --- |" + " ---: |" * (len(head) - 1))
    for w in workloads:
        d = sets[0][1][(w, "direct")]
        direct = sum(per_unit(d).values())
        row = [w, fmt(direct)]
        for _, runs in sets:
            ft, dd = runs[(w, "ft")], runs[(w, "direct")]
            n = sum(per_unit(ft).values())
            ratio = n / sum(per_unit(dd).values())
            speed = dd["seconds"] / ft["seconds"]
            row += [fmt(n), f"{ratio:.2f}x", f"{speed:.2f}x"]
        print("| " + " | ".join(row) + " |")
    for w in workloads:
        print(f"\n## {w}: RPCs per {'MiB' if w == 'stream' else 'file'} by operation\n")
        d = per_unit(sets[0][1][(w, "direct")])
        cols = [per_unit(runs[(w, "ft")]) for _, runs in sets]
        ops = sorted(set(d).union(*cols))
        print("| RPC | direct | " + " | ".join(f"ft {label}" for label, _ in sets) + " |")
        print("| --- | ---: |" + " ---: |" * len(sets))
        for op in ops:
            print(f"| {op} | {fmt(d[op])} | " + " | ".join(fmt(c[op]) for c in cols) + " |")
        print(
            f"| **total** | {fmt(sum(d.values()))} | "
            + " | ".join(fmt(sum(c.values())) for c in cols)
            + " |"
        )


if __name__ == "__main__":
    main()
