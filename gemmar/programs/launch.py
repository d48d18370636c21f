"""How today's Iris programs start their ranks, made to start on gemmar's instead (the rank side of ``gemmar run``).

Iris programs no longer expect ``mpirun``: most call ``torch.multiprocessing.spawn(fn, args, nprocs=N)`` to
make N processes, the rest expect ``torchrun``'s environment; either way they then call
``torch.distributed.init_process_group`` and use ``dist.barrier`` / ``all_gather`` / ``broadcast``. Under
``gemmar run -r N`` every rank already is one of the N processes, with its heap, its watchdogs and its
reaper, so while a program runs on a rank:

- ``mp.spawn(fn, args, nprocs=N)`` calls ``fn(rank, *args)`` right there, once (``nprocs`` must be N);
- ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` are set
  as torchrun sets them;
- ``torch.cuda.set_device(LOCAL_RANK)`` on ranks that share one GPU selects that GPU, said once;
- ``dist.init_process_group(...)`` joins the ranks of this run whatever its ``init_method`` says: through a
  file store in the cluster's private folder (no port another user could reach), on ``gloo`` on the cpu
  backend and for ranks sharing a GPU, on ``nccl`` with a GPU per rank. A backend or ``device_id`` that cannot
  apply is mapped, said once; a ``rank`` or ``world_size`` other than gemmar's is refused in one line.
A process group the program leaves open is closed when it ends, so the next program can start one.
A collective that fails because a rank of the run has ended (gloo: "Connection closed by peer") says which rank
and how it ended, in one line (``departures.py``).
"""

import contextlib
import datetime
import os
import sys

from ..errors import RankLeftError, UsageError
from . import departures

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                      "MASTER_PORT")

_run = None   # this rank's program while it runs: dict(rank, world_size, backend, device, store_path, told)


def _say_once(key, message):
    if _run is None:   # (torch's functions stay replaced between programs; said only while one runs)
        return
    if key not in _run["told"] and _run["rank"] == 0:
        print(f"[gemmar] {message}", file=sys.stderr, flush=True)
    _run["told"].add(key)


def _current():
    if _run is None:
        raise UsageError("this call works while a program runs on gemmar's ranks (gemmar run, Cluster.run_script)")
    return _run


def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
    """``torch.multiprocessing.spawn`` on gemmar's ranks: ``fn(rank, *args)`` on this rank."""
    run = _current()
    if nprocs != run["world_size"]:
        raise UsageError(f"mp.spawn(nprocs={nprocs}): gemmar run started {run['world_size']} ranks: run the program "
                         f"with -r {nprocs}, or pass --num_ranks {run['world_size']} if it has that option")
    fn(run["rank"], *args)
    return None if join else _Joined()


class _Joined:
    """What ``spawn(join=False)`` returns: the function has already run on this rank."""

    def join(self, timeout=None):
        return True


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                       group_name="", pg_options=None, device_id=None, **unused):
    """``dist.init_process_group`` joining this run's ranks (see the module's docstring)."""
    import torch.distributed as dist

    run = _current()
    for name, given, ours in (("rank", rank, run["rank"]), ("world_size", world_size, run["world_size"])):
        if given not in (-1, None, ours):
            raise UsageError(f"dist.init_process_group({name}={given}): this process is gemmar's rank {run['rank']} of "
                             f"{run['world_size']} (gemmar run -r {run['world_size']})")
    if dist.is_initialized():
        # With a GPU per rank the heap's symmetric memory needs the ranks' default group, made when the rank
        # started (on gloo for CPU tensors and nccl for GPU ones): the program uses it, and never ends it.
        _say_once("made", f"dist.init_process_group(backend={backend!r}): the ranks' process group exists already "
                          f"({dist.get_backend()}, made with gemmar's heap); the program uses it")
        return
    chosen = "nccl" if run["backend"] == "cuda" and run["gpu_per_rank"] else "gloo"
    asked = (backend or "").split(":")[0].lower() or None
    if asked not in (None, chosen):
        where = "on the cpu backend" if run["backend"] == "cpu" else "for ranks sharing one GPU"
        _say_once(("backend", asked), f"dist.init_process_group(backend={asked!r}): {chosen} between gemmar's "
                                      f"ranks {where}")
    if device_id is not None and run["backend"] == "cpu":
        _say_once("device_id", f"dist.init_process_group(device_id={device_id}): the cpu backend has no GPU; dropped")
        device_id = None
    elif device_id is not None:
        device_id = run["device"]
    if chosen == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ and os.path.exists("/sys/class/net/lo"):
        # gloo's ranks talk over TCP; by default on the address the host name resolves to, which may be a
        # network interface. Loopback keeps them on this machine.
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    file_store = dist.FileStore(run["store_path"], run["world_size"])
    options = dict(backend=chosen, store=file_store, rank=run["rank"], world_size=run["world_size"],
                   timeout=timeout or datetime.timedelta(seconds=run["timeout_s"]))
    if device_id is not None:
        options["device_id"] = device_id
    _original["init_process_group"](**options)


