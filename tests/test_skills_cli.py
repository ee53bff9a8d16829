"""`strata skills write / eval / list` end to end over a real loopback server replaying
recorded replies: a teacher writes a skill from the lab's built-ins; a student is measured
with and without it by execution (real sandboxed verification), never by reading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.replay_server import replay_server
from tests.seed_host import seeded_home
from tests.test_kernels_generate import HONEST, NO_WEIGHT, reply

MARKER = "Always apply the weight vector w[c] to every output element."


@pytest.fixture
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_home(tmp_path_factory, "skills")


def skill_folder(tmp_path: Path, train: list[str]) -> Path:
    folder = tmp_path / "weights-skill"
    folder.mkdir()
    (folder / "SKILL.md").write_text(f"---\nname: weights\ndescription: t\n---\n\n{MARKER}\n")
    (folder / "skill.json").write_text(json.dumps({"name": "weights", "dialect": "c",
                                                   "train_ops": train}))
    return folder


def student(with_skill: str, without: str) -> Any:
    """A student that writes `with_skill` when the skill is in its system prompt."""
    return lambda req: reply(with_skill if MARKER in req["messages"][0]["content"]
                             else without)


def ab(url: str, home: Path, folder: Path, *extra: str) -> Any:
    return run_cli("skills", "eval", str(folder), "--student", url, "--ops", "rmsnorm",
                   "--samples", "3", "--turns", "1", "--no-bench", "-o", "json", *extra,
                   home=home)


def test_a_helpful_skill_is_beneficial(home: Path, tmp_path: Path) -> None:
    folder = skill_folder(tmp_path, ["softmax", "matmul"])
    with replay_server(student(HONEST, NO_WEIGHT)) as srv:
        proc = ab(srv.url, home, folder)
        sent = srv.requests
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["verdict"] == "beneficial"
    rows = {r["metric"]: r for r in result["rows"]}
    # 3 paired units, every one 0 -> 1: lift 1 and a bootstrap CI of [1, 1]
    assert rows["correct_rate"]["without"] == 0.0 and rows["correct_rate"]["with"] == 1.0
    assert rows["correct_rate"]["lo95"] == rows["correct_rate"]["hi95"] == 1.0
    with_skill = [r for r in sent if MARKER in r["messages"][0]["content"]]
    assert len(with_skill) == 3 and len(sent) == 6  # same samples in both arms
    seeds = sorted(r.get("seed") for r in sent)
    assert seeds[0::2] == seeds[1::2]  # the same per-turn seeds in both arms


def test_a_misleading_skill_is_harmful(home: Path, tmp_path: Path) -> None:
    folder = skill_folder(tmp_path, ["softmax"])
    with replay_server(student(NO_WEIGHT, HONEST)) as srv:
        proc = ab(srv.url, home, folder, "-o", "table")
    assert proc.returncode == 0, proc.stderr
    assert "harmful" in proc.stdout


def test_train_ops_are_not_evaluation_ops(home: Path, tmp_path: Path) -> None:
    folder = skill_folder(tmp_path, ["rmsnorm"])
    with replay_server(["unused"]) as srv:
        proc = ab(srv.url, home, folder)
    assert proc.returncode == 2
    assert "rmsnorm" in proc.stderr and "held-out" in proc.stderr


def _measured_here(home: Path, key: str, speedup: float) -> None:
    """A verification and a benchmark of built-in `key` stored for this host, as `strata
    kernels verify/bench` store them (the teacher is shown what this host measured)."""
    from strata.kernels.impl import builtin_implementations
    from strata.store import open_db
    from strata.store.kernels import KernelResult, save_kernel_results

    impl = next(i for i in builtin_implementations() if i.key == key)
    conn = open_db(home / "strata.db")
    fingerprint = conn.execute("SELECT fingerprint FROM hosts").fetchone()[0]
    h = impl.content_hash()
    save_kernel_results(conn, fingerprint, [
        KernelResult(impl.op, impl.name, h, "verify", "pass", "cpu", "float32", {"ok": True}),
        KernelResult(impl.op, impl.name, h, "bench", "ok", "cpu", "float32",
                     {"median_s": 1e-4, "speedup_eager": speedup, "flags": []},
                     shape={"rows": 8, "cols": 4096})])
    conn.close()


def test_teacher_writes_a_skill_folder_from_the_lab(home: Path, tmp_path: Path) -> None:
    from datetime import date

    from strata.kernels.impl import builtin_implementations

    text = "# Fast C kernels\n\nUse several accumulators; handle ragged tails."
    naive = next(i.key for i in builtin_implementations()
                 if i.op == "rmsnorm" and i.dialect == "c" and i.name.endswith(".naive"))
    _measured_here(home, naive, 1.37)
    with replay_server([f"```markdown\n{text}\n```"], models=["teacher-70b"]) as srv:
        proc = run_cli("skills", "write", str(tmp_path / "mine"), "--teacher", srv.url,
                       "--train-ops", "rmsnorm,softmax", home=home)
        sent = srv.requests
    assert proc.returncode == 0, proc.stderr
    asked = sent[0]["messages"][-1]["content"]
    assert "void strata_rmsnorm(" in asked and "void strata_softmax(" in asked
    assert "strata_matmul(" not in asked  # only the train ops are taught
    # what this host measured, and its hardware dialect
    assert f"### {naive} (verified; 1.37x torch eager)" in asked, asked
    assert "not yet verified here; not benchmarked here" in asked  # the others, as they are
    assert "- CPU: " in asked and "ISA features: " in asked and "caches: " in asked
    skill_md = (tmp_path / "mine" / "SKILL.md").read_text()
    assert skill_md.startswith("---\nname: mine") and text in skill_md
    meta = json.loads((tmp_path / "mine" / "skill.json").read_text())
    assert meta["train_ops"] == ["rmsnorm", "softmax"] and meta["teacher_model"] == "teacher-70b"
    assert meta["fingerprint"] and all(k.split("/")[0] in ("rmsnorm", "softmax")
                                       for k in meta["sources"])
    assert meta["teacher"] == srv.url and meta["date"] == date.today().isoformat()
    impls = {i.key: i for i in builtin_implementations()}
    assert meta["sources"][naive] == impls[naive].content_hash()


def test_builtin_skill_reaches_the_prompt_offline(home: Path) -> None:
    from strata.kernels.skills import load_skill

    line = next(s for s in load_skill("builtin:c").text.splitlines() if len(s) > 40)
    with replay_server([reply(HONEST)]) as srv:
        proc = run_cli("kernels", "generate", "rmsnorm", "--endpoint", srv.url, "--samples",
                       "1", "--turns", "1", "--no-bench", "--no-register", "--skill",
                       "builtin:c", home=home)
        sent = srv.requests
    assert proc.returncode == 0, proc.stderr
    assert line in sent[0]["messages"][0]["content"]
    listed = run_cli("skills", "list", home=home)
    assert "builtin:c" in listed.stdout and "builtin:cuda" in listed.stdout


def test_a_missing_skill_folder_is_named_as_the_user_gave_it(home: Path,
                                                             tmp_path: Path) -> None:
    """SKILL is positional here: the one-line error names it so, not as --skill."""
    with replay_server(["unused"]) as srv:
        proc = ab(srv.url, home, tmp_path / "nope")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "SKILL " in proc.stderr and "--skill" not in proc.stderr and "not found" in proc.stderr
