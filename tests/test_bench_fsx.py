"""bench.fsx_fsstress judges fsstress by the tree: what the mount showed must be what the target
holds after the unmount. A changed byte, a lost name, a mode or a link count that differs must
each fail the arm, and so must a daemon that did not exit 0 or a failed fsx run."""

from __future__ import annotations

import os
from pathlib import Path

from bench.fsx_fsstress import differences, manifest, passed


def tree(root: Path) -> Path:
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"x" * 5000)
    os.link(root / "d" / "f", root / "d" / "hard")
    os.symlink("f", root / "d" / "s")
    return root


def test_the_same_tree_twice_has_no_differences(tmp_path: Path) -> None:
    a, b = tree(tmp_path / "a"), tree(tmp_path / "b")
    assert differences(manifest(a), manifest(b)) == []


def test_a_byte_a_name_a_mode_and_a_link_count_each_differ(tmp_path: Path) -> None:
    seen = manifest(tree(tmp_path / "a"))
    for change in ("byte", "name", "mode", "link"):
        held_root = tree(tmp_path / change)
        f = held_root / "d" / "f"
        if change == "byte":
            f.write_bytes(b"x" * 4999 + b"y")  # same size
        elif change == "name":
            os.unlink(held_root / "d" / "s")
        elif change == "mode":
            f.chmod(0o600)
        else:
            os.unlink(held_root / "d" / "hard")
        found = differences(seen, manifest(held_root))
        assert found, change
        if change == "name":
            assert found[0].startswith("d/s:")


def test_an_arm_passes_only_with_every_run_ok_the_same_tree_and_a_clean_exit() -> None:
    ok = {"ok": True, "exit_code": 0, "seconds": 1.0, "tail": []}
    bad = {"ok": False, "exit_code": 1, "seconds": 1.0, "tail": ["READ BAD DATA"]}
    good = {"runs": {"fsx seed1": ok}, "tree_differences": [], "exit_code": 0}
    assert passed({"direct": {"runs": {"fsx seed1": ok}}, "native": good})
    assert not passed({"native": {**good, "runs": {"fsx seed1": bad}}})
    assert not passed({"native": {**good, "tree_differences": ["d/f: ..."]}})
    assert not passed({"native": {**good, "exit_code": 1}})
    assert passed({"native": {"skipped": "no FUSE"}})
