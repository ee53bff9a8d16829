"""Training text: the default offline corpus, user files, the split by document, token files
on disk and reproducible batches.

The default corpus ships with CPython, so `strata train` needs no download: the prose of
`pydoc_data.topics` (the language reference behind `help()`) and the docstrings of the
standard library's modules, classes and functions, read with `ast` from the source files
under sysconfig's stdlib path (tests, IDLE, demos, generated codecs, the deprecated distutils
and vendored packages left out; docstrings under 20 characters and repeats dropped). On
CPython 3.11.7: 79 topics (466,117 bytes) plus 351 modules (1,522,676 bytes), 1,988,793 UTF-8
bytes in 430 documents, built in ~4 s of CPU (ast parsing). Order is sorted by name, so the
corpus is the same on every run of the same Python.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import random
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strata.errors import InputError

if TYPE_CHECKING:
    import numpy as np
    import tokenizers

# folders of the stdlib whose docstrings are tests, tools or copies of other projects' text
_SKIP_DIRS = {"test", "tests", "idle_test", "idlelib", "turtledemo", "site-packages",
              "dist-packages", "__pycache__", "lib2to3", "ensurepip", "pydoc_data",
              "__phello__", "encodings", "distutils"}
_MIN_DOCSTRING = 20  # characters: "Return x." style one-liners add nothing but noise


@dataclass
class Document:
    name: str
    text: str


# -- corpora ---------------------------------------------------------------------------------


def _docstrings(source: str) -> list[str]:
    """Module, class and function docstrings of one file, in source order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # a stdlib file for another version, or binary junk
        return []
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(
        n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    docs = (ast.get_docstring(n, clean=True) for n in nodes)
    return [d for d in docs if d and len(d) >= _MIN_DOCSTRING]


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]  # never walk into site-packages
        found += [Path(folder, f) for f in files if f.endswith(".py")]
    return sorted(found)


