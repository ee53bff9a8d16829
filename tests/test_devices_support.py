"""Support verdicts of every recorded probe, pinned: moving the rules into one file per vendor
(strata.hardware.vendors) must not change a word of any verdict.

`fixtures/support_verdicts.json` was written by the rules as they stood before the move
(`python tests/test_devices_support.py` rewrites it; do that only for an intended change).
Each recorded GPU (and the CPU) is judged under several software stacks and smoke outcomes,
so the stack gate, every vendor's rules and the rules-vs-smoke merge are all covered.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from strata.hardware.profile import HostProfile, SmokeResult
from strata.hardware.support import smoke_device_for, verdict_for

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "support_verdicts.json"

SMOKES: dict[str, dict[str, Any] | None] = {
    "none": None,
    "pass": {"ok": True, "dtypes_ok": ["float32", "float16", "bfloat16"]},
    "bf16_fail": {"ok": False, "dtypes_ok": ["float32", "float16"],
                  "dtypes_failed": {"bfloat16": "silent_nan"}},
    "no_kernel": {"ok": False, "failure_class": "missing_kernel_image", "detail": "x"},
    "invalid_fn": {"ok": False, "failure_class": "invalid_device_function", "detail": "y"},
}
STACKS: dict[str, dict[str, Any]] = {
    "recorded": {}, "no_torch": {"torch": None}, "cpu_build": {"torch_build": "cpu"},
    "unknown_build": {"torch_build": None}, "no_arch_list": {"torch_arch_list": []},
}


def verdicts() -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted((FIXTURES / "probes").glob("*.json")):
        profile = HostProfile.from_dict(json.loads(path.read_text()))
        for i, gpu in enumerate([*profile.gpus, None]):
            device = smoke_device_for(gpu) if gpu else "cpu"
            for stack, change in STACKS.items():
                sw = dataclasses.replace(profile.software, **change)
                for outcome, fields in SMOKES.items():
                    smoke = SmokeResult(device=device, seconds=1.0, **fields) if fields else None
                    verdict = dataclasses.asdict(verdict_for(gpu, sw, smoke))
                    out[f"{path.stem}/{i}/{stack}/{outcome}"] = verdict | {"smoke_device": device}
    return out


GOLDEN_VERDICTS = json.loads(GOLDEN.read_text())
NOW = verdicts()


def test_every_recorded_probe_is_covered() -> None:
    assert sorted(NOW) == sorted(GOLDEN_VERDICTS)
    statuses = {v["status"] for v in NOW.values()}
    assert statuses == {"supported", "partial", "unsupported", "unknown"}


@pytest.mark.parametrize("case", sorted(GOLDEN_VERDICTS))
def test_verdict_unchanged(case: str) -> None:
    assert NOW[case] == GOLDEN_VERDICTS[case]


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(verdicts(), indent=1, sort_keys=True))
    sys.exit(0)
