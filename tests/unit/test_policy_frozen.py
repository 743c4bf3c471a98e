"""policy.frozen: records built past their frozen __init__ are the constructor's own."""

from __future__ import annotations

import dataclasses

import pytest

from execgate.policy.frozen import frozen
from execgate.policy.growth import CallDecision
from execgate.policy.sandbox_admission import SandboxDecision, Verdict


@pytest.mark.parametrize("cls", [CallDecision, SandboxDecision])
def test_built_past_init_equals_the_constructor_s(cls: type) -> None:
    """Every class the policy builds with `frozen`: every field given, the record equals,
    hashes and prints as the constructor's, and stays frozen."""
    assert not hasattr(cls, "__post_init__") and not hasattr(cls, "__slots__")
    fields = {f.name: f"v-{f.name}" for f in dataclasses.fields(cls)}
    assert all(f.init for f in dataclasses.fields(cls))
    fast, slow = frozen(cls, **fields), cls(**fields)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert vars(fast) == vars(slow)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.reason = "changed"


def test_properties_of_a_record_built_past_init_work() -> None:
    d = frozen(SandboxDecision, sandbox_id="s", verdict=Verdict.WAITING, waited_s=1.0,
               need_bytes=10, room_bytes=4, baseline_bytes=3, call_peak_bytes=2, reason="r",
               absorbed_bytes=0)
    assert (d.start, d.short_bytes) == (False, 6)
