"""A fresh STRATA_HOME that already knows this host and its roofline, so a CLI test can run
`bench`, `fit`, `kernels bench` or `probe` without spending 10-30 s measuring the roofline.

The roofline is seeded, not measured: large round figures (tens of thousands of GB/s and
GFLOP/s) so that no real result ever exceeds a stored peak (which would re-measure it) and
the tables print long, comma-grouped numbers, the ones a narrow pipe used to cut.
"""

from __future__ import annotations

from pathlib import Path

from strata.measure.roofline import DeviceRoofline, Figure, Peak, Roofline

SEEDED_ROOFLINE = Roofline([DeviceRoofline(
    "cpu", "seeded CPU",
    bandwidth={"triad": Figure(83_667.12, "seeded: C STREAM triad, best of 12",
                               median=81_234.5)},
    compute={"fp32": Figure(443_966.4, "seeded: fp32 matmul 1024³, best of 5",
                            median=440_001.25)},
    peak_bandwidth=Peak(96_000.0, "seeded: 2 x 6000 MT/s x 64 bit / 8"),
    peak_compute={"fp32": Peak(500_000.0, "seeded: datasheet")})], seconds=1.5)


def seed_host(home: Path) -> str:
    """This host's record (the fingerprint the CLI will compute) and SEEDED_ROOFLINE under
    `home`/strata.db; returns the fingerprint."""
    from strata.hardware.probe import probe_host
    from strata.store import open_db
    from strata.store.hosts import save_host, save_measurement

    home.mkdir(parents=True, exist_ok=True)
    conn = open_db(home / "strata.db")
    fingerprint = save_host(conn, probe_host(smoke=False))
    save_measurement(conn, fingerprint, "roofline", SEEDED_ROOFLINE.to_dict())
    conn.close()
    return fingerprint


def seeded_home(factory: object, name: str) -> Path:
    """A new STRATA_HOME from pytest's tmp_path_factory, seeded as `seed_host` does."""
    home = factory.mktemp(name)  # type: ignore[attr-defined]
    seed_host(home)
    return home
