"""`strata train` through the real CLI: bad input (one line, exit 2), a whole run on the
tiny `test` preset (DB rows, exports, the follow-up commands, the report's loss curves), and
Ctrl-C (a real SIGINT: checkpoint, one line, exit 130) then --resume."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import home_db, run_cli
from tests.seed_host import seeded_home
from tests.test_train_loop import write_corpus

FAST = ["--preset", "test", "--threads", "1"]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_home(tmp_path_factory, "train-home")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("train-corpus"))


def one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.parametrize(("flags", "words"), [
    (["--steps", "0"], ["--steps", "> 0"]),
    (["--data", "/nonexistent/strata-text"], ["--data", "no such file"]),
    (["--preset", "huge"], ["--preset huge", "tiny"]),
    (["--resume", "99"], ["--resume 99", "no training run"]),
    (["--device", "cuda"], ["--device cuda"]),
    (["--kernels", "lab", "--dtype", "bfloat16"], ["--kernels lab --dtype bfloat16", "float32"]),
    (["--dtype", "float16"], ["--dtype float16"]),
])
def test_bad_input_is_one_line_and_exit_2(home: Path, flags: list[str],
                                         words: list[str]) -> None:
    if flags[0] == "--device":
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is usable here: --device cuda is not bad input")
    fast = [] if flags[0] == "--resume" else FAST
    one_line_error(run_cli("train", *fast, *flags, home=home), *words)


def test_a_folder_without_text_is_one_line_and_exit_2(home: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "blob.bin").write_bytes(b"\xff\xfe\x00\x81" * 64)
    one_line_error(run_cli("train", *FAST, "--data", str(tmp_path / "empty"), home=home),
                   "--data", "text")


def test_a_whole_run_is_stored_exported_and_drawn(home: Path, corpus: Path,
                                                 tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli("train", *FAST, "--data", str(corpus), "--steps", "12", "--eval-every", "6",
                   "--out", str(out), home=home)
    assert proc.returncode == 0, proc.stderr
    assert "validation loss" in proc.stdout and "bits per byte" in proc.stdout
    sample = [ln for ln in proc.stdout.splitlines() if ln.startswith("sample: ")]
    assert len(sample) == 1 and sample[0][9:].startswith("The "), sample  # greedy, from "The "
    # stderr is a pipe here: plain progress lines instead of the live bar, a tenth apart
    progress = [ln for ln in proc.stderr.splitlines() if ln.startswith("step ") and "tok/s" in ln]
    assert [ln.split(":")[0] for ln in progress] == [f"step {n}/12" for n in range(1, 13)]
    gguf = out / "model.gguf"
    assert gguf.is_file() and (out / "hf" / "model.safetensors").is_file()
    assert f"strata bench {gguf}" in proc.stdout
    assert f"strata quality {gguf} --ctx 32 --text {out / 'val.txt'}" in proc.stdout
    conn = home_db(home)
    run = conn.execute("SELECT * FROM runs WHERE command = 'train' ORDER BY id DESC").fetchone()
    assert run["status"] == "complete"
    assert json.loads(run["config"])["preset"]["steps"] == 12
    row = conn.execute("SELECT * FROM train_runs WHERE run_id = ?", (run["id"],)).fetchone()
    assert row["step"] == 12 and row["tokens_seen"] == 12 * 4 * 32
    assert row["tokens_per_s"] > 0 and 0 < row["mfu"] < 1
    assert row["kernels"] == "lab"  # the default on the CPU in float32
    ops = json.loads(row["ops"])  # the lab's dispatched kernels, verified first, each op
    matmul = ops.pop("matmul")  # the projections: dispatch's decision, recorded too
    assert set(ops) == {"rmsnorm", "rmsnorm_backward", "silu_mul", "silu_mul_backward",
                        "rope", "rope_backward", "attention_lse", "attention_backward",
                        "cross_entropy_fused"}
    assert all(v["outcome"] == "kernel" and v["impl"].startswith("c.")
               for v in ops.values()), ops
    # nothing verified for matmul in a fresh home: torch serves it, and the record says why
    assert matmul["impl"] == "torch.eager" and matmul["outcome"] == "fallback", matmul
    assert json.loads(row["outputs"])["gguf"] == str(gguf)
    kinds = conn.execute("SELECT kind, COUNT(*) n FROM train_points WHERE run_id = ? "
                         "GROUP BY kind", (run["id"],)).fetchall()
    assert {k["kind"]: k["n"] for k in kinds} == {"train": 12, "val": 2}

    report = run_cli("report", "--out", str(tmp_path / "r.html"), home=home)
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "r.html").read_text()
    assert 'id="training" data-has-data="true"' in html
    assert 'id="chart-train-loss"' in html and str(gguf) in html

    # the follow-up commands printed at the end run as printed, on the new model (with
    # repetitions and chunks capped: the suite's time, not the command, is what they limit)
    lines = proc.stdout.splitlines()
    commands = [shlex.split(ln.strip()) for ln in lines[lines.index("next:") + 1:]]
    assert [c[:2] for c in commands] == [["strata", "bench"], ["strata", "quality"]]
    caps = {"bench": ["-r", "3"], "quality": ["--max-chunks", "4"]}
    for command in commands:
        done = run_cli(*command[1:], *caps[command[1]], home=home,
                       env={"OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, (command, done.stderr)
        assert "error" not in done.stderr.lower(), done.stderr
    stored = conn.execute("SELECT COUNT(*) FROM results r JOIN runs ON runs.id = r.run_id "
                          "WHERE runs.command = 'bench' AND r.model LIKE ?",
                          (f"%{gguf.name}",)).fetchone()[0]
    assert stored >= 2  # pp and tg of the trained GGUF, measured and stored
    assert "PPL" in done.stdout and str(gguf) in done.stdout  # quality scored the new model


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float) -> None:
    end = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, f"no {path} after {seconds} s"
        time.sleep(0.1)


def test_ctrl_c_checkpoints_and_resume_continues(home: Path, corpus: Path,
                                                tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "STRATA_HOME": str(home), "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "strata.cli", "train", *FAST, "--data",
                             str(corpus), "--steps", "100000", "--ckpt-every", "5",
                             "--eval-every", "1000", "--out", str(out)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(out / "checkpoint.pt", proc, 120)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted at step") and "--resume" in last
    assert "Traceback" not in stderr
    run_id = int(last.rsplit(" ", 1)[-1])
    conn = home_db(home)
    assert conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()[0] == \
        "incomplete"
    stopped = conn.execute("SELECT step FROM train_runs WHERE run_id = ?",
                           (run_id,)).fetchone()[0]
    assert stopped >= 5

    again = run_cli("train", "--resume", str(run_id), "--steps", str(stopped + 3),
                    "--no-export", "--threads", "1", home=home)
    assert again.returncode == 0, again.stderr
    assert f"resuming at step {stopped}" in again.stderr
    new = conn.execute("SELECT * FROM train_runs ORDER BY run_id DESC").fetchone()
    assert new["resumed_from"] == run_id and new["step"] == stopped + 3
    steps = [r[0] for r in conn.execute("SELECT step FROM train_points WHERE run_id = ? AND "
                                        "kind = 'train' ORDER BY step", (new["run_id"],))]
    assert steps == list(range(1, stopped + 4))  # the curve carries over

    refused = run_cli("train", "--resume", str(run_id), "--preset", "tiny", home=home)
    one_line_error(refused, "--preset")
