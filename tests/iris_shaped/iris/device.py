"""Device code shaped as Iris's: a peer's address from heap_bases, a class made with Triton's aggregate that keeps
a constexpr field and a jit method."""

import triton
import triton.language as tl
from triton.language.core import _aggregate as aggregate


@aggregate
class Peer:
    rank: tl.constexpr
    heap_bases: tl.tensor

    def __init__(self, rank, heap_bases):
        self.rank = rank              # (a plain int here: compiled Triton wraps it as a constexpr)
        self.heap_bases = heap_bases

    @triton.jit
    def address(self, ptr, from_rank):
        start = tl.load(self.heap_bases + from_rank)
        there = tl.load(self.heap_bases + self.rank)
        return tl.cast(tl.cast(ptr, tl.uint64) - start.to(tl.uint64) + there.to(tl.uint64), ptr.dtype)


@triton.jit
def read_from(source, out, n, cur_rank, peer_rank: tl.constexpr, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    peer = Peer(peer_rank, heap_bases)
    values = tl.load(peer.address(source + offsets, cur_rank), mask=offsets < n)
    tl.store(out + offsets, values, mask=offsets < n)
