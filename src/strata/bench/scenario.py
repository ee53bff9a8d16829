"""llama-bench taxonomy: pp<N>, tg<M>, pp<N>+tg<M>, each optionally @d<D>; flag parsing.

Lists and ranges follow llama-bench: "128,512", "1-4" (every integer), "128-1024*2"
(geometric), "0-64+16" (arithmetic). The sweep is a cartesian product.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from strata.errors import InputError

_RANGE = re.compile(r"^(\d+)-(\d+)(?:([*+])(\d+))?$")
NONE_WORDS = ("none", "")
MAX_VALUES = 1000


@dataclass(frozen=True, order=True)
class BenchTest:
    n_prompt: int
    n_gen: int
    depth: int = 0

    @property
    def kind(self) -> str:
        if self.n_prompt and self.n_gen:
            return "pg"
        return "pp" if self.n_prompt else "tg"

    @property
    def name(self) -> str:
        base = {"pp": f"pp{self.n_prompt}", "tg": f"tg{self.n_gen}",
                "pg": f"pp{self.n_prompt}+tg{self.n_gen}"}[self.kind]
        return f"{base} @ d{self.depth}" if self.depth else base

    @property
    def primary_metric(self) -> str:
        """The t/s figure that names this test, as llama-bench reports it."""
        return {"pp": "prefill_tps", "tg": "decode_tps", "pg": "combined_tps"}[self.kind]

    @property
    def context(self) -> int:
        """Tokens the KV cache must hold at the end of the test."""
        return self.depth + self.n_prompt + self.n_gen


def parse_int_list(flag: str, text: str, minimum: int = 0) -> list[int]:
    """'128,512' / '1-4' / '128-1024*2' / '0-64+16' -> sorted unique ints, each >= minimum."""
    if text.strip().lower() in NONE_WORDS:
        return []
    values: list[int] = []
    for part in text.split(","):
        values.extend(_parse_part(flag, part.strip()))
    bad = [v for v in values if v < minimum]
    if bad:
        raise InputError(f"{flag} {text}: values must be >= {minimum} (got {bad[0]})")
    return sorted(set(values))


def _parse_part(flag: str, part: str) -> list[int]:
    if re.fullmatch(r"-?\d+", part):
        return [int(part)]
    m = _RANGE.match(part)
    if not m:
        raise InputError(f"{flag} {part}: expected N, N,M, A-B, A-B*K or A-B+K")
    lo, hi, op, step = int(m[1]), int(m[2]), m[3], int(m[4] or 1)
    if hi < lo or (op == "*" and (step < 2 or lo < 1)) or step < 1:
        raise InputError(f"{flag} {part}: empty or endless range")
    out, v = [], lo
    while v <= hi:
        out.append(v)
        if len(out) > MAX_VALUES:  # stop counting: a sweep this long is a typo
            raise InputError(f"{flag} {part}: more than {MAX_VALUES} values; narrow the range")
        v = v * step if op == "*" else v + step
    return out


def parse_pairs(flag: str, items: list[str]) -> list[tuple[int, int]]:
    """--pg 512,128 (repeatable) -> [(512, 128)]."""
    pairs = []
    for item in items:
        parts = item.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise InputError(f"{flag} {item}: expected PROMPT,GEN such as 512,128")
        p, n = int(parts[0]), int(parts[1])
        if p < 1 or n < 1:
            raise InputError(f"{flag} {item}: both sizes must be >= 1")
        pairs.append((p, n))
    return pairs


def build_tests(prompts: list[int], gens: list[int], pairs: list[tuple[int, int]],
                depths: list[int]) -> list[BenchTest]:
    """Every pp, tg and pp+tg test at every depth, in llama-bench's order."""
    tests = [BenchTest(p, 0, d) for d in depths for p in prompts]
    tests += [BenchTest(0, n, d) for d in depths for n in gens]
    tests += [BenchTest(p, n, d) for d in depths for p, n in pairs]
    if not tests:
        raise InputError("no tests selected: give -p, -n or --pg sizes")
    return tests
