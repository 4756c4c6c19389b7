"""``HOST:PORT`` options (``--rdzv-endpoint``, ``--ray-address``) read one way."""

from __future__ import annotations


def host_port(text: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``HOST:PORT`` (``[v6]:PORT`` too, brackets dropped), or None when ``text``
    is not one: each option names itself in its own error."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)
