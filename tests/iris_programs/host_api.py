"""Iris's host API as Iris's own tests use it: allocator options, refusals, and a CUDA graph captured and
replayed (on cpu ranks: gemmar's stand-in). Prints one ``name: value`` line per check."""

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def read_neighbour(buf, result, cur_rank: tl.constexpr, peer: tl.constexpr, heap_bases, B: tl.constexpr):
    offsets = tl.arange(0, B)
    tl.store(result + offsets, iris.load(buf + offsets, cur_rank, peer, heap_bases))


shmem = iris.iris(1 << 20)
rank, world = shmem.get_rank(), shmem.get_num_ranks()
out = shmem.heap.allocate(6, torch.float32)
made = shmem.zeros(2, 3, out=out)
print("out= shares memory:", made.data_ptr() == out.data_ptr(), tuple(made.shape))
print("nested shape:", tuple(shmem.empty(((2, 3, 4),)).shape), "scalar:", tuple(shmem.zeros(()).shape))
print("zero-size on the heap:", shmem.is_symmetric(shmem.ones(0)), shmem.is_symmetric(shmem.full((0,), 1.0)))
print("randint dtype:", shmem.randint(0, 10, (2, 2)).dtype, "linspace (5,):", tuple(shmem.linspace(0, 1, (5,)).shape))
print("requires_grad:", shmem.linspace(0.0, 1.0, 5, requires_grad=True).requires_grad)
g = torch.Generator(device="cuda")
g.manual_seed(7)
first = shmem.rand(4, generator=g).tolist()
g.manual_seed(7)
print("generator repeats:", shmem.rand(4, generator=g).tolist() == first)
cl = shmem.zeros_like(torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last))
print("channels_last kept:", cl.is_contiguous(memory_format=torch.channels_last), shmem.is_symmetric(cl))
for call in (lambda: shmem.zeros(3, out=shmem.heap.allocate(4, torch.float32)),
             lambda: shmem.zeros(4, dtype=torch.float32, out=shmem.heap.allocate(4, torch.int32)),
             lambda: shmem.zeros(3, out=torch.zeros(3)),
             lambda: shmem.zeros(2, layout=torch.sparse_coo),
             lambda: shmem.zeros(2, device="mps"),
             lambda: shmem.arange(5, 1)):
    try:
        call()
        print("refused: no")
    except (RuntimeError, ValueError) as e:
        print(f"refused: {type(e).__name__}: {e}")

# A device barrier and a remote read captured once, replayed with new data each time.
buf, result = shmem.zeros(8), shmem.zeros(8)
peer = (rank + 1) % world
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    shmem.device_barrier()
    read_neighbour[(1,)](buf, result, rank, peer, shmem.get_heap_bases(), 8)
    shmem.device_barrier()
print("capture ran nothing:", result.sum().item() == 0)
for i in range(3):
    buf.fill_(rank + 10 * i)
    shmem.device_barrier()
    graph.replay()
    print(f"replay {i}: read {result[0].item():g} (rank {peer} wrote {peer + 10 * i})")
shmem.barrier()
