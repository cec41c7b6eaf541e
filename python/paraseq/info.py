"""python -m paraseq.info: what to paste into a bug report."""

import platform
import sys

import torch

import paraseq

OPERATORS = ("linear_scan", "para_gru", "para_gru_backward", "para_gru_head", "para_gru_head_backward", "para_lstm",
             "para_lstm_backward", "para_slstm", "para_slstm_backward", "odeint", "odeint_backward")


def kernel_devices(operator):
    """The dispatch keys ("CPU", "CUDA") for which this build registered a kernel of paraseq::<operator>."""
    overload = getattr(torch.ops.paraseq, operator).default
    return [key for key in ("CPU", "CUDA") if overload.has_kernel_for_dispatch_key(key)]


def report():
    lines = [
        f"paraseq library: {paraseq.LIBRARY_PATH}",
        f"python: {sys.version.split()[0]} ({platform.platform()})",
        f"torch: {torch.__version__}, CUDA {torch.version.cuda}, cuda available: {torch.cuda.is_available()}",
        f"torch threads: {torch.get_num_threads()}",
    ]
    if torch.cuda.is_available():
        lines.append(f"GPU: {torch.cuda.get_device_name()} (capability {torch.cuda.get_device_capability()})")
    for name in OPERATORS:
        lines.append(f"paraseq::{name}: kernels for {', '.join(kernel_devices(name)) or 'no device'}")
    lines.append("Kokkos configuration:")
    lines.append(torch.ops.paraseq.kokkos_configuration())
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
