"""Training text that needs no download: the course's own sources, as bytes.

Every ``*.md`` and ``*.py`` file under ``notebooks/``, ``attnlib/``, ``solutions/`` and the top level,
in sorted order (about 1 MB): prose, math and code, enough for a byte-level model to learn
something visible in a few hundred steps. Batches are drawn with a seeded generator, so a run is
reproducible and two runs with different attention see the same data.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def source_bytes() -> bytes:
    """The course's sources, joined: what ``corpus`` trains on unless ``CAPSTONE_CORPUS`` names a file."""
    files = sorted(p for d in ("", "notebooks", "attnlib", "solutions") for p in (REPO / d).glob("*")
                   if p.suffix in (".md", ".py") and p.is_file())
    return b"\n".join(p.read_bytes() for p in files)


def synthetic_bytes(n_words: int = 40000, seed: int = 0) -> bytes:
    """A text that does not change when the repository does: ``n_words`` words drawn from twenty, seeded.

    For tests that compare two training runs to a tight tolerance: AdamW turns the legitimate rounding
    difference of two runs into a visible one where a gradient is as small as its eps (1e-8), and which
    weights sit there depends on the text; the default corpus (the repository's sources) moves with every
    edit. Point ``CAPSTONE_CORPUS`` at a file holding these bytes.
    """
    words = [b"attention", b"softmax", b"tile", b"kernel", b"query", b"key", b"value", b"warp", b"the", b"a",
             b"of", b"to", b"in", b"is", b"block", b"mask", b"scale", b"row", b"sum", b"max"]
    g = torch.Generator().manual_seed(seed)
    return b" ".join(words[i] for i in torch.randint(len(words), (n_words,), generator=g).tolist())


def corpus() -> torch.Tensor:
    """The training text as int64 bytes. ``CAPSTONE_CORPUS=FILE`` pins it to that file's bytes: the sources
    change with every edit, so runs that must see the same data (tests/test_capstone_dist.py) pin it."""
    path = os.environ.get("CAPSTONE_CORPUS")
    data = Path(path).read_bytes() if path else source_bytes()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def batches(data: torch.Tensor, batch: int, context: int, seed: int = 0, rank: int = 0, world: int = 1):
    """Endless (x, y) pairs of (batch, context) int64; rank r of w draws its own slice of each global batch."""
    g = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(len(data) - context - 1, (batch * world,), generator=g)[rank * batch:(rank + 1) * batch]
        x = torch.stack([data[s:s + context] for s in starts.tolist()])
        y = torch.stack([data[s + 1:s + 1 + context] for s in starts.tolist()])
        yield x, y
