"""freescale.kernels: dispatch/combine (naive, PyTorch, Triton) and the SM-free transport.

Importing this package never needs a GPU: Triton kernels are jitted at first use and CUDA-only
transport pieces check for a device when constructed.
"""

from .dispatch import (
    KERNELS,
    DispatchConfig,
    DispatchPlan,
    DispatchResult,
    JaggedRows,
    combine,
    combine_jagged,
    default_kernel,
    dispatch,
    dispatch_jagged,
    plan_dispatch,
    resolve_kernel,
)
from .transport import (
    TorchDistTransport,
    Transport,
    TransportConfig,
    TransportHandle,
    TransportUnavailableError,
    make_transport,
)
from .transport_copy_engine import CopyEngineTransport, copy_engine_unavailable_reason

__all__ = [
    "KERNELS",
    "CopyEngineTransport",
    "DispatchConfig",
    "DispatchPlan",
    "DispatchResult",
    "JaggedRows",
    "TorchDistTransport",
    "Transport",
    "TransportConfig",
    "TransportHandle",
    "TransportUnavailableError",
    "combine",
    "combine_jagged",
    "copy_engine_unavailable_reason",
    "default_kernel",
    "dispatch",
    "dispatch_jagged",
    "make_transport",
    "plan_dispatch",
    "resolve_kernel",
]