def _heap_group():
    """Whether the default process group is the one this rank's heap made (a GPU per rank), not a program's."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def destroy_process_group(group=None):
    """``dist.destroy_process_group``: a program's own groups end; the heap's default group stays (the heap
    lives on after the program, and Iris programs end theirs as they finish)."""
    run = _run
    if group is None and run is not None and run["heap_group"]:
        return None
    return _original["destroy_process_group"](group)


def set_device(device):
    """``torch.cuda.set_device`` for ranks sharing one GPU: every rank's device is that GPU (a program's
    ``set_device(LOCAL_RANK)`` names a GPU that is not there), said once."""
    import torch

    run = _run
    if run is not None and run["backend"] == "cuda" and not run["gpu_per_rank"]:
        asked = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if asked != run["device"]:
            _say_once("set_device", f"torch.cuda.set_device({device}): these ranks share {run['device']}; "
                                    f"each rank uses it")
            device = run["device"]
    return _original["set_device"](device)


# torch.distributed's collectives a program (or a real Iris: ``Iris.barrier``, its heap's all_gather) meets its ranks
# with. The sanitizer learns of each meeting (``arrive`` before, ``leave`` after): what every rank did before it
# happens before what any rank does after it, as gemmar's own heap barrier says with its flags.
HOST_COLLECTIVES = ("barrier", "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
                    "broadcast", "broadcast_object_list", "reduce_scatter_tensor", "all_to_all_single", "all_to_all")


def _told_to_sanitizer(name, collective):
    import torch.distributed as dist

    from .. import sanitizer

    def meet(*args, **kwargs):
        group = kwargs.get("group")
        ranks = tuple(dist.get_process_group_ranks(group)) if group is not None else None
        counts = _run["meetings"] if _run is not None else {}
        counts[ranks] = counts.get(ranks, 0) + 1
        meeting = (ranks, counts[ranks])
        sanitizer.host_event("arrive", meeting=meeting)
        try:
            out = collective(*args, **kwargs)
        except RuntimeError as error:   # (gloo's; a bad argument is no RuntimeError) re-raised unless a rank left
            _raise_if_a_rank_left(error, name)
            raise
        sanitizer.host_event("leave", meeting=meeting)
        return out

    meet.__name__ = meet.__qualname__ = name
    meet.__doc__ = collective.__doc__
    return meet


def _raise_if_a_rank_left(error, name):
    """A collective that failed because a rank of this run has ended (gloo fails at once when a peer's process
    group is gone): a RankLeftError naming that rank and how it ended, as soon as the client has said so."""
    left = _run and departures.who_left(_run["store_path"], _run["rank"], wait_s=2.0)
    if left:
        raise RankLeftError(f"{left} before the dist.{name}") from error


class _Done:
    """What an ``async_op=True`` collective returns when it was done at once."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    """``dist.all_to_all``; where the group's backend has none (gloo of some torch releases with GPU tensors: the
    group of ranks sharing one GPU), the same exchange through ``all_gather``, said once."""
    import torch.distributed as dist

    try:
        return _original["all_to_all"](output_tensor_list, input_tensor_list, group=group, async_op=async_op)
    except RuntimeError as error:
        if "does not support alltoall" not in str(error):   # (torch's words; raised on every rank alike)
            raise
        _say_once("all_to_all", f"dist.all_to_all: the {dist.get_backend(group)} group has none here; "
                                f"gemmar exchanges the tensors through dist.all_gather instead")
    all_to_all_by_gather(output_tensor_list, input_tensor_list, group)
    return _Done() if async_op else None


def all_to_all_by_gather(output_tensor_list, input_tensor_list, group=None):
    """Rank i's ``input_tensor_list[j]`` into rank j's ``output_tensor_list[i]``, by gathering every rank's
    inputs (tensors of one size and dtype: what Iris's tests and the usual all-to-all send)."""
    import torch
    import torch.distributed as dist

    world, me = dist.get_world_size(group), dist.get_rank(group)
    tensors = list(input_tensor_list) + list(output_tensor_list)
    if len(input_tensor_list) != world or len(output_tensor_list) != world:
        raise UsageError(f"dist.all_to_all: {len(input_tensor_list)} inputs and {len(output_tensor_list)} outputs "
                         f"for a group of {world} ranks: give one of each per rank")
    shapes = {(t.numel(), t.dtype) for t in tensors}
    if len(shapes) != 1:
        raise UsageError(f"dist.all_to_all over {dist.get_backend(group)} here: gemmar exchanges tensors of one size "
                         f"and dtype, not {sorted((n, str(d)) for n, d in shapes)}")
    size = tensors[0].numel()
    sent = torch.cat([t.reshape(-1) for t in input_tensor_list])
    gathered = [torch.empty_like(sent) for _ in range(world)]
    # (torch's own all_gather: the sanitizer already knows this meeting as the all_to_all)
    _original.get("all_gather", dist.all_gather)(gathered, sent, group=group)
    for source, out in enumerate(output_tensor_list):
        out.copy_(gathered[source][me * size:(me + 1) * size].view(out.shape))


_original = {}


def install():
    """Put :func:`spawn` and :func:`init_process_group` in place of torch's, on this rank, once."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    import torch.multiprocessing as mp

    if _original:
        return
    import torch

    _original["spawn"], _original["init_process_group"] = mp.spawn, dist.init_process_group
    _original["set_device"] = torch.cuda.set_device
    mp.spawn = spawn
    torch.cuda.set_device = set_device
    dist.init_process_group = c10d.init_process_group = init_process_group
    _original["destroy_process_group"] = dist.destroy_process_group
    dist.destroy_process_group = c10d.destroy_process_group = destroy_process_group
    for name in HOST_COLLECTIVES:
        if hasattr(dist, name):
            _original[name] = getattr(dist, name)
            ours = all_to_all if name == "all_to_all" else _original[name]
            setattr(dist, name, _told_to_sanitizer(name, ours))


@contextlib.contextmanager
def program_run(rank, world_size, backend, device, gpu_per_rank, store_path, timeout_s):
    """While a program runs on this rank: torchrun's environment and the launch calls above."""
    global _run
    install()
    saved = {name: os.environ.get(name) for name in TORCHRUN_VARIABLES}
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT="0")   # (nothing listens: init_process_group meets through the file store)
    _run = dict(rank=rank, world_size=world_size, backend=backend, device=device, gpu_per_rank=gpu_per_rank,
                store_path=store_path, timeout_s=timeout_s, told=set(), meetings={}, heap_group=_heap_group())
    from ..runtime import rank as rank_runtime

    try:
        # (a barrier of gemmar's heap that a rank which has ended can no longer reach gives up: departures.py)
        with departures.watching(store_path, rank, rank_runtime.local_ranks()[0].heap):
            yield
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and not _run["heap_group"]:
            with contextlib.suppress(Exception):
                _original["destroy_process_group"]()
        _run = None
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
