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

ALLOWED_IMPORTS = {"triton", "triton.language", "math", "torch", "functools", "typing",
                   "__future__"}
FORBIDDEN_NAMES = {"open", "exec", "eval", "compile", "__import__", "globals", "locals",
                   "setattr", "getattr", "delattr", "vars", "breakpoint", "input",
                   "memoryview"}
# torch attributes a launcher may touch: dtypes only (launchers compute grid sizes).
TORCH_DTYPES = {"float32", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64",
                "float64", "bool", "dtype"}
VENDOR_METHODS = {"softmax", "log_softmax", "matmul", "mm", "bmm", "addmm", "mv", "einsum",
                  "rms_norm", "layer_norm", "silu", "sigmoid", "exp", "logsumexp", "mean",
                  "norm", "cross_entropy", "nll_loss", "scaled_dot_product_attention",
                  "rsqrt", "sum", "max", "pow", "copy_", "mul", "mul_", "add", "add_", "cos",
                  "sin", "to", "float", "double", "half", "clone", "fill_", "zero_", "tolist",
                  "numpy", "item", "data_ptr", "cumsum", "dot", "outer", "linear"}


def _jit_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside a @triton.jit function: Triton values, not torch tensors,
    so tensor-method rules do not apply there (x.to(tl.float32) is a Triton cast)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
                "jit" in ast.unparse(d) for d in node.decorator_list):
            inside.update(id(n) for n in ast.walk(node))
    return inside


def _python_findings(tree: ast.AST) -> list[str]:
    found: list[str] = []
    jit = _jit_nodes(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""]
            for name in names:
                if name not in ALLOWED_IMPORTS:
                    found.append(f"line {line}: imports {name} (allowed: "
                                 f"{', '.join(sorted(ALLOWED_IMPORTS))})")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            found.append(f"line {line}: uses {node.id}()")
        elif isinstance(node, ast.Name) and node.id.startswith("__") and \
                node.id not in ("__name__", "__file__"):
            found.append(f"line {line}: touches {node.id} (introspection is off limits)")
        elif isinstance(node, ast.Attribute):
            found.extend(_attribute_finding(node, line, id(node) in jit))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and \
                id(node) not in jit:
            found.append(f"line {line}: uses the @ operator (a torch matmul)")
    return found


def _attribute_finding(node: ast.Attribute, line: int, in_jit: bool) -> list[str]:
    base = node.value
    if node.attr.startswith("__") and node.attr.endswith("__"):
        return [f"line {line}: touches {node.attr} (introspection is off limits)"]
    if isinstance(base, ast.Name) and base.id in ("torch", "F", "nn") and \
            node.attr not in TORCH_DTYPES:
        return [f"line {line}: calls {base.id}.{node.attr} (a kernel computes the op itself; "
                "the vendor path is the baseline)"]
    if node.attr in VENDOR_METHODS and not in_jit and not _is_triton(base):
        return [f"line {line}: calls .{node.attr}() on a tensor (torch compute in a kernel)"]
    return []


def _is_triton(node: ast.expr) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in ("tl", "triton", "libdevice", "math")


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
     r"|time\.h|ctime|chrono|setjmp\.h)[>\"]", "includes a system header for threads, "
     "processes, files, time or the network"),
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
    (r"\b(?:clock_gettime|gettimeofday|clock|time|rdtsc|__rdtsc|__rdtscp|cudaEventRecord"
     r"|cudaEventElapsedTime|cudaEventCreate\w*)\s*\(", "reads or records the timer"),
    (r"\b(?:cudaStreamCreate\w*|cudaLaunchHostFunc|cudaStreamAddCallback|cudaGraph\w+"
     r"|cudaDeviceSynchronize|cudaSetDevice|cudaDeviceReset|cudaHostAlloc|cudaMallocHost)"
     r"\s*\(", "creates streams, host callbacks or changes the device (use the given stream)"),
    (r"\b(?:__asm__|asm)\b", "contains inline assembly"),
]


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


def check_c(text: str, allow_asm: bool = False) -> list[str]:
    code = _strip_c_comments(text)
    found: list[str] = []
    for pattern, why in _C_RULES:
        if allow_asm and why == "contains inline assembly":
            continue
        for m in re.finditer(pattern, code):
            line = code.count("\n", 0, m.start()) + 1
            found.append(f"line {line}: {m.group(0).strip()[:60]} — {why}")
    return found


def _include_lines(text: str) -> str:
    """Includes survive the string-literal blanking: check them on the raw text."""
    return "\n".join(line if line.lstrip().startswith("#") else "" for line in
                     re.sub(r"/\*.*?\*/", "", text, flags=re.S).splitlines())


def check_c_source(text: str, allow_asm: bool = False) -> list[str]:
    found = check_c(text, allow_asm)
    for pattern, why in _C_RULES[:2]:
        for m in re.finditer(pattern, _include_lines(text)):
            msg = f"— {why}"
            if not any(msg in f for f in found):
                found.append(f"{m.group(0).strip()[:60]} {msg}")
    return found


def check_cuda_source(text: str) -> list[str]:
    return check_c_source(text, allow_asm=True)  # inline PTX (mma, cp.async) is CUDA's craft


def check_source(path: Path, dialect: str, op: str) -> list[str]:
    """Findings (empty: clean) for an external source of `dialect` implementing `op`; each
    dialect names its checker (Dialect.static_checker)."""
    from strata.kernels.dialects import get_dialect

    text = path.read_text("utf-8", errors="replace")
    checker = get_dialect(dialect).static_checker
    return checker(text) if checker else [f"no static checker for dialect {dialect}"]
