"""Static checks for external kernel sources, before anything runs (`strata kernels add`).

They reject what a kernel has no business doing: calling the vendor op it claims to
implement, touching the timer or the harness, starting threads/streams/processes, reading
files or the network. The sandbox and the runtime guards catch what slips through; this
layer gives the clear reason early (robust-kbench / KernelBench anti-cheat practice).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

# -- Python (triton) -------------------------------------------------------------------------
#
# Rules by meaning, not by spelling: every import binds a name to a dotted path
# (`import torch as tl` binds tl -> torch), simple assignments copy those bindings
# (`x = tl`), and every name/attribute chain is resolved through them before it is judged
# (`tl.sys.modules` is torch.sys.modules, whatever `tl` is called).

ALLOWED_IMPORTS = {"triton", "triton.language", "math", "torch", "functools", "typing",
                   "__future__"}
FORBIDDEN_NAMES = {"open", "exec", "eval", "compile", "__import__", "globals", "locals",
                   "setattr", "getattr", "delattr", "vars", "breakpoint", "input",
                   "memoryview", "help"}
# torch attributes a launcher may touch: dtypes only (launchers compute grid sizes). Scratch
# is allocated from a given tensor (`x.new_empty(..., dtype=torch.float32)`, as the built-in
# rmsnorm_backward does), so no torch function is needed; shape/stride/numel/element_size/
# dtype/device are reads on the tensors a launcher is given, not torch attributes.
TORCH_DTYPES = {"float32", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64",
                "float64", "bool", "dtype"}
VENDOR_METHODS = {"softmax", "log_softmax", "matmul", "mm", "bmm", "addmm", "mv", "einsum",
                  "rms_norm", "layer_norm", "silu", "sigmoid", "exp", "logsumexp", "mean",
                  "norm", "cross_entropy", "nll_loss", "scaled_dot_product_attention",
                  "rsqrt", "sum", "max", "pow", "copy_", "mul", "mul_", "add", "add_", "cos",
                  "sin", "to", "float", "double", "half", "clone", "fill_", "zero_", "tolist",
                  "numpy", "item", "data_ptr", "cumsum", "dot", "outer", "linear"}
# Tensor methods that run Python callbacks or reach raw storage: no launcher needs them.
TENSOR_ESCAPES = {"apply_", "map_", "map2_", "register_hook",
                  "register_post_accumulate_grad_hook", "backward", "storage",
                  "untyped_storage", "set_", "share_memory_"}
# Modules a kernel may not reach under any name: the interpreter, the judge (strata), files,
# processes, threads, time and introspection. Refused as the root of a resolved path
# (`import os`), and anywhere inside one (`tl.sys`, `triton.runtime.cache.os`: allowed
# modules hold references to these).
FORBIDDEN_MODULES = {"sys", "builtins", "importlib", "ctypes", "os", "gc", "inspect",
                     "subprocess", "socket", "types", "strata", "posix", "nt", "_thread",
                     "threading", "multiprocessing", "concurrent", "asyncio", "signal", "time",
                     "io", "pathlib", "shutil", "tempfile", "glob", "fcntl", "mmap", "resource",
                     "pickle", "marshal", "copyreg", "code", "codeop", "runpy", "pkgutil",
                     "zipimport", "site", "sysconfig", "platform", "traceback", "linecache",
                     "weakref", "operator", "atexit", "faulthandler", "tracemalloc", "dis",
                     "pdb", "bdb", "logging", "select", "selectors", "ssl", "http", "urllib",
                     "numpy", "np", "cffi"}
# ... of which these are also refused as an attribute of anything (an object of unknown
# type): the rest are ordinary words (`.time`, `.code`) there.
_ANY_ATTRIBUTE = FORBIDDEN_MODULES - {"types", "concurrent", "signal", "time", "io", "glob",
                                      "resource", "code", "site", "platform", "traceback",
                                      "operator", "logging", "select", "http"} | {"torch"}
# Paths inside allowed modules that evaluate strings as code.
FORBIDDEN_PATHS = {"typing.get_type_hints", "typing.ForwardRef", "typing.evaluate_forward_ref"}
# Submodules of allowed modules (so that `from triton import language` is known to bind a
# module, which may not be passed around as a value).
KNOWN_MODULES = ALLOWED_IMPORTS | {
    "triton.backends", "triton.compiler", "triton.errors", "triton.knobs", "triton.runtime",
    "triton.testing", "triton.tools", "triton.profiler", "triton.experimental",
    "triton.language.core", "triton.language.extra", "triton.language.math",
    "triton.language.random", "triton.language.standard", "triton.language.semantic",
    "triton.language.target_info", "triton.language.extra.cuda", "triton.language.extra.hip",
    "triton.language.extra.libdevice", "triton.language.extra.cuda.libdevice",
    "triton.runtime.autotuner", "triton.runtime.build", "triton.runtime.cache",
    "triton.runtime.driver", "triton.runtime.errors", "triton.runtime.jit",
    "triton.runtime.interpreter"}
TRITON_JIT = {"triton.jit", "triton.runtime.jit.jit"}
# Frame, code and traceback objects reach every module's globals without a dunder.
_INTROSPECTION_ATTR = re.compile(r"(?:gi|cr|ag|f|tb|co)_[a-z]+$")
_JUDGE_MODULE = re.compile(r"strata(?:\.\w+)*$")
_DUNDER = re.compile(r"__\w+__$")

_VENDOR = "a kernel computes the op itself: the vendor path is the baseline"


class _Aliases:
    """Name -> the dotted paths it may stand for, from imports and alias copies (flow-
    insensitive: a name bound to two modules anywhere stands for both)."""

    def __init__(self, tree: ast.AST) -> None:
        self.paths: dict[str, set[str]] = {}
        self.modules = set(KNOWN_MODULES)
        self.copies: set[int] = set()  # ids of the value nodes of tracked alias copies
        bound: dict[str, set[int]] = {}  # name -> ids of the nodes binding it otherwise
        # (targets, value, whether the value is only copied: `f(m := tl)` also passes it on)
        copies: list[tuple[list[ast.Name], ast.expr, bool]] = []
        in_class = {id(s) for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                    for s in c.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    parts = a.name.split(".")
                    self.modules.update(".".join(parts[:i + 1]) for i in range(len(parts)))
                    self._bind(a.asname or parts[0], a.name if a.asname else parts[0])
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                parts = node.module.split(".")
                self.modules.update(".".join(parts[:i + 1]) for i in range(len(parts)))
                for a in node.names:
                    if a.name != "*":
                        self._bind(a.asname or a.name, f"{node.module}.{a.name}")
            elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                bound.setdefault(node.id, set()).add(id(node))
            elif isinstance(node, ast.arg):
                bound.setdefault(node.arg, set()).add(id(node))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef |
                            ast.ExceptHandler) and node.name:
                bound.setdefault(node.name, set()).add(id(node))
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr) and \
                    id(node) not in in_class and node.value is not None and \
                    isinstance(node.value, ast.Name | ast.Attribute):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if all(isinstance(t, ast.Name) for t in targets):
                    names = [t for t in targets if isinstance(t, ast.Name)]
                    copies.append((names, node.value, not isinstance(node, ast.NamedExpr)))
        # a bare module name bound by nothing in the file (`sys.modules` without an import)
        # still stands for that module; a local variable named `np` or `time` does not
        self.bound = set(bound)
        changed = True
        while changed:  # x = tl; y = x: copies of copies
            changed = False
            for targets, value, only_copied in copies:
                resolved = self.resolve(value)
                if resolved is None:
                    continue
                if only_copied:
                    self.copies.add(id(value))
                for t in targets:
                    bound[t.id].discard(id(t))
                    if not resolved <= self.paths.get(t.id, set()):
                        self.paths.setdefault(t.id, set()).update(resolved)
                        changed = True
        # names that may also hold a local value (a parameter named `tl` is a tensor, not
        # triton.language, whatever else binds that name): judged both ways
        self.local = {name for name, nodes in bound.items() if nodes}

    def _bind(self, name: str, path: str) -> None:
        self.paths.setdefault(name, set()).add(path)

    def resolve(self, node: ast.expr) -> set[str] | None:
        """The dotted paths a Name/Attribute chain may stand for; None when its root is not
        an import alias (a local value: a tensor, a number)."""
        attrs: list[str] = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        tail = "".join(f".{a}" for a in reversed(attrs))
        if node.id in self.paths:
            return {p + tail for p in self.paths[node.id]}
        if node.id not in self.bound and (node.id in FORBIDDEN_MODULES or node.id in
                                          {i.split(".")[0] for i in ALLOWED_IMPORTS}):
            return {node.id + tail}
        return None


def _path_finding(path: str, store: bool = False) -> str | None:
    """What is wrong with reaching `path` (a resolved dotted path), or None."""
    parts = path.split(".")
    if parts[0] in FORBIDDEN_MODULES:
        return f"reaches {path} — {parts[0]} is off limits to a kernel"
    for part in parts[1:]:
        if part in FORBIDDEN_MODULES or part == "torch":
            return f"reaches {path} — {part} is off limits to a kernel"
    if parts[0] == "torch" and (len(parts) == 1 or parts[1] not in TORCH_DTYPES):
        return f"reaches {path} — torch beyond its dtypes is the vendor path ({_VENDOR})"
    for part in parts[1:]:
        if part.startswith("_") and not _DUNDER.match(part):
            return f"reaches {path} — a module's private attributes are off limits"
    if any(path == p or path.startswith(p + ".") for p in FORBIDDEN_PATHS):
        return f"reaches {path} — it evaluates strings as code"
    if store and parts[0] != "triton" and len(parts) > 1:
        return f"assigns {path} — a kernel does not rebind a module's attributes"
    return None


def _is_value_use(node: ast.expr, parent: ast.AST | None, aliases: _Aliases) -> bool:
    """Whether a maximal Name/Attribute chain is used as a value (passed, stored, returned)
    rather than called, subscripted, used as a decorator or copied into a tracked alias."""
    if not isinstance(getattr(node, "ctx", None), ast.Load) or id(node) in aliases.copies:
        return False
    if (isinstance(parent, ast.Call) and parent.func is node) or \
            (isinstance(parent, ast.Subscript) and parent.value is node):
        return False
    return not (isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and node in parent.decorator_list)


def _jit_nodes(tree: ast.AST, aliases: _Aliases) -> set[int]:
    """ids of every node inside a @triton.jit function (the decorator resolved, not read:
    `@my_jit` is not Triton): Triton values, not torch tensors, so tensor-method rules do
    not apply there (x.to(tl.float32) is a Triton cast)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
                (aliases.resolve(d.func if isinstance(d, ast.Call) else d) or set()) &
                TRITON_JIT for d in node.decorator_list):
            inside.update(id(n) for n in ast.walk(node))
    return inside


