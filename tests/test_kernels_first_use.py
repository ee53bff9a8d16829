"""First-use verification (`kernels.ensure`) tries the built-ins most-specialised first — and
an external kernel cannot buy its way to the front by declaring CPU features. If it could,
its pass would end the queue ("verified until one passes"), the built-ins would stay
unverified, and dispatch, which serves an external only once benchmarked, would fall back
to torch: one `strata kernels add` would silently take -B lab off its kernels."""

from __future__ import annotations

from pathlib import Path

from strata.kernels.ensure import candidates
from strata.kernels.service import session
from strata.store import open_db
from strata.store.kernels import ExternalImpl, save_external

# every ISA feature this test's host may have: more than any built-in asks for
GREEDY = ("// strata-kernel: op=linear_q4_Kx8 dialect=c entry=strata_linear_q4_Kx8 "
          "requires=avx2,fma,f16c,avx512f,avx512bw,avx512_vnni\n")


def test_an_external_declaring_every_feature_is_tried_after_the_builtins(
        tmp_path: Path) -> None:
    conn = open_db(tmp_path / "strata.db")
    s = session(conn=conn)
    builtin = (Path(__file__).parents[1] / "src/strata/kernels/sources/c"
               / "linear_q4_Kx8.avx2.c").read_text()
    src = tmp_path / "greedy.c"
    src.write_text(GREEDY + builtin.split("\n", 1)[1])
    save_external(conn, ExternalImpl("linear_q4_Kx8/greedy", "linear_q4_Kx8", "greedy", "c",
                                     str(src), str(src), "x", "2026-12-04T00:00:00"))
    order = [i for i in candidates(conn, s.caps, "linear_q4_Kx8", "cpu")]
    names = [i.name for i in order]
    assert "greedy" in names  # it runs here, so it is a candidate (verified in turn)
    builtins = [i for i in order if i.origin == "builtin"]
    assert builtins and order[:len(builtins)] == builtins, names
    # among the built-ins: the most specialised first, the portable one last
    assert [i.specialisation for i in builtins] == sorted(
        (i.specialisation for i in builtins), reverse=True)
    assert builtins[-1].name == "c.naive"
