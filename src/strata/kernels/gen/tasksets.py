"""Named task sets for `strata kernels eval --ops`: each is a list of (op, shape set) tasks,
judged like any op but benchmarked at that shape set instead of the op's `llm` shapes.

`kernelbench-conv`: KernelBench's level-1 convolution problems that the lab's conv ops
express (ops/_kernelbench.py names each problem, its source commit and how it was sized).
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.errors import InputError

DEFAULT_SHAPES = "llm"


@dataclass(frozen=True)
class Task:
    op: str
    shapes: str = DEFAULT_SHAPES  # the op's shape set the benchmark times


@dataclass(frozen=True)
class TaskSet:
    name: str
    about: str
    tasks: tuple[Task, ...]


TASK_SETS = {s.name: s for s in (
    TaskSet("kernelbench-conv", "KernelBench's level-1 conv problems (2-D standard, "
            "depthwise, pointwise; 1-D standard, dilated and strided) at batch 1",
            (Task("conv2d", "kernelbench"), Task("conv1d", "kernelbench"))),
)}


def resolve_tasks(text: str) -> list[Task]:
    """`all` (every op at its llm shapes), or a comma list of ops and task-set names."""
    from strata.kernels.spec import all_specs

    known = list(all_specs())
    if text == "all":
        return [Task(op) for op in known]
    tasks: list[Task] = []
    unknown = []
    for word in (w.strip() for w in text.split(",")):
        if word in TASK_SETS:
            tasks += TASK_SETS[word].tasks
        elif word in known:
            tasks.append(Task(word))
        elif word:
            unknown.append(word)
    if unknown or not tasks:
        raise InputError(f"--ops {text}: unknown op or task set "
                         f"{', '.join(unknown) or '(none given)'} (choose all, a task set: "
                         f"{', '.join(TASK_SETS)}, or ops from `strata kernels list`)")
    return list(dict.fromkeys(tasks))
