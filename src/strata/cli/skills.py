"""`strata skills …`: a teacher model's kernel know-how as a skill, measured on a student.

The flags and their checks; the use cases are commands/skills.py, the views
views/kernels_gen.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from strata.cli import DbOption, app, err, out
from strata.cli.helptext import reflowed
from strata.cli.kernels import JsonOption
from strata.cli.kernels_gen import (
    MODEL_PANEL,
    SEARCH_PANEL,
    BenchOption,
    DeviceOption,
    DialectOption,
    KeyOption,
    MaxTokensOption,
    SamplesOption,
    StreamOption,
    TempOption,
    TimeoutOption,
    TurnsOption,
    _check_counts,
    saying,
)
from strata.cli.output import with_json
from strata.cli.status import OUTPUT_PANEL, ProgressOption, use_progress
from strata.errors import InputError
from strata.views.output import emit

skills_app = typer.Typer(
    name="skills", no_args_is_help=True, rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Skills: a teacher model's know-how for writing kernels in one dialect, handed to "
    "a student model and measured by execution (with vs without).")
app.add_typer(skills_app)


@skills_app.command("list")
@reflowed
def skills_list() -> None:
    """The built-in skills, one per dialect: `--skill builtin:<dialect>`.

    Each line: the reference to pass to --skill, its source hash, its length in words and
    the ops its teacher studied (the others are held out for `strata skills eval`).

    [bold]Examples[/bold]
      strata skills list
      strata kernels generate rope --endpoint $URL --skill builtin:c
    """
    from strata.commands.skills import builtin_skills
    from strata.views.kernels_gen import builtin_skill_line

    for ref, skill in builtin_skills():
        out.print(builtin_skill_line(ref, skill), markup=False)


@skills_app.command("write")
@reflowed
def skills_write(
    teacher: Annotated[str, typer.Option("--teacher", metavar="URL", show_default=False,
                                         rich_help_panel=MODEL_PANEL,
                                         help="The teacher's OpenAI-compatible base URL.")],
    dest: Annotated[Path, typer.Argument(metavar="DIR", help="Folder to write SKILL.md and "
                                         "skill.json into.")],
    teacher_model: Annotated[str | None, typer.Option(
        "--teacher-model", metavar="MODEL", rich_help_panel=MODEL_PANEL, show_default=False,
        help="Model name (default: the server's first).")] = None,
    dialect: DialectOption = "c",
    device: DeviceOption = None,
    train_ops: Annotated[str, typer.Option(
        "--train-ops", rich_help_panel=SEARCH_PANEL, help="Ops whose built-ins the teacher "
        "studies; the others are held out for `strata skills eval`.")]
    = "rmsnorm,softmax,matmul",
    name: Annotated[str | None, typer.Option("--name", help="Skill name (default: the "
                                             "folder's name).", show_default=False)] = None,
    api_key_env: KeyOption = None,
    max_tokens: MaxTokensOption = None,
    progress: ProgressOption = None,
    db: DbOption = None,
) -> None:
    """A teacher model writes a skill from the lab's verified built-ins.

    The teacher sees the built-ins of --train-ops in the dialect (source, speed measured on
    this host) and the hardware dialect, and writes SKILL.md; skill.json records the teacher,
    date, host fingerprint, train ops and source hashes.

    [bold]Examples[/bold]
      strata skills write my-c-skill --teacher http://127.0.0.1:8080/v1
      strata skills write my-skill --teacher $URL --train-ops rmsnorm,matmul
    """
    from strata.commands.kernels_gen import ModelServer
    from strata.commands.skills import WriteOptions, write

    use_progress(progress)
    skill = write(WriteOptions(
        teacher=ModelServer(teacher, api_key_env, False), dest=dest, teacher_model=teacher_model,
        dialect=dialect, device=device, train_ops=train_ops, name=name, max_tokens=max_tokens,
        db=db), err, saying)
    out.print(f"wrote {dest}/SKILL.md ({len(skill.text.split())} words) and skill.json: "
              f"{skill.ref}", markup=False)


@skills_app.command("eval")
@reflowed
def skills_eval(
    skill: Annotated[str, typer.Argument(metavar="SKILL", help="A skill folder or "
                                         "builtin:<dialect>.")],
    student: Annotated[str, typer.Option("--student", metavar="URL", show_default=False,
                                         rich_help_panel=MODEL_PANEL,
                                         help="The student's OpenAI-compatible base URL.")],
    student_model: Annotated[str | None, typer.Option(
        "--student-model", metavar="MODEL", rich_help_panel=MODEL_PANEL, show_default=False,
        help="Model name (default: the server's first).")] = None,
    ops: Annotated[str | None, typer.Option(
        "--ops", rich_help_panel=SEARCH_PANEL, show_default=False,
        help="Held-out ops (default: every op outside the skill's train ops).")] = None,
    dialect: Annotated[str | None, typer.Option(
        "--dialect", rich_help_panel=SEARCH_PANEL, show_default=False,
        help="Dialect to write (default: the skill's own).")] = None,
    device: DeviceOption = None,
    samples: SamplesOption = 4,
    turns: TurnsOption = 4,
    api_key_env: KeyOption = None,
    temperature: TempOption = 0.7,
    bench: BenchOption = True,
    timeout: TimeoutOption = 120.0,
    stream: StreamOption = False,
    fmt: Annotated[str, typer.Option("--format", "-o", metavar="FORMAT", show_default=False,
                                     rich_help_panel=OUTPUT_PANEL,
                                     help="table (default), md or json.")] = "table",
    json_out: JsonOption = False,
    progress: ProgressOption = None,
    db: DbOption = None,
) -> None:
    """Measure a skill on a student model, with and without it, by execution.

    Held-out ops (the teacher never saw them); the same ops, samples, turns and seeds in
    both arms.

    Reported: the lift in correct rate and in fast_1 (correct and faster than torch eager)
    with a paired bootstrap 95% CI over (op, sample) units, and the token ratio with/without.
    Verdict: [bold]beneficial[/bold] when the correct-rate CI's lower bound is above 0, or
    the lift is >= 0 and the token ratio <= 0.8; [bold]harmful[/bold] when the CI's upper
    bound is below 0; else [bold]no measurable effect[/bold].

    [bold]Examples[/bold]
      strata skills eval builtin:c --student http://127.0.0.1:8080/v1
      strata skills eval ./my-skill --student $URL --ops layernorm,rope
    """
    from strata.commands.kernels_gen import ModelServer
    from strata.commands.skills import EvalOptions, evaluate
    from strata.views.kernels_gen import AB_COLUMNS, AB_NUMERIC, ab_document, ab_records, ab_table

    use_progress(progress)
    fmt = with_json(fmt, json_out)
    if fmt not in ("table", "md", "json"):
        raise InputError(f"--format {fmt}: choose table, md or json")
    _check_counts(turns, samples, temperature)
    done = evaluate(EvalOptions(
        skill=skill, student=ModelServer(student, api_key_env, stream),
        student_model=student_model, ops=ops, dialect=dialect, device=device, samples=samples,
        turns=turns, temperature=temperature, bench=bench, timeout_s=timeout, db=db), err,
        lambda m: saying(m, quote=lambda text: text.replace("[", "\\[")))
    ab = done.result.ab
    emit(out, fmt, ab_records(ab), document=ab_document(done.skill.ref, done.model, done.ops, ab),
         table=lambda: out.print(ab_table(ab)), md_columns=AB_COLUMNS, md_numeric=AB_NUMERIC)
