"""The engine prices every request by meter.py's rules: the same charge for every profile, class
and size (the engine does the arithmetic, the rules and the class of each request kind come from
meter.py through the ABI)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusethrottle.engine.native import (
    METER_CLASSES,
    OPERATIONS,
    engine_price,
    library_path,
    meter_classes,
)
from fusethrottle.metering.meter import (
    NEVER_WAIT,
    PROFILES,
    UNMETERED,
    Meter,
    MeterProfile,
    OpClass,
    op_class,
)

pytestmark = pytest.mark.skipif(
    not library_path().exists(), reason="the native engine is not built (scripts/install)"
)

profiles = st.builds(
    MeterProfile,
    data_min=st.integers(0, 1 << 20),
    meta_min=st.integers(0, 1 << 16),
    granule=st.integers(1, 1 << 16),
    read_factor=st.floats(1e-3, 1.0, exclude_min=False),
    read_units=st.integers(0, 10),
    write_units=st.integers(0, 10),
)


@settings(max_examples=500, deadline=None)
@given(profiles, st.sampled_from(list(OpClass)), st.integers(0, 1 << 30))
def test_the_engine_charges_what_meter_py_charges(
    profile: MeterProfile, cls: OpClass, nbytes: int
) -> None:
    assert engine_price(profile, cls, nbytes) == Meter(profile).charge(cls, nbytes)


@pytest.mark.parametrize("name", list(PROFILES))
@pytest.mark.parametrize("nbytes", [0, 1, 1023, 1024, 4097, 32767, 32768, 32769, 1 << 20])
def test_every_profile_and_edge_size_costs_the_same(name: str, nbytes: int) -> None:
    profile = PROFILES[name]
    for cls in OpClass:
        assert engine_price(profile, cls, nbytes) == Meter(profile).charge(cls, nbytes)


def test_each_request_kind_is_metered_in_meter_pys_class() -> None:
    for op, code in zip(OPERATIONS, meter_classes(), strict=True):
        cls = code & 0x0F
        if op in UNMETERED:
            assert cls == 0, op
        else:
            assert cls == METER_CLASSES[op_class(op)], op
        assert bool(code & 0x80) == (op in NEVER_WAIT), op
    # A listing with attributes is a read of metadata, as a plain one (not the default write).
    assert op_class("readdirplus") is OpClass.META_READ
