"""microrep: microsecond-scale state machine replication (Mu) for Python.

A state machine is any object with ``apply(index, command) -> bytes | None``,
``snapshot() -> bytes`` and ``restore(snapshot)`` (raise to refuse), and optionally
``digest() -> int``. Every replica applies the same commands in the same order.

>>> import microrep
>>> with microrep.LocalCluster(Counter, replicas=3) as cluster:   # doctest: +SKIP
...     cluster.propose(b"\\x05").reply

See docs/PYTHON.md.
"""

import atexit

from ._native import (
    BackloggedError,
    Committed,
    Config,
    ConfigError,
    Error,
    Index,
    Node,
    NotLeaderError,
    OutcomeUnknownError,
    Pending,
    ProposeTimeoutError,
    ShutdownError,
    StartError,
    TooLargeError,
    __version__,
    close_all,
)
from .cluster import LocalCluster

# Replica threads call into Python; stop them before the interpreter goes away.
atexit.register(close_all)

__all__ = [
    "BackloggedError",
    "Committed",
    "Config",
    "ConfigError",
    "Error",
    "Index",
    "LocalCluster",
    "Node",
    "NotLeaderError",
    "OutcomeUnknownError",
    "Pending",
    "ProposeTimeoutError",
    "ShutdownError",
    "StartError",
    "TooLargeError",
    "__version__",
    "close_all",
]
