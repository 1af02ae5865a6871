"""Argument checks shared by the fake (meta) kernels; messages match the C++ ones in csrc/ops/checks.h."""
import torch

# The kernels read and write float32 / bfloat16 / float16; float64 is accepted too (gradcheck): an op with a
# float64 argument computes its documented math with at:: ops in float64 (csrc/ops/checks.h uses_float64).
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def check_float_tensor(t: torch.Tensor, op: str, arg: str) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise RuntimeError(
            f"fusegraph.{op}: argument '{arg}' has dtype {t.dtype}; expected float32, bfloat16, float16 or float64"
        )


def check_same_device(ref: torch.Tensor, ref_name: str, t: torch.Tensor, op: str, arg: str) -> None:
    if t.device != ref.device:
        raise RuntimeError(
            f"fusegraph.{op}: argument '{arg}' is on {t.device} but '{ref_name}' is on {ref.device}; "
            "expected both on the same device"
        )


def check_eps(eps: float, op: str) -> None:
    if not (eps >= 0.0 and eps != float("inf")):
        raise ValueError(f"fusegraph.{op}: argument 'eps' is {eps}; expected a finite number >= 0")


def check_eps_tensor(eps: torch.Tensor, op: str) -> None:
    """An ``eps_tensor`` overload's eps: a 0-d floating-point CPU tensor (its value is read by the kernel at each
    call, so the fake kernels check only its form)."""
    if not (eps.dim() == 0 and eps.dtype.is_floating_point and eps.device.type == "cpu"):
        raise RuntimeError(
            f"fusegraph.{op}: argument 'eps' is a tensor of shape {list(eps.shape)}, dtype {eps.dtype} on "
            f"{eps.device}; expected a 0-d floating-point tensor on the CPU or a number")


def check_out_dtype(out_dtype, op: str) -> None:
    if out_dtype is not None and out_dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"fusegraph.{op}: argument 'out_dtype' is {out_dtype}; expected float32, bfloat16, float16 or float64"
        )


def check_row_param(x: torch.Tensor, p: torch.Tensor, op: str, arg: str) -> None:
    """A per-channel parameter (a norm's weight or bias): a float tensor of shape [x.shape[-1]] on x's device."""
    check_float_tensor(p, op, arg)
    check_same_device(x, "x", p, op, arg)
    D = x.shape[-1]
    if p.dim() != 1 or p.shape[0] != D:
        raise RuntimeError(
            f"fusegraph.{op}: argument '{arg}' has shape {list(p.shape)}; expected [{D}] "
            f"(x's last dim; x has shape {list(x.shape)})"
        )
