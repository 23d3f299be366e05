"""ferry: GPU-driven collectives and channels.

The pure-Python parts import anywhere: ferry.dsl (collective programs), ferry.plan (the plan format
and its CPU verifier). The C++ library comes in through the extension ferry._ferry, built by
`pip install .`; without it (the sources on PYTHONPATH) those names are simply absent, and
`ferry.require_native()` says why.
"""

try:
    from ferry._ferry import (  # noqa: F401
        AlgorithmInfo,
        Bootstrap,
        Collective,
        CudaError,
        DataType,
        Error,
        InternalError,
        InvalidUsage,
        NotSupported,
        ProtocolError,
        ReduceOp,
        RemoteError,
        SysError,
        TcpBootstrap,
        Timeout,
        UniqueId,
        __version__,
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