@functools.lru_cache(maxsize=1)
def _default_corpus() -> tuple[tuple[str, str], ...]:
    from pydoc_data.topics import topics

    docs = [(f"pydoc/{name}", topics[name]) for name in sorted(topics)]
    root = Path(sysconfig.get_paths()["stdlib"])
    seen: set[str] = set()  # inherited boilerplate ("Return repr(self).") appears many times
    for path in _stdlib_files():
        try:
            found = _docstrings(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
        strings = [d for d in found if d not in seen]
        seen.update(strings)
        if strings:
            docs.append((f"stdlib/{path.relative_to(root).as_posix()}", "\n\n".join(strings)))
    return tuple(docs)


def default_corpus() -> list[Document]:
    """The embedded corpus (see the module docstring): ~2 MB, deterministic order."""
    return [Document(name, text) for name, text in _default_corpus()]


def _read_text(path: Path, named: bool) -> str | None:
    """A file's UTF-8 text; in a folder, files that are not UTF-8 text are skipped, a file
    named on the command line must be readable."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        if named:
            raise InputError(f"--data {path}: cannot read it as UTF-8 text ({exc})") from None
        return None


def _files(path: Path) -> Iterable[tuple[Path, bool]]:
    if path.is_dir():
        for p in sorted(path.rglob("*")):
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts):
                yield p, False
    elif path.is_file():
        yield path, True
    else:
        raise InputError(f"--data {path}: no such file or folder")


def load_corpus(paths: list[Path]) -> list[Document]:
    """Every UTF-8 text file named or under a named folder (hidden ones skipped), one
    document each, in sorted order; InputError when nothing usable is found."""
    docs = []
    for root in paths:
        for path, named in _files(Path(root)):
            text = _read_text(path, named)
            if text and text.strip():
                docs.append(Document(str(path), text))
    if not docs:
        raise InputError(f"--data {' '.join(map(str, paths)) or '(none)'}: no non-empty UTF-8 "
                         "text files")
    return docs


# -- split -----------------------------------------------------------------------------------


def doc_hash(doc: Document) -> str:
    return hashlib.sha256(f"{doc.name}\0{doc.text}".encode()).hexdigest()


def _digest(hashes: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(hashes).encode()).hexdigest()


@dataclass
class Split:
    train: list[Document]
    val: list[Document]
    hashes: dict[str, Any] = field(default_factory=dict)  # corpus/train/val digests, seed


def _halve(doc: Document, val_fraction: float) -> list[Document]:
    """One document cannot be split by document: cut it at the line break nearest to
    (1 - val_fraction) of its length."""
    at = int(len(doc.text) * (1 - val_fraction))
    cut = doc.text.rfind("\n", 0, at)
    cut = cut if cut > 0 else at
    if cut <= 0 or cut >= len(doc.text):
        raise InputError(f"{doc.name}: too little text to hold out a validation part")
    return [Document(f"{doc.name}#train", doc.text[:cut]), Document(f"{doc.name}#val",
                                                                    doc.text[cut:])]


def split_documents(docs: list[Document], val_fraction: float = 0.05,
                    seed: int = 0) -> Split:
    """Train/validation by whole documents, chosen by a seeded shuffle (at least one each);
    both keep the corpus order. hashes: sha256 digests of the corpus, train and val
    documents (each document hashed by name and text), so a run records what it saw."""
    if not 0 < val_fraction < 1:
        raise InputError(f"validation fraction {val_fraction} is not between 0 and 1")
    if len(docs) == 1:
        docs = _halve(docs[0], val_fraction)
        val_idx = {1}
    else:
        order = list(range(len(docs)))
        random.Random(seed).shuffle(order)
        n_val = min(len(docs) - 1, max(1, round(len(docs) * val_fraction)))
        val_idx = set(order[:n_val])
    train = [d for i, d in enumerate(docs) if i not in val_idx]
    val = [d for i, d in enumerate(docs) if i in val_idx]
    hashes = {"corpus": _digest(map(doc_hash, docs)), "train": _digest(map(doc_hash, train)),
              "val": _digest(map(doc_hash, val)), "seed": seed, "val_fraction": val_fraction,
              "n_train": len(train), "n_val": len(val)}
    return Split(train, val, hashes)


# -- token files -----------------------------------------------------------------------------

_META = "tokens.json"


def encode_documents(docs: list[Document], tok: tokenizers.Tokenizer) -> np.ndarray:
    """One stream: every document starts with <|endoftext|> (the model's BOS), as a
    llama.cpp context does."""
    import numpy as np

    from strata.train.tokenizer import eot_id

    eot = eot_id(tok)
    pieces = [np.array([eot, *e.ids], dtype=np.int64)
              for e in tok.encode_batch([d.text for d in docs])]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


@dataclass
class TokenStore:
    """train.bin / val.bin (uint16 when the vocabulary fits, else uint32) memory-mapped read
    only, with tokens.json: dtype, token and UTF-8 byte counts (bits per byte = loss / ln 2 *
    tokens / bytes) and the split's hashes."""

    folder: Path
    train: np.ndarray
    val: np.ndarray
    meta: dict[str, Any]

    @classmethod
    def build(cls, folder: Path, split: Split, tok: tokenizers.Tokenizer) -> TokenStore:
        import numpy as np

        folder.mkdir(parents=True, exist_ok=True)
        dtype = np.uint16 if tok.get_vocab_size() <= 1 << 16 else np.uint32
        meta: dict[str, Any] = {"dtype": np.dtype(dtype).name, "vocab": tok.get_vocab_size(),
                                "hashes": split.hashes}
        for part, docs in (("train", split.train), ("val", split.val)):
            ids = encode_documents(docs, tok)
            out = np.lib.format.open_memmap  # .npy: the header carries dtype and length
            arr = out(folder / f"{part}.npy", mode="w+", dtype=dtype, shape=(len(ids),))
            arr[:] = ids
            arr.flush()
            del arr
            meta[f"{part}_tokens"] = len(ids)
            meta[f"{part}_bytes"] = sum(len(d.text.encode("utf-8")) for d in docs)
        (folder / _META).write_text(json.dumps(meta, indent=1), encoding="utf-8")
        return cls.open(folder)

    @classmethod
    def open(cls, folder: Path) -> TokenStore:
        import numpy as np

        try:
            meta = json.loads((folder / _META).read_text(encoding="utf-8"))
            train, val = (np.load(folder / f"{p}.npy", mmap_mode="r") for p in ("train", "val"))
        except (OSError, ValueError) as exc:
            raise InputError(f"{folder}: no readable token files ({exc})") from None
        return cls(folder, train, val, meta)

    def bytes_per_token(self, part: str) -> float:
        """UTF-8 bytes per token of a part (EOT tokens included in the count)."""
        return self.meta[f"{part}_bytes"] / max(1, self.meta[f"{part}_tokens"])


# -- batches ---------------------------------------------------------------------------------


class Batches:
    """Random windows of ctx + 1 tokens, a pure function of (seed, position): batch number p
    draws its offsets from numpy's generator seeded with (seed, p), so `restore(state())`
    continues exactly, and so does any process that knows the position.

    Data parallel: every rank draws the same world * batch offsets and takes its own slice,
    so W ranks of `batch` see together what one process of W * batch sees."""

    def __init__(self, tokens: np.ndarray, batch: int, ctx: int, seed: int = 0,
                 rank: int = 0, world: int = 1) -> None:
        if len(tokens) < ctx + 2:
            raise InputError(f"{len(tokens)} tokens cannot fill one window of {ctx + 1}: "
                             "give more text or a smaller context")
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside a world of {world}")
        self.tokens, self.batch, self.ctx = tokens, batch, ctx
        self.seed, self.rank, self.world = seed, rank, world
        self.position = 0

    def offsets(self, position: int) -> np.ndarray:
        import numpy as np

        rng = np.random.default_rng([self.seed, position])
        every = rng.integers(0, len(self.tokens) - self.ctx - 1, size=self.batch * self.world)
        return every[self.rank * self.batch:(self.rank + 1) * self.batch]

    def next(self) -> tuple[Any, Any]:
        """(x, y) int64 torch tensors [batch, ctx], y = x shifted by one token."""
        import numpy as np
        import torch

        rows = np.stack([np.asarray(self.tokens[o:o + self.ctx + 1], dtype=np.int64)
                         for o in self.offsets(self.position)])
        self.position += 1
        t = torch.from_numpy(rows)
        return t[:, :-1], t[:, 1:]

    __next__ = next

    def __iter__(self) -> Batches:
        return self

    def state(self) -> dict[str, int]:
        return {"seed": self.seed, "position": self.position}

    def restore(self, state: dict[str, int]) -> None:
        if state["seed"] != self.seed:
            raise InputError(f"the checkpoint's data seed {state['seed']} is not this run's "
                             f"{self.seed}")
        self.position = int(state["position"])
