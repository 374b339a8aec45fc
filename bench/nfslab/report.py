"""The tables of a lab test run: per test, its outcome on each profile (NFSv3, v4.1), and what it
saw through the mount next to NFS directly.

``python -m bench.nfslab.report OUT`` reads ``OUT/PROFILE/*.xml`` (pytest's junit report, with
the tests' own printed comparisons) and ``OUT/PROFILE/observations.jsonl`` (tests/nfs/lab.py's
``record``), and writes ``OUT/tables.md``. Nothing here runs a test: it only reads what a
``run correctness`` left.
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

#: tests/nfs files in the order of the issue's items.
ITEMS = {
    "test_posix_tools": "1. POSIX tools and data integrity",
    "test_names": "2. Names the daemon still holds",
    "test_other_client": "3. Another writer",
    "test_squash_credentials": "4. Credentials on squashing exports",
    "test_nfs_open_write_only": "4. Credentials: a write-only open",
    "test_hung_server": "5. A server that stops",
    "test_full_server": "6. A full server and quota",
    "test_smoke": "CI smoke",
}


def outcomes(xml: Path) -> dict[str, tuple[str, float, str]]:
    """Test id -> (outcome, seconds, printed output) from one junit file."""
    found = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[tag]
        out = case.findtext("system-out") or ""
        found[name] = (outcome, float(case.get("time", 0)), out)
    return found


def _cell(text: str, limit: int = 300) -> str:
    text = re.sub(r"-+ Captured \w+ -+", " ", text)
    text = " ".join(text.split())
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return text.replace("|", "\\|")


def tables(out: Path) -> str:
    profiles = sorted(p.name for p in out.iterdir() if p.is_dir())
    runs: dict[str, dict[str, tuple[str, float, str]]] = {p: {} for p in profiles}
    for profile in profiles:
        for xml in sorted((out / profile).glob("*.xml")):
            runs[profile].update(outcomes(xml))
    by_file: dict[str, list[str]] = defaultdict(list)
    for name in sorted({n for r in runs.values() for n in r}):
        by_file[name.split("::")[0]].append(name)
    lines = [f"# NFS lab: {', '.join(profiles)}", ""]
    totals = {
        p: f"{sum(o[0] == 'passed' for o in r.values())} passed, "
        f"{sum(o[0] in ('FAILED', 'ERROR') for o in r.values())} failed, "
        f"{sum(o[0] == 'skipped' for o in r.values())} skipped"
        for p, r in runs.items()
    }
    lines += [f"- {p}: {t}" for p, t in totals.items()] + [""]
    for module in sorted(by_file, key=lambda m: list(ITEMS).index(m) if m in ITEMS else 99):
        lines += [f"## {ITEMS.get(module, module)} (`tests/nfs/{module}.py`)", ""]
        lines.append("| test | " + " | ".join(profiles) + " | seen (last profile) |")
        lines.append("|---|" + "---|" * len(profiles) + "---|")
        for name in by_file[module]:
            cells = []
            seen = ""
            for p in profiles:
                outcome, seconds, printed = runs[p].get(name, ("-", 0.0, ""))
                cells.append(f"{outcome} ({seconds:.0f} s)" if outcome != "-" else "-")
                seen = printed or seen
            test = name.split("::", 1)[1]
            lines.append(f"| {test} | " + " | ".join(cells) + f" | {_cell(seen)} |")
        lines.append("")
    observed = [
        json.loads(line)
        for p in profiles
        if (out / p / "observations.jsonl").exists()
        for line in (out / p / "observations.jsonl").read_text().splitlines()
        if line.strip()
    ]
    if observed:
        lines += ["## Observations: NFS directly next to through the mount", ""]
        lines += ["| test | NFS | directly | through the mount |", "|---|---|---|---|"]
        for o in observed:
            direct = o.get("direct")
            through = o.get("through", o.get("mount"))
            if direct is None and through is None:
                rest = {k: v for k, v in o.items() if k not in ("test", "profile", "nfs")}
                lines.append(f"| {o['test']} | {o['nfs']} | - | {_cell(json.dumps(rest))} |")
            else:
                lines.append(
                    f"| {o['test']} | {o['nfs']} | {_cell(json.dumps(direct))} | "
                    f"{_cell(json.dumps(through))} |"
                )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python -m bench.nfslab.report OUT (a run's --out directory)", file=sys.stderr)
        return 2
    out = Path(argv[0])
    (out / "tables.md").write_text(tables(out))
    print(out / "tables.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
