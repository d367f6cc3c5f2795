"""What commands that start an engine share: argparse types whose errors say what a value must be,
the port check done before the model loads, and the smallest usable device pool."""

from __future__ import annotations

import argparse
import socket
from typing import Any, Callable

__all__ = ["STARTUP_ERRORS", "positive_int", "non_negative_int", "port_number", "bind_port", "min_device_tokens"]

STARTUP_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, MemoryError)
"""What an engine raises for a start-up problem the user can fix (never a bug)."""


def _int_type(name: str, accept: Callable[[int], bool], rule: str) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {rule}, got {value!r}") from None
        if not accept(number):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {number}")
        return number

    parse.__name__ = name  # argparse names the type in some messages
    return parse


positive_int = _int_type("positive integer", lambda n: n > 0, "a positive integer")
non_negative_int = _int_type("non-negative integer", lambda n: n >= 0, "an integer >= 0")
port_number = _int_type("port", lambda n: 0 < n < 65536, "a port number in 1..65535")


def bind_port(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, taken before the model loads so a busy port fails at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # lets a restart reuse a TIME_WAIT port
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        reason = "is already in use" if exc.errno == 98 else f"cannot be bound ({exc.strerror or exc})"
        raise OSError(f"port {port} on {host} {reason}; pick another with --port") from None
    return sock


def min_device_tokens(tokenizer: Any) -> int:
    """KV slots of the smallest request: a one-word chat message and one reply token."""
    return len(tokenizer.encode_chat([{"role": "user", "content": "hi"}]).input_ids) + 1