def _import_findings(node: ast.Import | ast.ImportFrom) -> list[str]:
    allowed = f"allowed: {', '.join(sorted(ALLOWED_IMPORTS))}"
    line = node.lineno
    if isinstance(node, ast.ImportFrom) and node.level:
        return [f"line {line}: relative import from {'.' * node.level}{node.module or ''} — "
                f"a kernel is one file ({allowed})"]
    if isinstance(node, ast.Import):  # binds the module itself: its uses are judged
        return [f"line {line}: imports {a.name} — {allowed}" for a in node.names
                if a.name not in ALLOWED_IMPORTS]
    found = [f"line {line}: imports {node.module} — {allowed}"] \
        if node.module not in ALLOWED_IMPORTS else []
    for a in node.names:
        if a.name == "*":
            found.append(f"line {line}: imports * from {node.module} — every name a kernel "
                         "uses must be spelled out")
        elif node.module in ALLOWED_IMPORTS:  # from torch import sys: torch.sys
            path = f"{node.module}.{a.name}"
            why = _path_finding(path)
            if why:
                found.append(f"line {line}: imports {why.removeprefix('reaches ')}")
    return found


def _chain_findings(node: ast.expr, parent: ast.AST | None, aliases: _Aliases,
                    in_jit: bool) -> list[str]:
    """Findings for one maximal Name/Attribute chain (`a.b.c` in `a.b.c(x)`)."""
    line = node.lineno
    attrs: list[str] = []
    base = node
    while isinstance(base, ast.Attribute):
        attrs.insert(0, base.attr)
        base = base.value
    found: list[str] = []
    for attr in attrs:
        if _DUNDER.match(attr):
            found.append(f"line {line}: touches {attr} — introspection is off limits")
        elif _INTROSPECTION_ATTR.match(attr):
            found.append(f"line {line}: touches {attr} — frame and code objects are off "
                         "limits (introspection)")
    store = isinstance(getattr(node, "ctx", None), ast.Store | ast.Del)
    paths = None if store and not attrs else aliases.resolve(node)  # `x = ...` rebinds x
    if paths is not None:
        for path in sorted(paths):
            why = _path_finding(path, store)
            if why:
                found.append(f"line {line}: {why}")
            elif path in aliases.modules and _is_value_use(node, parent, aliases):
                found.append(f"line {line}: uses module {path} as a value — a module may only "
                             "be the base of an attribute (tl.x); passed around it hides "
                             "what it reaches")
        if not (isinstance(base, ast.Name) and base.id in aliases.local):
            return found
    for attr in attrs:
        if attr in _ANY_ATTRIBUTE:
            found.append(f"line {line}: reaches .{attr} — {attr} is off limits to a kernel")
        elif attr in TENSOR_ESCAPES and not in_jit:
            found.append(f"line {line}: calls .{attr}() on a tensor — it runs Python callbacks "
                         "or reaches raw storage")
        elif attr in VENDOR_METHODS and not in_jit:
            found.append(f"line {line}: calls .{attr}() on a tensor — torch compute in a "
                         f"kernel ({_VENDOR})")
    return found


