"""Derive the Debian package's metadata from pyproject.toml, so there is one place to edit.

Usage: ``debmeta.py PYPROJECT WHAT`` where WHAT is one of

- ``version``       the project version as written (PEP 440), for the dist-info directory name;
- ``deb-version``   the same in Debian's ordering (``1.0rc1`` -> ``1.0~rc1``);
- ``depends``       the Depends: line's start (python3, every runtime dependency as a Debian
                    package, fuse3; build-deb.sh adds the engine's shared libraries);
- ``recommends``    the Recommends: line (the ``redis`` extra: what ``budget=`` needs);
- ``scripts``       ``NAME MODULE FUNCTION`` per console script, one per line;
- ``metadata``      a core-metadata METADATA file, so ``importlib.metadata`` knows the package;
- ``entry-points``  the dist-info entry_points.txt.

Runs on the build machine's /usr/bin/python3 (3.11: tomllib) and uses nothing outside stdlib.
"""

from __future__ import annotations

import re
import sys
import tomllib
from typing import Any

# Runtime packages that are not named python3-<normalised PyPI name> in Debian go here.
_DEBIAN_NAMES: dict[str, str] = {}
# Debian packages needed beside the Python ones: fuse3 brings fusermount3 and mount.fuse3. The
# libraries the native engine links (libfuse3-3 on Debian 12, libfuse3-4 on 13, the C++
# runtime) are not named here: build-deb.sh asks dpkg-shlibdeps about the engine as built.
_EXTRA_DEPENDS = ["fuse3"]
_REQ_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:>=\s*([0-9][0-9A-Za-z.]*))?\s*$")


def deb_version(version: str) -> str:
    """PEP 440 pre- and dev-releases sort before the release; in Debian that takes a tilde."""
    version = re.sub(r"\.?(dev|a|b|rc)(\d*)", r"~\1\2", version)
    if not re.fullmatch(r"[0-9][A-Za-z0-9.+~]*", version):
        raise SystemExit(f"debmeta: cannot turn version {version!r} into a Debian version")
    return version


def debian_name(requirement: str) -> tuple[str, str | None]:
    """``prometheus_client>=0.16`` -> (``python3-prometheus-client``, ``0.16``)."""
    m = _REQ_RE.match(requirement)
    if not m:
        raise SystemExit(
            f"debmeta: dependency {requirement!r} is not NAME or NAME>=VERSION; "
            "extend packaging/debmeta.py to map it to a Debian package"
        )
    name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
    return _DEBIAN_NAMES.get(name, f"python3-{name}"), m.group(2)


def depends(project: dict[str, Any]) -> str:
    """Debian's own packages for every runtime dependency: no vendored virtualenv."""
    out = []
    m = re.fullmatch(r"\s*>=\s*(\d+(?:\.\d+)*)\s*", project.get("requires-python", ""))
    out.append(f"python3 (>= {m.group(1)})" if m else "python3")
    for requirement in project.get("dependencies", []):
        package, minimum = debian_name(requirement)
        out.append(f"{package} (>= {minimum})" if minimum else package)
    out.extend(_EXTRA_DEPENDS)
    return ", ".join(out)


#: Optional features whose Python packages the .deb recommends rather than depends on.
_RECOMMENDED_EXTRAS = ("redis",)


def recommends(project: dict[str, Any]) -> str:
    """Debian's packages for the optional features (``budget=redis://...`` needs python3-redis)."""
    out = []
    extras = project.get("optional-dependencies", {})
    for extra in _RECOMMENDED_EXTRAS:
        for requirement in extras.get(extra, []):
            package, minimum = debian_name(requirement)
            out.append(f"{package} (>= {minimum})" if minimum else package)
    return ", ".join(out)


def scripts(project: dict[str, Any]) -> str:
    lines = []
    for name, target in project.get("scripts", {}).items():
        module, _, function = target.partition(":")
        if not module or not function.isidentifier():
            raise SystemExit(f"debmeta: console script {name} = {target!r} is not module:function")
        lines.append(f"{name} {module} {function}")
    return "\n".join(lines)


def metadata(project: dict[str, Any]) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
    ]
    if "description" in project:
        lines.append(f"Summary: {project['description']}")
    license_text = _license(project)
    if license_text:
        lines.append(f"License: {license_text}")
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    lines.extend(f"Requires-Dist: {r}" for r in project.get("dependencies", []))
    return "\n".join(lines)


def _license(project: dict[str, Any]) -> str | None:
    """``license = "Apache-2.0"`` (an SPDX expression, PEP 639) or the older table form
    ``license = { text = "..." }``. Either goes to the License field: Metadata-Version 2.1 has
    no License-Expression, and 2.1 is what Debian 12's pip and importlib read without a word."""
    value = project.get("license")
    if isinstance(value, dict):
        value = value.get("text")
    return value or None


def entry_points(project: dict[str, Any]) -> str:
    items = project.get("scripts", {})
    return "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in items.items())


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], "rb") as f:
        project = tomllib.load(f)["project"]
    what = argv[2]
    producers = {
        "version": lambda: project["version"],
        "deb-version": lambda: deb_version(project["version"]),
        "depends": lambda: depends(project),
        "recommends": lambda: recommends(project),
        "scripts": lambda: scripts(project),
        "metadata": lambda: metadata(project),
        "entry-points": lambda: entry_points(project).rstrip("\n"),
    }
    if what not in producers:
        print(f"debmeta: unknown field {what!r}; one of {', '.join(producers)}", file=sys.stderr)
        return 2
    print(producers[what]())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
