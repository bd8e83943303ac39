"""Peak memory on a CPU, where there is no allocator to ask.

``LiveBytes`` is a ``TorchDispatchMode`` that counts the bytes of every storage
created under it while that storage is alive: its ``peak`` is the CPU stand-in
for ``torch.cuda.max_memory_allocated()``, and ``largest`` is the biggest single
storage (an N x N score matrix stands out). Storages that existed before the
mode (the inputs) are not counted; a finalizer subtracts a storage when it is freed.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live = self.peak = self.largest = 0
        self.known = set()                       # ids of storages already counted, or pre-existing

    def _free(self, key, n):
        self.known.discard(key)
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in tree_leaves((args, kwargs)):   # inputs made before the mode are not ours to count
            if isinstance(t, torch.Tensor):
                self.known.add(id(t.untyped_storage()))
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if id(st) not in self.known:
                    n = st.nbytes()
                    self.known.add(id(st))
                    weakref.finalize(st, self._free, id(st), n)
                    self.live += n
                    self.peak = max(self.peak, self.live)
                    self.largest = max(self.largest, n)
        return out
