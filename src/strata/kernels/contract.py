"""The op's calling contract, checked before a dispatched kernel touches raw pointers.

A kernel of the C ABI reads `data_ptr()` with the sizes it derives, so a float64, transposed
or sliced tensor gives garbage without a word. `check_call` compares what the caller passed
with what the op's spec generates: the number of inputs, each input's kind of dtype and
rank, one float dtype the implementation declares (inputs the spec gives a fixed dtype, such
as linear_f16's float16 weight, must have exactly that one and are left out of this rule), one
device, contiguity, and the output shape the vendor op computes from these inputs (on the meta
device: no work, no memory).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from strata.errors import InputError
from strata.kernels.spec import KernelSpec


@lru_cache(maxsize=64)
def _template(op: str) -> tuple[tuple[str, int], ...]:
    """(dtype kind, rank) per input, from the spec's own generator on a tiny shape."""
    from strata.kernels.spec import get_spec

    spec = get_spec(op)
    made = spec.make_inputs(spec.shapes["verify"][-1], "float32", 0, "cpu")
    return tuple(("float" if t.is_floating_point() else str(t.dtype).replace("torch.", ""),
                  t.dim()) for t in made)


def param_names(spec: KernelSpec) -> list[str]:
    """Every parameter the op takes: its defaults plus the per-shape ones (attention's
    scale, which depends on the head dim, comes from scale_params)."""
    shape = spec.shapes["verify"][0]
    return list(dict.fromkeys([*spec.params, *spec.params_for(shape)]))


def check_params(spec: KernelSpec, params: dict[str, Any]) -> None:
    names = param_names(spec)
    unknown = sorted(set(params) - set(names))
    if unknown:
        known = ", ".join(f"{k}=" for k in names) or "none"
        raise InputError(f"{spec.name}: unknown parameter(s) {', '.join(unknown)} "
                         f"(it takes {known})")


def check_call(spec: KernelSpec, out: Any, inputs: tuple[Any, ...], params: dict[str, Any],
               dtypes: tuple[str, ...] | None, device: str, out_shape: bool = True) -> None:
    """InputError naming the first argument that breaks the op's contract."""
    import torch

    template = _template(spec.name)
    names = spec.inputs
    if len(inputs) != len(template):
        raise InputError(f"{spec.name}: expected {len(template)} input(s) "
                         f"({', '.join(names)}), got {len(inputs)}")
    floats = set()
    for name, t, (kind, rank) in zip(("out", *names), (out, *inputs),
                                     (("float", -1), *template), strict=True):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{spec.name}: {name} must be a torch.Tensor, not "
                             f"{type(t).__name__}")
        if t.device.type != device.split(":")[0]:
            raise InputError(f"{spec.name}: {name} is on {t.device}; this implementation "
                             f"runs on {device}")
        if not t.is_contiguous():
            raise InputError(f"{spec.name}: {name} is not contiguous (transposed or sliced); "
                             "pass .contiguous() — kernels read memory in row-major order")
        fixed = spec.fixed_dtypes.get(name) if name != "out" else None
        if fixed is not None:
            if str(t.dtype).replace("torch.", "") != fixed:
                raise InputError(f"{spec.name}: {name} must be {fixed}, not {t.dtype} "
                                 f"(the op takes {name} in {fixed} whatever the other "
                                 "inputs' dtype)")
        elif kind == "float":
            if not t.is_floating_point():
                raise InputError(f"{spec.name}: {name} must be floating point, not {t.dtype}")
            if name != "out" or spec.out_dtype is None:
                floats.add(str(t.dtype).replace("torch.", ""))
        elif str(t.dtype).replace("torch.", "") != kind:
            raise InputError(f"{spec.name}: {name} must be {kind}, not {t.dtype}")
        if rank >= 0 and t.dim() != rank:
            raise InputError(f"{spec.name}: {name} must have {rank} dimension(s), "
                             f"not {t.dim()} (shape {tuple(t.shape)})")
    if len(floats) > 1:
        raise InputError(f"{spec.name}: mixed float dtypes {', '.join(sorted(floats))}; "
                         "pass one dtype")
    if dtypes and floats and not floats <= set(dtypes):
        raise InputError(f"{spec.name}: {floats.pop()} inputs; this implementation takes "
                         f"{', '.join(dtypes)}")
    if out_shape:
        _check_out_shape(spec, out, inputs, params)


@lru_cache(maxsize=4096)
def _meta_out_shape(op: str, inputs: tuple[tuple[tuple[int, ...], Any], ...],
                    params: tuple[tuple[str, Any], ...]) -> tuple[int, ...] | str | None:
    """The output shape the vendor op gives on meta tensors of these shapes and dtypes; a
    one-line reason when they do not fit together; None when meta cannot run the op.
    Cached: running the op on meta costs ~3 ms, and a decode step binds ~400 calls of a
    few distinct shapes whenever a KV cache is new."""
    import torch

    from strata.kernels.spec import get_spec

    meta = [torch.empty(shape, dtype=dtype, device="meta") for shape, dtype in inputs]
    try:
        return tuple(get_spec(op).vendor()(*meta, **dict(params)).shape)
    except NotImplementedError:
        return None
    except (RuntimeError, ValueError, IndexError) as exc:
        if "meta" in str(exc).lower():
            return None
        return str(exc).splitlines()[0][:160]


def _check_out_shape(spec: KernelSpec, out: Any, inputs: tuple[Any, ...],
                     params: dict[str, Any]) -> None:
    """The vendor op on meta tensors: inconsistent sizes raise, the output shape is known.
    An op the meta device cannot run is not judged here (never a false alarm)."""
    want = _meta_out_shape(spec.name, tuple((tuple(t.shape), t.dtype) for t in inputs),
                           tuple(sorted(params.items())))
    if want is None:
        return
    if isinstance(want, str):
        given = ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(spec.inputs, inputs,
                                                                 strict=True))
        raise InputError(f"{spec.name}: the inputs' shapes do not fit together ({given}): "
                         f"{want}")
    if tuple(out.shape) != want:
        raise InputError(f"{spec.name}: out has shape {tuple(out.shape)}; these inputs give "
                         f"{want}")
