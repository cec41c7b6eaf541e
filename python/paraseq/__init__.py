"""paraseq: parallel solvers for sequential computations, as PyTorch operators.

linear_scan (linear recurrences), ParaGRU / ParaLSTM / ParaSLSTM / newton_apply (nonlinear recurrences
by Newton's method) and odeint (batched Runge-Kutta loops) run as torch.ops.paraseq operators with
CPU (and CUDA) kernels, fake kernels and autograd: each is one opaque node under
torch.compile(fullgraph=True). odeint and newton_apply also take right-hand sides and cells of
your own (the general path, PyTorch around these operators): see docs/migration.md.
"""

from . import fields
from ._extension_build import CompilingWarning
from ._library import LIBRARY_PATH
from .memory import release_workspace, workspace_bytes
from .newton import (NewtonConfig, NewtonDivergenceError, NewtonStats, ParaGRU, ParaLSTM, ParaSLSTM,
                     compile_safe_config, newton_apply)
from .odeint import odeint
from .scan import linear_scan

__all__ = ["CompilingWarning", "LIBRARY_PATH", "NewtonConfig", "NewtonDivergenceError", "NewtonStats", "ParaGRU", "ParaLSTM",
           "ParaSLSTM", "compile_safe_config", "fields", "linear_scan", "newton_apply", "odeint", "release_workspace",
           "workspace_bytes"]
