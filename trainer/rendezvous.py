"""The c10d rendezvous endpoint of a job on several nodes, checked before torchrun starts.

torchrun reports a taken port badly: node 0's agent (which hosts the rendezvous store) gave up after
~30 s with a 45-line traceback around EADDRINUSE, and a node that reached another program at the
endpoint waited silently in the store's handshake until the job's timeout (the store client's own
timeout does not cover its handshake). So, before torchrun starts:

- node 0 binds the endpoint's port itself, on every address as the store does (``SO_REUSEADDR``), and
  lets it go at once: a port another program holds fails in a second, naming it;
- another node connects to the endpoint. Nothing listening is fine (node 0 may start later, and
  torchrun waits for it); something that accepts must answer a store's handshake (torch's own client,
  in a thread) within ``PROBE_SECONDS``, or it is another program and the node stops, naming it.
"""

from __future__ import annotations

import errno
import socket
import threading
from datetime import timedelta

from freescale.endpoints import host_port

PROBE_SECONDS = 10.0


def check_endpoint(endpoint: str, hosting: bool, probe_seconds: float = PROBE_SECONDS) -> None:
    """Raise ``ValueError`` (one line naming ``--rdzv-endpoint``) when the rendezvous cannot work."""
    parsed = host_port(endpoint)
    if parsed is None:  # Nodes refuses it first; nothing to check
        return
    host, port = parsed
    problem = port_taken(host, port) if hosting else not_a_store(host, port, probe_seconds)
    if problem:
        raise ValueError(f"--rdzv-endpoint {endpoint}: {problem}")


def port_taken(host: str, port: int) -> str:
    """Why node 0's store could not listen on ``port`` ("" when it can)."""
    family, wildcard = (socket.AF_INET6, "::") if ":" in host else (socket.AF_INET, "0.0.0.0")
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((wildcard, port))
            sock.listen(1)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return (
                    f"port {port} is already in use on this machine, where node 0 hosts the rendezvous; "
                    "stop the program holding it or choose another port (the same on every node)"
                )
            return f"node 0 cannot listen on port {port} here ({error.strerror}); choose another port"
    return ""


def not_a_store(host: str, port: int, seconds: float) -> str:
    """Why the program at ``host:port`` is not node 0's rendezvous ("" when it is, or nothing listens yet)."""
    try:
        socket.create_connection((host, port), timeout=seconds).close()
    except OSError:
        return ""  # node 0 has not started yet: torchrun waits for it, as before
    outcome: dict[str, BaseException | None] = {}

    def handshake() -> None:
        try:
            from torch.distributed import TCPStore

            TCPStore(host, port, is_master=False, timeout=timedelta(seconds=seconds), wait_for_workers=False)
            outcome["error"] = None
        except Exception as error:  # any failure means: not a store this node can use
            outcome["error"] = error

    thread = threading.Thread(target=handshake, name="rdzv-probe", daemon=True)  # may hang: left behind
    thread.start()
    thread.join(seconds)
    if "error" in outcome and outcome["error"] is None:
        return ""
    return (
        f"the program listening there is not node 0's rendezvous (no c10d store handshake within {seconds:g} s): "
        "the port is taken by another program on node 0's host, or the endpoint names the wrong host or port"
    )
