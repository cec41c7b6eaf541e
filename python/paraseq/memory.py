"""What paraseq's operators hold between calls, outside PyTorch's caching allocator.

The scans, the Newton solver and its backward, and odeint's gradient keep their temporaries (chunk
buffers, the Newton iterate and adjoint, odeint's checkpoints) in a cache that the next call of the
same shape or a smaller one reuses, so that repeated calls allocate nothing (docs/memory.md). On CUDA
that memory shows in nvidia-smi but not in torch.cuda.memory_allocated().
"""

import torch

from . import _library  # noqa: F401  (loads the operators)


def workspace_bytes() -> int:
    """The bytes that paraseq's cached temporaries hold now, in every memory space (host and GPU together).

    Returns:
        int: what release_workspace() would free.
    """
    return torch.ops.paraseq.workspace_bytes()


def release_workspace() -> None:
    """Frees paraseq's cached temporaries, after waiting for the kernels that may still use them.

    The next call of each operator allocates its temporaries again. Call it when memory is tight (before
    torch.cuda.empty_cache(), when a phase that used paraseq is over); in eager code only, and not while another
    thread is inside a paraseq operator.
    """
    torch.ops.paraseq.release_workspace()
