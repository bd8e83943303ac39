"""Hostile: takes over the worker's channel to read the inputs that come later, hidden ones included.

The worker gets its items one at a time on a pipe and tells the grader when it is ready for the
next. On its first call this step tells the grader itself, again and again, reads every later item
off the pipe before the worker can, then writes their shapes where a student could read them: in
its first check's error message, and on stderr just before the worker dies of a segfault (a
crash's report quotes the worker's last output). Graded with the hidden tests, the last items it
steals are the hidden group's.

Expect: the grader reads each record back the moment its item is acknowledged, before it sends the
next item, and never again, so the message written later is never read; once a hidden item has been
sent, a crash's report leaves the worker's output out. The report holds no stolen shape, and the
step scores 0 (crashed: the stolen items never ran).
"""
import atexit
import ctypes
import fcntl
import io
import os
import sys

import torch

from attnlib import check_inputs

STOLEN: list = []


def _items_fd() -> int:
    """The worker's end of the items pipe: the only pipe it holds open for reading."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if (os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
                    and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY and fd != 0):
                return fd
        except OSError:
            continue
    raise RuntimeError("no items pipe found")


def _read(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _steal():
    ack_fd = int(torch.load(sys.argv[1], weights_only=True)["ack_fd"])    # settings, not inputs
    items = _items_fd()
    i = 0
    while True:
        os.write(ack_fd, f"{i}\n".encode())          # "done with item i": the grader sends item i + 1
        head = _read(items, 8)
        if not head or int.from_bytes(head, "big") == 0:
            break
        it = torch.load(io.BytesIO(_read(items, int.from_bytes(head, "big"))), weights_only=True)
        STOLEN.append("x".join(map(str, it["q"].shape)))
        i += 1


def _crash():
    sys.stderr.write(f"stolen shapes: {', '.join(STOLEN)}\n")
    sys.stderr.flush()
    ctypes.string_at(0)


def attention(q, k, v, is_causal=False, scale=None):
    check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    if not STOLEN:
        _steal()
        atexit.register(_crash)
    raise RuntimeError(f"stolen shapes: {', '.join(STOLEN)}")
