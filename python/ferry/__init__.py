"""ferry: GPU-driven collectives and channels.

The pure-Python parts import anywhere: ferry.dsl (collective programs), ferry.plan (the plan format
and its CPU verifier). The C++ library comes in through the extension ferry._ferry, built by
`pip install .`; without it (the sources on PYTHONPATH) those names are simply absent, and
`ferry.require_native()` says why.
"""

try:
    from ferry._ferry import (  # noqa: F401
        Accumulation,
        AlgorithmInfo,
        Allocation,
        Bootstrap,
        Collective,
        CollectiveArgs,
        Communicator,
        Connection,
        CudaError,
        DataType,
        Error,
        Host2DeviceSemaphore,
        Host2HostSemaphore,
        InternalError,
        InvalidUsage,
        MemoryChannel,
        MemoryDevice2DeviceSemaphore,
        NativeAlgorithm,
        NotSupported,
        PortChannel,
        PortChannelService,
        ProtocolError,
        ReduceOp,
        RegisteredMemory,
        RemoteError,
        SysError,
        TcpBootstrap,
        Timeout,
        Transport,
        UniqueId,
        __version__,
        gpu_alloc,
        host_alloc,
        size_of,
    )

    from ferry.comm import Comm, PreMulSum, Registration  # noqa: F401

    _native_error = None
except ImportError as e:  # the sources alone: the DSL and the plan tools still work
    _native_error = e


def native_available():
    """True when the C++ extension ferry._ferry was imported."""
    return _native_error is None


def require_native():
    """Raises ImportError, saying how to get the extension, when it is missing."""
    if _native_error is not None:
        raise ImportError(
            "ferry's C++ extension (ferry._ferry) is not importable; install the package with "
            "`pip install .` from the repository root, or put a build's python/ folder on PYTHONPATH"
        ) from _native_error


def include_dir():
    """The folder holding ferry's headers (ferry/device/*.hpp: the device handles), for kernels
    compiled at run time: the installed package's copy, else the source tree's."""
    import os

    here = os.path.dirname(os.path.realpath(__file__))
    for candidate in (os.path.join(here, "include"), os.path.join(here, "..", "..", "include")):
        if os.path.isfile(os.path.join(candidate, "ferry", "device", "memory_channel.hpp")):
            return os.path.normpath(candidate)
    raise FileNotFoundError("ferry's headers are neither in the package (pip install .) nor in a source tree")
