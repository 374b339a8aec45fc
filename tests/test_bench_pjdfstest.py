"""bench.pjdfstest reads prove's summary right: a test the target passes and a mount fails is
what the report exists to show, so a wrapped list of failures must not lose its tail, and the
tests prove lists as passed TODOs are not failures."""

from __future__ import annotations

from bench.pjdfstest import numbers, parse_prove, worse_than_direct

PROVE = """\
/t/tests/chmod/00.t .......... ok
/t/tests/chown/00.t .......... Failed 9/1280 subtests
/t/tests/open/06.t ........... Failed 2/144 subtests

Test Summary Report
-------------------
/t/tests/chown/00.t          (Wstat: 0 Tests: 1280 Failed: 9)
  Failed tests:  105-108, 114
                1040-1042, 1277
  TODO passed:   1069, 1073
/t/tests/open/06.t           (Wstat: 256 Tests: 144 Failed: 2)
  Failed tests:  114, 116
Files=3, Tests=1543, 30 wallclock secs ( 0.10 usr  0.01 sys +  1.00 cusr  1.00 csys =  2.11 CPU)
Result: FAIL
"""


def test_ranges_and_wrapped_lists_of_failed_tests_are_all_counted() -> None:
    assert numbers("1, 3-5, 9") == [1, 3, 4, 5, 9]
    parsed = parse_prove(PROVE, "/t/tests")
    assert parsed["files"] == 3
    assert parsed["tests"] == 1543
    assert parsed["failed"] == {
        "chown/00.t": [105, 106, 107, 108, 114, 1040, 1041, 1042, 1277],
        "open/06.t": [114, 116],
    }
    assert parsed["bad_exit"] == ["open/06.t"]


def test_only_what_fails_through_the_mount_and_not_directly_is_a_regression() -> None:
    mount = parse_prove(PROVE, "/t/tests")
    direct = {"failed": {"chown/00.t": [105, 106, 107, 108, 114, 1040, 1041, 1042]}}
    assert worse_than_direct(mount, direct) == {"chown/00.t": [1277], "open/06.t": [114, 116]}