def _python_findings(tree: ast.AST) -> list[str]:
    aliases = _Aliases(tree)
    jit = _jit_nodes(tree, aliases)
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    found: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        parent = parents.get(id(node))
        if isinstance(node, ast.Import | ast.ImportFrom):
            found += _import_findings(node)
        if isinstance(node, ast.Name):
            if node.id in FORBIDDEN_NAMES:
                found.append(f"line {line}: uses {node.id}() — dynamic code, attribute or "
                             "file access is off limits")
            elif node.id.startswith("__") and node.id not in ("__name__", "__file__"):
                found.append(f"line {line}: touches {node.id} — introspection is off limits")
        if isinstance(node, ast.Name | ast.Attribute) and not (
                isinstance(parent, ast.Attribute) and parent.value is node):
            found += _chain_findings(node, parent, aliases, id(node) in jit)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _JUDGE_MODULE.match(node.value):
                found.append(f"line {line}: names {node.value} — the judge's modules are off "
                             "limits")
            elif _DUNDER.match(node.value) and node.value != "__main__":
                found.append(f"line {line}: names {node.value} — introspection is off limits")
        elif isinstance(node, ast.BinOp | ast.AugAssign) and \
                isinstance(node.op, ast.MatMult) and id(node) not in jit:
            found.append(f"line {line}: uses the @ operator — a torch matmul ({_VENDOR})")
    return list(dict.fromkeys(found))


