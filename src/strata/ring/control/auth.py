"""Who may talk to a ring member: a shared secret, proven and never sent.

Every member of a ring holds the same secret: `--secret-file PATH`, else the environment
variable STRATA_RING_SECRET, else $STRATA_HOME/ring.secret, which `ring serve` generates
(32 random bytes, hex, mode 0600) and prints on its first start so it can be copied to the
other machines. The clients (`ring status|run|plan`, `fleet bench`) look it up the same way.

Every control connection starts with a challenge-response (HMAC-SHA256 over two fresh
nonces, one from each side, with a label per direction): the daemon proves nothing to a
stranger and a client learns the daemon is a member too. A captured handshake is useless on
another connection (the daemon's nonce is new each time), and the secret never crosses the
wire. The data plane's links (strata.ring.runtime.transport) prove it the same way per
epoch; the OpenAI-compatible endpoint takes it as its bearer token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from strata.errors import InputError

ENV = "STRATA_RING_SECRET"
FILE_NAME = "ring.secret"
NONCE_BYTES = 16
SECRET_BYTES = 32
CLIENT, SERVER, LINK = b"strata-ring/client", b"strata-ring/server", b"strata-ring/link"

_chosen: bytes | None = None  # the process's secret once `use` is called (serve, --secret-file)


@dataclass(frozen=True)
class Secret:
    key: bytes
    source: str  # where it came from, for messages (never the secret itself)
    created: bool = False  # generated just now (serve prints it once)


def default_path() -> Path:
    from strata.paths import home_dir

    return home_dir() / FILE_NAME


def load(path: Path | None = None, create: bool = False) -> Secret | None:
    """The ring secret: `path` (--secret-file), else $STRATA_RING_SECRET, else the default
    file; `create` generates the default file when none of them exists (the daemon)."""
    if path is not None:
        return Secret(_read(Path(path).expanduser()), f"--secret-file {path}")
    if os.environ.get(ENV, "").strip():
        return Secret(os.environ[ENV].strip().encode(), f"${ENV}")
    default = default_path()
    if default.is_file():
        return Secret(_read(default), str(default))
    if not create:
        return None
    return _generate(default)


def _generate(path: Path) -> Secret:
    """A new secret at `path`, written whole before it appears there (two daemons started
    at once in one STRATA_HOME: the second reads the first's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = secrets.token_hex(SECRET_BYTES)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        return Secret(_read(path), str(path))
    finally:
        tmp.unlink()
    return Secret(text.encode(), str(path), created=True)


def _read(path: Path) -> bytes:
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise InputError(f"--secret-file {path}: {exc.strerror or exc}") from None
    if not text:
        raise InputError(f"ring secret {path} is empty: put the ring's secret in it (the "
                         "first `strata ring serve` printed it)")
    return text.encode()


def use(secret: Secret | None) -> None:
    """This process's secret for every connection it makes from now on."""
    global _chosen
    _chosen = None if secret is None else secret.key


def current() -> bytes:
    """The secret a client proves: the one `use` chose, else the lookup of `load`."""
    if _chosen is not None:
        return _chosen
    found = load()
    if found is None:
        raise InputError(f"no ring secret here: set {ENV} or pass --secret-file with the "
                         "secret the ring's first `strata ring serve` printed (it is in "
                         f"that machine's {default_path()})")
    return found.key


def nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def mac(key: bytes, label: bytes, *parts: str) -> str:
    msg = b"/".join([label, *(p.encode() for p in parts)])
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def same(a: str, b: object) -> bool:
    return isinstance(b, str) and hmac.compare_digest(a.encode(), b.encode())
