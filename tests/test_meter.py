"""EFS-style metering: exact numbers, then properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusethrottle.metering.meter import PROFILES, Charge, Meter, MeterProfile, OpClass, profile

KiB = 1024
MiB = 1024 * KiB


def efs() -> Meter:
    return Meter(profile("efs"))


# --- EFS's current rules, as a user would check them against the AWS documentation ---------


def test_a_one_byte_write_costs_a_full_32_kib_and_five_units() -> None:
    assert efs().charge(OpClass.DATA_WRITE, 1) == Charge(32 * KiB, 5)


def test_data_above_the_minimum_is_metered_per_started_kib() -> None:
    assert efs().charge(OpClass.DATA_WRITE, 100 * KiB + 1).metered_bytes == 101 * KiB
    assert efs().charge(OpClass.DATA_WRITE, 1 * MiB).metered_bytes == 1 * MiB


def test_reads_are_metered_at_a_third_and_cost_one_unit() -> None:
    assert efs().charge(OpClass.DATA_READ, 1 * MiB) == Charge(math.ceil(MiB / 3), 1)
    assert efs().charge(OpClass.DATA_READ, 1) == Charge(math.ceil(32 * KiB / 3), 1)


def test_metadata_is_metered_at_4_kib_reads_cost_1_unit_updates_5() -> None:
    assert efs().charge(OpClass.META_READ, 0) == Charge(math.ceil(4 * KiB / 3), 1)
    assert efs().charge(OpClass.META_WRITE, 0) == Charge(4 * KiB, 5)
    # a readdir reply larger than the minimum is metered by its size
    assert efs().charge(OpClass.META_READ, 10 * KiB).metered_bytes == math.ceil(10 * KiB / 3)


def test_seven_thousand_small_writes_use_the_whole_general_purpose_budget() -> None:
    meter = efs()
    for _ in range(7000):
        meter.record(OpClass.DATA_WRITE, 1)
    assert meter.snapshot()[OpClass.DATA_WRITE].units == 35_000


def test_legacy_profile_counts_every_request_as_at_least_4_kib() -> None:
    legacy = Meter(profile("efs-legacy"))
    assert legacy.charge(OpClass.DATA_WRITE, 1) == Charge(4 * KiB, 5)
    assert legacy.charge(OpClass.META_WRITE, 0) == Charge(4 * KiB, 5)


def test_none_profile_meters_raw_bytes_and_counts_requests() -> None:
    raw = Meter(profile("none"))
    assert raw.charge(OpClass.DATA_WRITE, 1) == Charge(1, 1)
    assert raw.charge(OpClass.DATA_READ, 12345) == Charge(12345, 1)
    assert raw.charge(OpClass.META_READ, 0) == Charge(0, 1)


def test_every_number_can_be_overridden() -> None:
    p = profile("efs", data_min=64 * KiB, write_units=3, read_factor=0.5)
    assert Meter(p).charge(OpClass.DATA_WRITE, 1) == Charge(64 * KiB, 3)
    assert Meter(p).charge(OpClass.DATA_READ, 64 * KiB).metered_bytes == 32 * KiB


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        ("efs2", {}, "unknown meter profile"),
        ("efs", {"data_minimum": 1}, "unknown meter setting"),
        ("efs", {"read_factor": 0.0}, "read_factor"),
        ("efs", {"granule": 0}, "granule"),
        ("efs", {"meta_min": -1}, "minimums"),
    ],
)
def test_bad_profiles_are_one_clear_error(name: str, overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        profile(name, **overrides)


def test_record_counts_ops_bytes_metered_bytes_and_units_per_class() -> None:
    meter = efs()
    meter.record(OpClass.DATA_WRITE, 1)
    meter.record(OpClass.DATA_WRITE, 64 * KiB)
    meter.record(OpClass.META_READ, 0)
    snap = meter.snapshot()
    assert snap[OpClass.DATA_WRITE].ops == 2
    assert snap[OpClass.DATA_WRITE].bytes == 64 * KiB + 1
    assert snap[OpClass.DATA_WRITE].metered_bytes == 96 * KiB
    assert snap[OpClass.DATA_WRITE].units == 10
    assert snap[OpClass.META_READ].ops == 1
    assert snap[OpClass.DATA_READ].ops == 0
    assert snap.total.ops == 3
    assert snap.total.units == 11


def test_charge_alone_records_nothing_and_snapshots_do_not_change_later() -> None:
    meter = efs()
    meter.charge(OpClass.DATA_WRITE, 1)
    before = meter.snapshot()
    assert before.total.ops == 0
    meter.record(OpClass.DATA_WRITE, 1)
    assert before.total.ops == 0
    assert meter.snapshot().total.ops == 1


# --- properties -------------------------------------------------------------------------------

profiles = st.builds(
    MeterProfile,
    data_min=st.integers(0, 1 * MiB),
    meta_min=st.integers(0, 64 * KiB),
    granule=st.integers(1, 64 * KiB),
    read_factor=st.floats(0.01, 1.0),
    read_units=st.integers(0, 10),
    write_units=st.integers(0, 10),
)
ops = st.sampled_from(list(OpClass))
sizes = st.integers(0, 64 * MiB)


@given(profiles, ops, sizes)
def test_a_request_is_never_metered_below_its_size_or_minimum(
    p: MeterProfile, op: OpClass, nbytes: int
) -> None:
    charge = Meter(p).charge(op, nbytes)
    floor = max(nbytes, p.data_min if op.is_data else p.meta_min)
    factor = p.read_factor if op.is_read else 1.0
    assert charge.metered_bytes >= floor * factor - 1e-6
    assert charge.units == (p.read_units if op.is_read else p.write_units)


@given(profiles, ops, sizes, sizes)
def test_a_bigger_request_never_costs_less(p: MeterProfile, op: OpClass, a: int, b: int) -> None:
    small, big = sorted((a, b))
    meter = Meter(p)
    assert meter.charge(op, small).metered_bytes <= meter.charge(op, big).metered_bytes


@given(st.sampled_from(sorted(PROFILES)), st.lists(st.tuples(ops, sizes), max_size=50))
def test_counters_are_the_sum_of_the_charges(name: str, requests: list) -> None:
    meter = Meter(profile(name))
    charges = [(op, n, meter.record(op, n)) for op, n in requests]
    snap = meter.snapshot()
    for op in OpClass:
        mine = [(n, c) for o, n, c in charges if o is op]
        assert snap[op].ops == len(mine)
        assert snap[op].bytes == sum(n for n, _ in mine)
        assert snap[op].metered_bytes == sum(c.metered_bytes for _, c in mine)
        assert snap[op].units == sum(c.units for _, c in mine)