def check_python(text: str) -> list[str]:
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        return [f"line {exc.lineno}: syntax error: {exc.msg}"]
    return _python_findings(tree)


# -- C / C++ / CUDA --------------------------------------------------------------------------

_C_RULES: list[tuple[str, str]] = [
    (r"#\s*include\s*[<\"](?:pthread\.h|thread|future|unistd\.h|sys/[\w/]+\.h|fcntl\.h"
     r"|dlfcn\.h|signal\.h|spawn\.h|fstream|filesystem|netdb\.h|arpa/\w+\.h|netinet/\w+\.h"
     r"|time\.h|ctime|chrono|cuda/std/chrono|cuda/std/ctime|setjmp\.h)[>\"]",
     "includes a system header for threads, processes, files, time or the network"),
    (r"#\s*include\s*[<\"](?:(?:cublas\w*|cudnn\w*)(?:\.h)?|cutlass/[\w/.]+|torch/[\w/.]+"
     r"|ATen/[\w/.]+|Python\.h|mkl\w*\.h|cblas\.h|openblas\w*\.h|dnnl\w*\.h)[>\"]",
     "includes a vendor library (the vendor path is the baseline, not a kernel)"),
    (r"\b(?:cublas\w+|cudnn\w+|cblas_\w+|at::\w+|torch::\w+|dnnl_\w+)\s*\(",
     "calls a vendor library"),
    (r"\b(?:pthread_\w+|fork|vfork|execv\w*|execl\w*|system|popen|posix_spawn\w*|clone"
     r"|std::thread|std::async|std::jthread)\s*\(", "starts a thread or a process"),
    (r"\b(?:fopen|freopen|open|openat|creat|socket|connect|bind|listen|accept|dlopen|dlsym"
     r"|mmap|mprotect|syscall|ptrace|kill|raise|signal|sigaction|remove|unlink|rename)\s*\(",
     "touches files, memory mappings, signals or the network"),
    (r"\b(?:clock_gettime|gettimeofday|clock|time|cudaEventRecord"
     r"|cudaEventElapsedTime|cudaEventCreate\w*)\s*\(", "reads or records the timer"),
    # named, called or not (an intrinsic's address can be taken; none imports a symbol, so
    # the ELF check cannot see them): x86 TSC/PMC, clang's counters, Arm/POWER timer
    # registers, CUDA's clock64 and %globaltimer, <chrono>
    (r"\b(?:rdtsc|rdtscp|rdpmc|_rdtsc|__rdtsc|_rdtscp|__rdtscp|_rdpmc|__rdpmc"
     r"|__builtin_ia32_rdtsc|__builtin_ia32_rdtscp|__builtin_ia32_rdpmc"
     r"|__builtin_readcyclecounter|__builtin_readsteadycounter|__builtin_arm_rsr64"
     r"|__builtin_arm_rsr|__arm_rsr64|__arm_rsr|__builtin_ppc_get_timebase|__builtin_ppc_mftb"
     r"|clock64|globaltimer|chrono)\b", "reads a cycle counter or timer intrinsic"),
    (r"\b(?:cudaStreamCreate\w*|cudaLaunchHostFunc|cudaStreamAddCallback|cudaGraph\w+"
     r"|cudaDeviceSynchronize|cudaSetDevice|cudaDeviceReset|cudaHostAlloc|cudaMallocHost)"
     r"\s*\(", "creates streams, host callbacks or changes the device (use the given stream)"),
    (r"\b(?:__asm__|__asm|asm)\b", "contains inline assembly"),
    (r"##", "pastes tokens with the preprocessor (every name must be spelled out)"),
]

