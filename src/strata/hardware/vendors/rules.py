"""What every vendor's support rules share: the result record, the sourced facts file and
version parsing. Rules are pure functions of a recorded `GpuInfo` + `SoftwareStack`, so
probes of machines that are not here can be checked too."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from strata.hardware.profile import GpuInfo, SoftwareStack

FACTS_PATH = Path(__file__).resolve().parent.parent / "data" / "support_facts.json"

RANK = {"supported": 0, "partial": 1, "unsupported": 2}


@dataclass
class RuleResult:
    """What the rules alone predict for one device."""

    status: str = "unknown"  # supported | partial | unsupported | unknown
    works: list[str] = field(default_factory=list)
    fails: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    remedy: str | None = None
    predicted_error: str | None = None  # the text the user would see, if we predict one

    def worsen(self, status: str) -> None:
        """Move the status towards `status` if that is worse; never improve it."""
        if self.status == "unknown" or RANK[status] > RANK.get(self.status, -1):
            self.status = status

    def add_remedy(self, text: str) -> None:
        self.remedy = text if not self.remedy else f"{self.remedy}; {text}"


Facts = dict[str, Any]
RuleFn = Callable[[GpuInfo, SoftwareStack, Facts], RuleResult]
HintFn = Callable[[GpuInfo, SoftwareStack, Facts], str]


@lru_cache(maxsize=4)
def _load_facts_file(path: str) -> Facts:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def load_facts(path: str | Path | None = None) -> Facts:
    """The sourced facts file (cached; treat the returned dict as read-only)."""
    return _load_facts_file(str(path or FACTS_PATH))


def version_tuple(text: str | None) -> tuple[int, ...]:
    """Leading numeric version: '2.5.1+rocm6.2' -> (2, 5, 1); '570.26' -> (570, 26)."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", text or "")
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def fmt_version(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def index_url(facts: Facts, variant: str) -> str:
    """The PyTorch wheel index of one variant ('cu128', 'rocm6.4')."""
    url = facts.get("pytorch_index", {}).get("url_pattern",
                                              "https://download.pytorch.org/whl/{variant}")
    return url.format(variant=variant)
