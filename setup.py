"""Builds the native engine into every install: pip install, an sdist, a wheel, pipx.

The engine (fusethrottle/engine/src, C++ on libfuse3) is a plain shared library that native.py
loads with ctypes, not a Python extension module. It is compiled by its own Makefile, the one
place its flags live (the development flow, the sanitized build and the .deb use it too), into
the wheel at fusethrottle/engine/libfusethrottle_engine.so, beside native.py. An editable
install builds it in the source tree, where native.py looks. docs/DESIGN.md says why setuptools.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ENGINE = HERE / "fusethrottle" / "engine"
LIBRARY = "libfusethrottle_engine"
#: The oldest libfuse whose API the engine asks for (Makefile: FUSE_USE_VERSION=314).
FUSE_AT_LEAST = "3.14"
NEEDS = (
    "fusethrottle: building the engine needs libfuse3's development files, found through "
    "pkg-config, g++ and make (Debian: apt-get install libfuse3-dev pkg-config g++ make)"
)


def _problem() -> str | None:
    """What the machine lacks to build the engine, as one line, or None."""
    pkg_config = shlex.split(os.environ.get("PKG_CONFIG") or "pkg-config")
    for tool in (pkg_config[0], shlex.split(os.environ.get("CXX") or "g++")[0], "make"):
        if not shutil.which(tool):
            return f"{NEEDS}: {tool} is not installed"
    try:
        found = subprocess.run([*pkg_config, "--exists", "fuse3"], capture_output=True).returncode
        if found != 0:
            return f"{NEEDS}: pkg-config finds no fuse3"
        version = subprocess.run(
            [*pkg_config, "--modversion", "fuse3"], capture_output=True, text=True
        ).stdout.strip()
        if subprocess.run([*pkg_config, f"--atleast-version={FUSE_AT_LEAST}", "fuse3"]).returncode:
            return (
                f"fusethrottle: the engine needs libfuse {FUSE_AT_LEAST} or later; "
                f"pkg-config finds fuse3 {version or 'of no version'}"
            )
    except OSError as err:
        return f"{NEEDS}: {pkg_config[0]}: {err.strerror}"
    return None


class BuildEngine(build_ext):
    """build_ext that makes the engine with its Makefile instead of the Python extension rules."""

    def get_ext_filename(self, fullname: str) -> str:
        # libfusethrottle_engine.so, not .cpython-311-x86_64-linux-gnu.so: no Python ABI in it.
        if fullname.rsplit(".", 1)[-1] == LIBRARY:
            return os.path.join(*fullname.split(".")) + ".so"
        return str(super().get_ext_filename(fullname))

    def build_extension(self, ext: Extension) -> None:
        if ext.name.rsplit(".", 1)[-1] != LIBRARY:
            super().build_extension(ext)
            return
        problem = _problem()
        if problem:
            raise SystemExit(problem)
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        # An editable install leaves the library in the tree, where make keeps it current
        # (scripts/install): build it there, a no-op when it is current, and hand over a copy.
        built = ENGINE / f"{LIBRARY}.so" if self.editable_mode else target
        command = ["make", "-s", "-C", str(ENGINE), f"LIB={built}"]
        if subprocess.run(command).returncode:
            raise SystemExit(f"fusethrottle: the engine does not compile ({shlex.join(command)})")
        if built != target:
            shutil.copy2(built, target)


class PlatformWheel(bdist_wheel):
    """The wheel holds a library of this machine's architecture, but runs on any Python 3."""

    def get_tag(self) -> tuple[str, str, str]:
        return "py3", "none", super().get_tag()[2]


setup(
    ext_modules=[
        Extension(
            f"fusethrottle.engine.{LIBRARY}",
            sources=sorted(str(p.relative_to(HERE)) for p in (ENGINE / "src").glob("*.cc")),
        )
    ],
    cmdclass={"build_ext": BuildEngine, "bdist_wheel": PlatformWheel},
)