# Inside string literals (inline assembly is a string: CUDA allows it for PTX): timer and
# performance-counter registers, x86 timer instructions, raw bytes and system calls.
_ASM_STRING_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"%%?(?:globaltimer(?:_lo|_hi)?|clock64|clock(?:_hi)?|pm[0-7](?:_64)?)\b"
                r"|\b(?:rdtscp?|rdpmc)\b"),
     "reads a timer or counter register in inline assembly"),
    (re.compile(r"\b(?:syscall|sysenter|svc)\b|\bint\s+\$?0x80\b"
                r"|\.(?:byte|inst|word|long|quad|2byte|4byte|8byte)\b"),
     "emits raw instruction bytes or a system call in inline assembly"),
]
_STRINGIZE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+\w+\([^)\n]*\)[^\n]*?(?<![#\w])#[ \t]*"
                        r"[A-Za-z_]", re.M)

_C_TOKENS = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'',
                       re.S)


def _strip_c_comments(text: str) -> str:
    """Comments and string/char literals blanked in one left-to-right pass (a "/*" inside
    a string must not hide the code after it); line numbers are kept."""
    def blank(m: re.Match[str]) -> str:
        token = m.group(0)
        if token.startswith(("//", "/*")):
            return "\n" * token.count("\n")
        return token[0] * 2
    return _C_TOKENS.sub(blank, text)


