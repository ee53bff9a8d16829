"""Rank profiles: a workload and what makes it usable, as data (profiles/*.json).

A profile names the bench tests it needs (a prompt of P tokens answered in G tokens, at each
context depth D) and its targets: prompt t/s, generation t/s and time to first token. The
targets are what makes the workload "usable"; the score (score.py) is measured against them,
so one profile's scores compare across models and across hosts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from strata.bench.scenario import BenchTest
from strata.errors import InputError


@dataclass(frozen=True)
class Targets:
    prompt_ts: float  # prompt tokens per second
    gen_ts: float  # generated tokens per second (reading speed for chat)
    ttft_s: float  # seconds from request to first generated token


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    prompt_tokens: int
    gen_tokens: int
    depths: tuple[int, ...]
    targets: Targets
    why: str

    def tests(self) -> list[BenchTest]:
        """The bench tests this profile reads: pp<P> and tg<G> at every depth."""
        return [t for d in self.depths
                for t in (BenchTest(self.prompt_tokens, 0, d), BenchTest(0, self.gen_tokens, d))]

    @property
    def context(self) -> int:
        """Tokens the KV cache must hold for the deepest test."""
        return max(self.depths) + max(self.prompt_tokens, self.gen_tokens)


def _parse(name: str, text: str) -> Profile:
    raw = json.loads(text)
    return Profile(name=name, description=raw["description"],
                   prompt_tokens=int(raw["prompt_tokens"]), gen_tokens=int(raw["gen_tokens"]),
                   depths=tuple(int(d) for d in raw["depths"]),
                   targets=Targets(**{k: float(v) for k, v in raw["targets"].items()}),
                   why=raw.get("why", ""))


@lru_cache(maxsize=1)
def all_profiles() -> dict[str, Profile]:
    """Every profile shipped in strata/rank/profiles, by name (the file's stem)."""
    folder = resources.files("strata.rank").joinpath("profiles")
    found = sorted(f for f in folder.iterdir() if f.name.endswith(".json"))
    return {f.name[:-5]: _parse(f.name[:-5], f.read_text("utf-8")) for f in found}


def choose(text: str) -> list[Profile]:
    """`--profile chat,rag` or `all` -> profiles; an unknown name lists the known ones."""
    known = all_profiles()
    names = list(known) if text.strip() == "all" else [w.strip() for w in text.split(",")
                                                         if w.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise InputError(f"--profile {text}: choose from {', '.join(known)} or all")
    return [known[n] for n in dict.fromkeys(names)]


def profiles_help() -> str:
    return "; ".join(f"{p.name}: pp{p.prompt_tokens}+tg{p.gen_tokens}"
                     f"{' at d' + ','.join(map(str, p.depths)) if any(p.depths) else ''}, "
                     f"TTFT ≤ {p.targets.ttft_s:g} s, ≥ {p.targets.gen_ts:g} t/s"
                     for p in all_profiles().values())