def _string_literals(text: str) -> list[tuple[int, str]]:
    """(line, contents) of each string literal, adjacent literals joined as the compiler
    joins them ("%%global" "timer" is one string); comments skipped."""
    joined: list[tuple[int, str]] = []
    end = -1
    for m in _C_TOKENS.finditer(text):
        token = m.group(0)
        if not token.startswith('"'):
            if not token.startswith(("//", "/*")):
                end = -1  # a char literal separates strings
            continue
        if joined and end >= 0 and not _strip_c_comments(text[end:m.start()]).strip():
            joined[-1] = (joined[-1][0], joined[-1][1] + token[1:-1])
        else:
            joined.append((text.count("\n", 0, m.start()) + 1, token[1:-1]))
        end = m.end()
    return joined


def check_c(text: str, allow_asm: bool = False) -> list[str]:
    code = _strip_c_comments(text)
    found: list[str] = []
    for pattern, why in _C_RULES:
        if allow_asm and why == "contains inline assembly":
            continue
        for m in re.finditer(pattern, code):
            line = code.count("\n", 0, m.start()) + 1
            found.append(f"line {line}: {m.group(0).strip()[:60]} — {why}")
    for line, literal in _string_literals(text):
        for rule, why in _ASM_STRING_RULES:
            for m in rule.finditer(literal):
                found.append(f"line {line}: \"{m.group(0)}\" in a string — {why}")
    if allow_asm:  # #x could spell an assembly string the literal check never sees
        for m in _STRINGIZE.finditer(code):
            line = code.count("\n", 0, m.start()) + 1
            found.append(f"line {line}: a macro stringizes its argument (#x) — strings for "
                         "inline assembly must be spelled out")
    return found


def _include_lines(text: str) -> str:
    """Includes survive the string-literal blanking: check them on the raw text."""
    return "\n".join(line if line.lstrip().startswith("#") else "" for line in
                     re.sub(r"/\*.*?\*/", "", text, flags=re.S).splitlines())


# What a kernel may include: the system's and the toolchain's headers by <name> (resolved
# in the compiler's own folders: no absolute path, no ".."), and strata's shared headers by
# "name" (kernels/sources/c/strata_*.h, found with -iquote: dialects/c.py). Anything else
# would compile some other file into the kernel, or show its bytes in a compiler error.
_DIRECTIVE = re.compile(r"^[ \t]*(?:#|%:)[ \t]*(\w+)[ \t]*(.*)$", re.M)
_FILE_DIRECTIVES = {"include_next", "import", "embed"}  # and `include`, judged by operand
_HAS_INCLUDE = re.compile(r"\b(__has_include(?:_next)?)\s*\(\s*(.?)")
_PARENT = re.compile(r"(?:^|[/\\])\.\.(?:[/\\]|$)")


def _preprocessor_view(text: str) -> str:
    """The text as the preprocessor reads directives: continued lines joined (`#inc\\`
    + newline + `lude` is #include) and comments gone (`#/**/include` too); strings kept."""
    joined = re.sub(r"\\[ \t]*\r?\n", "", text)

    def blank(m: re.Match[str]) -> str:
        token = m.group(0)
        return (" " + "\n" * token.count("\n")) if token.startswith(("//", "/*")) else token
    return _C_TOKENS.sub(blank, joined)


def _operand_finding(operand: str, headers: frozenset[str]) -> str | None:
    """What is wrong with an include's operand (`<name>` or `"name"`), or None."""
    shared = ", ".join(sorted(headers)) or "none for this dialect"
    if operand.startswith("<") and ">" in operand:
        name = operand[1:operand.index(">")]
        if name.startswith(("/", "\\")) or _PARENT.search(name):
            return (f"names <{name}> — a header is named relative to the compiler's own "
                    "folders (no absolute path, no ..)")
        return None
    if operand.startswith('"') and '"' in operand[1:]:
        name = operand[1:operand.index('"', 1)]
        if name in headers:
            return None
        return (f'names "{name}" — a kernel is one file: "..." names only strata\'s shared '
                f"headers ({shared}); system headers are <name>")
    return (f"names {operand[:40] or 'nothing'} — an include's file must be spelled out "
            "as <name> or \"name\" (no macro)")


def include_findings(text: str, headers: frozenset[str]) -> list[str]:
    """Includes that reach beyond the system's headers and strata's shared ones."""
    code = _preprocessor_view(text)
    found: list[str] = []
    for m in _DIRECTIVE.finditer(code):
        directive, operand = m.group(1), m.group(2).strip()
        line = code.count("\n", 0, m.start()) + 1
        if directive in _FILE_DIRECTIVES:
            found.append(f"line {line}: #{directive} — a kernel includes files with #include "
                         "only")
        elif directive == "include":
            why = _operand_finding(operand, headers)
            if why:
                found.append(f"line {line}: #include {why}")
        elif directive == "pragma" and re.match(r"GCC\s+dependency\b", operand):
            found.append(f"line {line}: #pragma GCC dependency — it reads another file")
    for m in _HAS_INCLUDE.finditer(code):
        line = code.count("\n", 0, m.start()) + 1
        rest = code[m.start(2):m.start(2) + 300].split(")")[0].strip()
        why = "it looks past the current include folder" if m.group(1).endswith("_next") \
            else _operand_finding(rest, headers)
        if why:
            found.append(f"line {line}: {m.group(1)} {why}")
    return found


def check_c_source(text: str, allow_asm: bool = False,
                   headers: frozenset[str] | None = None) -> list[str]:
    """Findings for a C/C++ kernel; `headers`: what "..." may include (default: strata's
    shared C headers, kernels/sources/c/strata_*.h)."""
    if headers is None:
        from strata.kernels.impl import shared_header_names

        headers = shared_header_names()
    found = check_c(text, allow_asm)
    # directives also as the preprocessor reads them (`%:include`, `#inc\` + newline + `lude`)
    directives = "\n".join("#" + m.group(1) + " " + m.group(2) for m in
                           _DIRECTIVE.finditer(_preprocessor_view(text)))
    for pattern, why in _C_RULES[:2]:
        for m in re.finditer(pattern, _include_lines(text) + "\n" + directives):
            msg = f"— {why}"
            if not any(msg in f for f in found):
                found.append(f"{m.group(0).strip()[:60]} {msg}")
    return found + include_findings(text, headers)


def check_cuda_source(text: str) -> list[str]:
    # inline PTX (mma, cp.async) is CUDA's craft; nvcc is given no shared-header folder
    return check_c_source(text, allow_asm=True, headers=frozenset())


def check_source(path: Path, dialect: str, op: str) -> list[str]:
    """Findings (empty: clean) for an external source of `dialect` implementing `op`; each
    dialect names its checker (Dialect.static_checker)."""
    from strata.kernels.dialects import get_dialect

    text = path.read_text("utf-8", errors="replace")
    checker = get_dialect(dialect).static_checker
    return checker(text) if checker else [f"no static checker for dialect {dialect}"]
