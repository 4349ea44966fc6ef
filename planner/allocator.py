"""PyTorch's CUDA caching allocator as a model: replay a step's allocations and frees, get what nvidia-smi shows.

Pure Python (no torch): the estimate side and the app may import it. It follows DeviceCachingAllocator in
c10/cuda/CUDACachingAllocator.cpp (read at pytorch/pytorch commit 001074d25084fdb87a799823e395a50f5ec044d3;
the configuration's defaults from c10/cuda/CUDAAllocatorConfig.h at 012117ce596c0254dab7ef2cee454df935c6ebd9 and
c10/core/AllocatorConfig.h). Each rule names the function it comes from:

- DeviceCachingAllocator::malloc: round_size -> get_pool -> get_allocation_size -> get_free_block (best fit) ->
  alloc_block (a new segment) -> release_available_cached_blocks (only with max_split_size_mb) + alloc_block ->
  release_cached_blocks (empty_cache: every unsplit cached segment back to CUDA) + alloc_block -> the OOM error;
  then should_split / alloc_found_block (split off the remainder).
- DeviceCachingAllocator::free -> free_block: merge with free neighbours of the same segment (try_merge_blocks),
  back into the pool's set. Segments are never given back except by release_cached_blocks (the cache carries
  over from step to step).
- expandable_segments:True: alloc_block -> try_allocate_expandable_block -> find_expandable_block / map_block;
  release_cached_blocks -> release_blocks -> unmap_block. Reserved = the mapped pages.

Stats as the allocator keeps them (increase_stat / decrease_stat): allocated_bytes counts a handed-out block's
size (the 512-B rounded request, or the whole block when it is not split), reserved_bytes the segments' sizes
(cudaMalloc'd, or mapped pages of an expandable segment). max_memory_reserved is reserved_bytes' peak.

Not modelled (documented, none of the planner's steps uses them): several streams (record_stream's deferred frees:
every block here is on one stream, as a training step on the default stream is), CUDA-graph private pools,
garbage_collection_threshold, roundup_power2_divisions (default off), per-process memory fractions.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field

# c10/cuda/CUDACachingAllocator.cpp, the constants at the top of namespace Native:
K_MIN_BLOCK_SIZE = 512            # kMinBlockSize: "all sizes are rounded to at least 512 bytes"
K_SMALL_SIZE = 1 << 20            # kSmallSize: "largest 'small' allocation is 1 MiB"
K_SMALL_BUFFER = 2 << 20          # kSmallBuffer: "'small' allocations are packed in 2 MiB blocks"
K_LARGE_BUFFER = 20 << 20         # kLargeBuffer: "'large' allocations may be packed in 20 MiB blocks"
K_MIN_LARGE_ALLOC = 10 << 20      # kMinLargeAlloc: "allocations between 1 and 10 MiB may use kLargeBuffer"
K_ROUND_LARGE = 2 << 20           # kRoundLarge: "round up large allocations to 2 MiB"
# CUDAAllocatorConfig's default max_split_size: std::numeric_limits<size_t>::max() (no limit)
NO_SPLIT_LIMIT = (1 << 64) - 1
# ExpandableSegment's page ("segment_size_"): find_expandable_block, `pool->is_small ? kSmallBuffer : kLargeBuffer`
# (Note [Expandable Segments]: "we use 2MiB pages for our small pool and 20MiB pages for our large pool")
EXPANDABLE_PAGE_SMALL = K_SMALL_BUFFER
EXPANDABLE_PAGE_LARGE = K_LARGE_BUFFER


def round_size(size: int) -> int:
    """DeviceCachingAllocator::round_size without roundup_power2_divisions (its default, off): at least
    kMinBlockSize, else up to a multiple of kMinBlockSize."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def get_allocation_size(size: int) -> int:
    """DeviceCachingAllocator::get_allocation_size: the cudaMalloc size for a rounded request with no cached
    block: a 2 MiB small segment (<= 1 MiB), a 20 MiB segment (below 10 MiB), else the request rounded to 2 MiB."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


class OutOfMemory(Exception):
    """A request no cached block, no new segment and no empty_cache retry could satisfy (malloc's
    "CUDA out of memory. Tried to allocate ...")."""

    def __init__(self, index: int, size: int, alloc_size: int, allocated: int, reserved: int, capacity: int):
        self.index, self.size, self.alloc_size = index, size, alloc_size
        self.allocated, self.reserved, self.capacity = allocated, reserved, capacity
        super().__init__(f"out of memory at event {index}: tried to allocate {alloc_size:,} B; "
                         f"{allocated:,} B allocated, {reserved:,} B reserved of {capacity:,} B")


class Block:
    """c10's Block: one piece of a segment (free or handed out); prev/next link the pieces of one segment."""
    __slots__ = ("size", "addr", "small", "prev", "next", "allocated", "mapped", "expandable", "stream", "requested")

    def __init__(self, size: int, addr: int, small: bool, stream: int = 0, expandable=None):
        self.size, self.addr, self.small, self.stream = size, addr, small, stream
        self.prev = self.next = None
        self.allocated = False
        self.requested = 0
        self.mapped = True
        self.expandable = expandable  # the _Expandable it lives in, or None (a cudaMalloc'd segment)

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def key(self) -> tuple:
        # BlockComparatorSize: by stream, then size, then address
        return (self.stream, self.size, self.addr)


class _Pool:
    """BlockPool: the free blocks of one pool in BlockComparatorSize order (a sorted list of keys), and the
    unmapped ranges of its expandable segments (BlockComparatorAddress order)."""

    def __init__(self, small: bool):
        self.small = small
        self.keys: list[tuple] = []
        self.blocks: dict[tuple, Block] = {}
        self.unmapped: list[tuple] = []          # (stream, addr)
        self.unmapped_blocks: dict[tuple, Block] = {}

    def insert(self, b: Block) -> None:
        k = b.key()
        insort(self.keys, k)
        self.blocks[k] = b

    def erase(self, b: Block) -> None:
        k = b.key()
        i = bisect_left(self.keys, k)
        del self.keys[i]
        del self.blocks[k]

    def insert_unmapped(self, b: Block) -> None:
        k = (b.stream, b.addr)
        insort(self.unmapped, k)
        self.unmapped_blocks[k] = b

    def erase_unmapped(self, b: Block) -> None:
        k = (b.stream, b.addr)
        del self.unmapped[bisect_left(self.unmapped, k)]
        del self.unmapped_blocks[k]


class _Expandable:
    """ExpandableSegment: a reserved address range of page-sized handles, mapped on demand."""
    __slots__ = ("base", "page", "pages")

    def __init__(self, base: int, page: int, pages: int):
        self.base, self.page, self.pages = base, page, pages


@dataclass
class ReplayResult:
    """What a replay answers. Bytes as torch.cuda.memory_stats names them."""
    reserved_peak_bytes: int = 0          # max_memory_reserved
    allocated_peak_bytes: int = 0         # max_memory_allocated (rounded blocks)
    requested_peak_bytes: int = 0         # the requests' own peak (unrounded)
    reserved_end_bytes: int = 0
    allocated_end_bytes: int = 0
    # at the moment allocated peaks: reserved less allocated per pool (the cached bytes no tensor uses then)
    fragmentation_at_peak: dict = field(default_factory=dict)
    segments: int = 0                     # cudaMalloc'd segments (or map calls) made
    retries: int = 0                      # num_alloc_retries: release_cached_blocks + alloc_block again
    oom: dict | None = None               # where a request failed: event index, sizes, allocated/reserved then
    # per window between MARK events (each MARK resets the peaks, as reset_peak_memory_stats does):
    # [label, max_memory_reserved, max_memory_allocated] of the window that the label opened
    windows: list = field(default_factory=list)

    @property
    def fragmentation_bytes(self) -> int:
        """max_memory_reserved - max_memory_allocated: what nvidia-smi shows beyond the tensors' own peak."""
        return self.reserved_peak_bytes - self.allocated_peak_bytes

    def as_dict(self) -> dict:
        return {"reserved_peak_bytes": self.reserved_peak_bytes, "allocated_peak_bytes": self.allocated_peak_bytes,
                "requested_peak_bytes": self.requested_peak_bytes, "fragmentation_bytes": self.fragmentation_bytes,
                "fragmentation_at_peak": dict(self.fragmentation_at_peak), "reserved_end_bytes": self.reserved_end_bytes,
                "segments": self.segments, "alloc_retries": self.retries, "oom": self.oom,
                "windows": [list(w) for w in self.windows]}


class CachingAllocator:
    """One device's DeviceCachingAllocator. `capacity`: the bytes cudaMalloc can hand out (the device's total less
    the CUDA context and anything else), None: unlimited. `max_split_size_mb` / `expandable_segments`: the
    PYTORCH_CUDA_ALLOC_CONF options of those names."""

    def __init__(self, capacity: int | None = None, max_split_size_mb: int | None = None,
                 expandable_segments: bool = False):
        self.capacity = capacity
        self.max_split = NO_SPLIT_LIMIT if max_split_size_mb is None else max_split_size_mb << 20
        self.expandable_segments = expandable_segments
        self.small = _Pool(True)
        self.large = _Pool(False)
        self.reserved = 0
        self.allocated = 0
        self.requested = 0
        self.reserved_by_pool = {True: 0, False: 0}
        self.allocated_by_pool = {True: 0, False: 0}
        self.reserved_peak = 0
        self.allocated_peak = 0
        self.requested_peak = 0
        self.frag_at_peak: dict = {}
        # the peaks since the last reset_peak (torch.cuda.reset_peak_memory_stats: resetPeakStats sets each peak to
        # its current value)
        self.window_reserved_peak = 0
        self.window_allocated_peak = 0
        self.segments = 0
        self.retries = 0
        self._next_addr = 1 << 40   # a fresh virtual address for each segment (cudaMalloc's own are opaque)
        self._expandable: dict[tuple, list] = {}

    def reset_peak(self) -> None:
        """resetPeakStats (torch.cuda.reset_peak_memory_stats): the window's peaks start from the current values."""
        self.window_reserved_peak = self.reserved
        self.window_allocated_peak = self.allocated

    # -- malloc ------------------------------------------------------------------------------------------------------
    def malloc(self, orig_size: int, stream: int = 0, index: int = -1) -> Block:
        """DeviceCachingAllocator::malloc; raises OutOfMemory as the allocator's TORCH_CHECK_WITH does."""
        size = round_size(orig_size)
        pool = self.small if size <= K_SMALL_SIZE else self.large          # get_pool
        alloc_size = get_allocation_size(size)
        block = self._get_free_block(pool, size, stream)
        if block is None:
            block = (self._alloc_block(pool, size, alloc_size, stream)
                     or (self._release_available_cached_blocks(pool, size, stream)
                         and self._alloc_block(pool, size, alloc_size, stream))
                     or self._retry_after_release(pool, size, alloc_size, stream))
        if block is None:
            raise OutOfMemory(index, orig_size, alloc_size, self.allocated, self.reserved, self.capacity or 0)
        return self._alloc_found_block(block, pool, size, orig_size)

    def _retry_after_release(self, pool: _Pool, size: int, alloc_size: int, stream: int):
        # malloc: `release_cached_blocks(context) && alloc_block(params, true, ...)`; isRetry counts num_alloc_retries
        self.release_cached_blocks()
        self.retries += 1
        return self._alloc_block(pool, size, alloc_size, stream)

    def _get_free_block(self, pool: _Pool, size: int, stream: int):
        """get_free_block: the smallest cached block of this stream at least `size` (lower_bound by (stream, size)),
        with the expandable-segment look-ahead and the two max_split_size rules."""
        keys = pool.keys
        i = bisect_left(keys, (stream, size, -1))
        if i == len(keys) or keys[i][0] != stream:
            return None
        b = pool.blocks[keys[i]]
        if b.expandable is not None and self.expandable_segments:
            # "for the purposes of best fit we consider its size to be the size it can expand to"
            def expandable_size(x: Block) -> int:
                return x.size + (x.next.size if x.next is not None and not x.next.mapped else 0)
            j = i + 1
            while (b.expandable is not None and j < len(keys) and keys[j][0] == stream
                   and expandable_size(pool.blocks[keys[j]]) < expandable_size(b)):
                i, b = j, pool.blocks[keys[j]]
                j += 1
        # "Do not return an oversized block for a large request"
        if size < self.max_split and b.size >= self.max_split:
            return None
        # "Allow oversized block size to be rounded up but within a limit" (kLargeBuffer;
        # max_non_split_rounding_size in newer sources, default kLargeBuffer)
        if size >= self.max_split and b.size >= size + K_LARGE_BUFFER:
            return None
        pool.erase(b)
        return b

    def _fits(self, nbytes: int) -> bool:
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def _alloc_block(self, pool: _Pool, size: int, alloc_size: int, stream: int):
        """alloc_block: a new segment of alloc_size (cudaMalloc), or with expandable_segments the segment grown."""
        if self.expandable_segments:
            return self._try_allocate_expandable_block(pool, size, stream)
        if not self._fits(alloc_size):
            return None  # cudaErrorMemoryAllocation
        b = Block(alloc_size, self._new_address(alloc_size), pool.small, stream)
        self._reserve(pool.small, alloc_size)
        self.segments += 1
        return b

    def _new_address(self, nbytes: int) -> int:
        addr = self._next_addr
        self._next_addr += nbytes + K_ROUND_LARGE   # a gap, so two segments are never "neighbours"
        return addr

    def _reserve(self, small: bool, nbytes: int) -> None:
        self.reserved += nbytes
        self.reserved_by_pool[small] += nbytes
        if self.reserved > self.reserved_peak:
            self.reserved_peak = self.reserved
        if self.reserved > self.window_reserved_peak:
            self.window_reserved_peak = self.reserved

    def _unreserve(self, small: bool, nbytes: int) -> None:
        self.reserved -= nbytes
        self.reserved_by_pool[small] -= nbytes

    def _should_split(self, b: Block, size: int) -> bool:
        """should_split: small pool (or expandable segments) when >= kMinBlockSize remains; large pool only below
        max_split_size and when more than kSmallSize remains."""
        remaining = b.size - size
        if b.small or self.expandable_segments:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self.max_split and remaining > K_SMALL_SIZE

    def _alloc_found_block(self, b: Block, pool: _Pool, size: int, orig_size: int) -> Block:
        """alloc_found_block: split the remainder off (back into the pool) when should_split says so."""
        if self._should_split(b, size):
            remaining = b
            b = Block(size, remaining.addr, remaining.small, remaining.stream, remaining.expandable)
            b.prev = remaining.prev
            if b.prev is not None:
                b.prev.next = b
            b.next = remaining
            remaining.prev = b
            remaining.addr += size
            remaining.size -= size
            pool.insert(remaining)
        b.allocated = True
        b.requested = orig_size
        self.allocated += b.size
        self.allocated_by_pool[b.small] += b.size
        self.requested += orig_size
        if self.requested > self.requested_peak:
            self.requested_peak = self.requested
        if self.allocated > self.window_allocated_peak:
            self.window_allocated_peak = self.allocated
        if self.allocated > self.allocated_peak:
            self.allocated_peak = self.allocated
            self.frag_at_peak = {"small_pool": self.reserved_by_pool[True] - self.allocated_by_pool[True],
                                 "large_pool": self.reserved_by_pool[False] - self.allocated_by_pool[False]}
        return b

    # -- free ----------------------------------------------------------------------------------------------------------
    def free(self, b: Block) -> None:
        """free -> free_block: merge with free neighbours (try_merge_blocks), back into the pool."""
        b.allocated = False
        self.allocated -= b.size
        self.allocated_by_pool[b.small] -= b.size
        self.requested -= b.requested
        pool = self.small if b.small else self.large
        for other in (b.prev, b.next):
            self._try_merge(b, other, pool)
        pool.insert(b)

    def _try_merge(self, dst: Block, src, pool: _Pool) -> int:
        """try_merge_blocks: absorb a free neighbour of the same mapping state; returns the bytes absorbed."""
        if src is None or src.allocated or dst.mapped != src.mapped:
            return 0
        if src.mapped:
            pool.erase(src)
        else:
            pool.erase_unmapped(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    # -- giving memory back -----------------------------------------------------------------------------------------
    def _release_available_cached_blocks(self, pool: _Pool, size: int, stream: int) -> bool:
        """release_available_cached_blocks: only with max_split_size_mb: free the smallest oversize cached block
        that covers the request, else oversize blocks from the largest down until enough was freed."""
        if self.max_split == NO_SPLIT_LIMIT:
            return False
        key_size = max(size, self.max_split)
        keys = pool.keys
        i = bisect_left(keys, (stream, key_size, -1))
        if i == len(keys) or keys[i][0] != stream:
            if i == 0:
                return False
            released = 0
            i -= 1
            while i >= 0 and released < key_size:
                b = pool.blocks[keys[i]]
                if b.size < self.max_split or b.stream != stream:
                    break
                released += b.size
                self._release_block(b, pool)
                i -= 1
            return released >= key_size
        self._release_block(pool.blocks[keys[i]], pool)
        return True

    def _release_block(self, b: Block, pool: _Pool) -> None:
        """release_block: cudaFree a whole cached segment."""
        pool.erase(b)
        self._unreserve(b.small, b.size)

    def release_cached_blocks(self) -> None:
        """release_cached_blocks / torch.cuda.empty_cache(): every unsplit cached segment is cudaFree'd
        (release_blocks), expandable segments give back their wholly free pages (unmap_block)."""
        for pool in (self.large, self.small):
            to_unmap = []
            for k in list(pool.keys):
                b = pool.blocks.get(k)
                if b is None:
                    continue
                if b.expandable is not None:
                    to_unmap.append(b)
                elif b.prev is None and b.next is None:
                    self._release_block(b, pool)
            for b in to_unmap:
                self._unmap_block(b, pool)

    empty_cache = release_cached_blocks

    # -- expandable segments ----------------------------------------------------------------------------------------
    def _page(self, pool: _Pool) -> int:
        return EXPANDABLE_PAGE_SMALL if pool.small else EXPANDABLE_PAGE_LARGE

    def _find_expandable_block(self, pool: _Pool, size: int, stream: int) -> Block:
        """find_expandable_block: the lowest unmapped range (with a free block just before it) with room for
        `size`, else a new segment whose address space covers the whole device."""
        def allocatable(x) -> bool:
            return x is not None and not x.allocated

        def has_room(x) -> bool:
            n = 0
            while n < size and allocatable(x):
                n += x.size
                x = x.next
            return n >= size

        i = bisect_left(pool.unmapped, (stream, -1))
        while i < len(pool.unmapped) and pool.unmapped[i][0] == stream:
            c = pool.unmapped_blocks[pool.unmapped[i]]
            if allocatable(c.prev):
                c = c.prev
            if has_room(c):
                return c
            i += 1
        page = self._page(pool)
        # "we allocate enough address space for 1 1/8 the total memory on the GPU"
        space = (self.capacity or (1 << 50)) * 9 // 8
        pages = -(-space // page)
        es = _Expandable(self._new_address(pages * page), page, pages)
        c = Block(pages * page, es.base, pool.small, stream, es)
        c.mapped = False
        pool.insert_unmapped(c)
        return c

    def _map_block(self, pool: _Pool, to_map: Block, size: int) -> bool:
        """map_block: map the pages covering [addr, addr+size) of an unmapped block (its start is page aligned),
        split off the rest unmapped, merge with free mapped neighbours, into the free set."""
        page = to_map.expandable.page
        mapped = -(-size // page) * page
        if not self._fits(mapped):
            return False  # cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY
        pool.erase_unmapped(to_map)
        to_map.mapped = True
        if mapped < to_map.size:
            rest = Block(to_map.size - mapped, to_map.addr + mapped, pool.small, to_map.stream, to_map.expandable)
            rest.mapped = False
            rest.prev, rest.next = to_map, to_map.next
            if to_map.next is not None:
                to_map.next.prev = rest
            to_map.next = rest
            pool.insert_unmapped(rest)
            to_map.size = mapped
        self._try_merge(to_map, to_map.prev, pool)
        self._try_merge(to_map, to_map.next, pool)
        pool.insert(to_map)
        self._reserve(pool.small, mapped)
        self.segments += 1
        return True

    def _try_allocate_expandable_block(self, pool: _Pool, size: int, stream: int):
        """try_allocate_expandable_block: map pages until the candidate (free -> unmapped -> ...) holds `size`."""
        c = self._find_expandable_block(pool, size, stream)
        if not c.mapped and not self._map_block(pool, c, min(c.size, size)):
            return None
        while c.size < size:
            nxt = c.next
            if not self._map_block(pool, nxt, min(size - c.size, nxt.size)):
                return None
            c = nxt   # map_block merged c into nxt
        pool.erase(c)
        return c

    def _unmap_block(self, b: Block, pool: _Pool) -> None:
        """unmap_block: give back the whole pages inside a free block of an expandable segment."""
        es = b.expandable
        page = es.page
        off = b.addr - es.base
        first = -(-off // page)                  # segmentRight(ptr)
        last = (off + b.size) // page            # segmentLeft(ptr + size)
        if first >= last:
            return
        pool.erase(b)
        start, nbytes = es.base + first * page, (last - first) * page
        before = start - b.addr
        if before > 0:
            bf = Block(before, b.addr, b.small, b.stream, es)
            bf.prev, bf.next = b.prev, b
            if b.prev is not None:
                b.prev.next = bf
            b.prev = bf
            pool.insert(bf)
        after = b.size - before - nbytes
        if after > 0:
            af = Block(after, start + nbytes, b.small, b.stream, es)
            af.prev, af.next = b, b.next
            if b.next is not None:
                b.next.prev = af
            b.next = af
            pool.insert(af)
        b.addr, b.size, b.mapped = start, nbytes, False
        self._try_merge(b, b.prev, pool)
        self._try_merge(b, b.next, pool)
        pool.insert_unmapped(b)
        self._unreserve(b.small, nbytes)


# -- replaying an event list ------------------------------------------------------------------------------------------
ALLOC, FREE, MARK = 1, 0, 2


def replay(events, capacity: int | None = None, max_split_size_mb: int | None = None,
           expandable_segments: bool = False, allocator: CachingAllocator | None = None) -> ReplayResult:
    """Replay `events` in order: (ALLOC, key, nbytes) | (FREE, key, 0) | (MARK, label, 0) (a step boundary: the
    peaks restart there, as after torch.cuda.reset_peak_memory_stats, and each window's peaks are reported). `key` names one allocation's life; nbytes is what the caller asks
    for (a storage's nbytes; 0 asks nothing, as CUDAAllocator::allocate returns no block for size 0).
    An OutOfMemory stops the replay: the result's `oom` says where."""
    a = allocator or CachingAllocator(capacity, max_split_size_mb, expandable_segments)
    live: dict = {}
    res = ReplayResult()
    label = None
    malloc, free = a.malloc, a.free
    for i, (kind, key, nbytes) in enumerate(events):
        if kind == ALLOC:
            if nbytes <= 0:
                continue
            try:
                live[key] = malloc(nbytes, 0, i)
            except OutOfMemory as exc:
                res.oom = {"event": i, "requested_bytes": exc.size, "alloc_size_bytes": exc.alloc_size,
                           "allocated_bytes": exc.allocated, "reserved_bytes": exc.reserved,
                           "capacity_bytes": exc.capacity}
                break
        elif kind == FREE:
            b = live.pop(key, None)
            if b is not None:
                free(b)
        else:
            if label is not None:
                res.windows.append([label, a.window_reserved_peak, a.window_allocated_peak])
            label = key
            a.reset_peak()
    if label is not None:
        res.windows.append([label, a.window_reserved_peak, a.window_allocated_peak])
    res.reserved_peak_bytes = a.reserved_peak
    res.allocated_peak_bytes = a.allocated_peak
    res.requested_peak_bytes = a.requested_peak
    res.reserved_end_bytes = a.reserved
    res.allocated_end_bytes = a.allocated
    res.fragmentation_at_peak = dict(a.frag_at_peak)
    res.segments = a.segments
    res.retries = a.retries
    return res


# -- a training run's event list: build, warm-up step, measured step ------------------------------------------------
# cuBLAS's workspace: one per (handle, stream), allocated through the caching allocator at a thread's first cuBLAS call
# and kept (aten/src/ATen/cuda/CublasHandlePool.cpp getCurrentCUDABlasHandle -> getCUDABlasLtWorkspace); a training
# step calls cuBLAS on the Python thread (forward) and on autograd's device thread (backward): two workspaces of
# planner/estimate/training.py CUBLAS_WORKSPACE_BYTES_PER_HANDLE each.
# torch.tensor(x) dispatches aten::lift_fresh on a fresh CPU tensor (torch/csrc/utils/tensor_new.cpp internal_new_from_data)
HOST_SCALAR_OPS = frozenset({"aten::lift_fresh", "aten::lift_fresh_copy"})
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_scaled_mm",
                        "aten::addmv", "aten::mv", "aten::dot"})


def training_events(initial, step, steps: int = 2, cublas_workspace: int = 0, measured_step: int = 2) -> list:
    """The allocator-visible sequence of a measured training run (planner/measure/training.py): the model's
    parameters and buffers and the batch as they are built, then `steps` steps; step 1 creates the optimizer's
    state at its optimizer phase (torch.optim's lazy _init_group); a MARK before step `measured_step` resets the
    peaks, as torch.cuda.reset_peak_memory_stats does before the timed step.

    initial: [(uid, nbytes, category)] the storages alive when the tracked step starts (planner.measure.events
    EventLog.initial, in its order). step: the tracked step's events in dispatch order (autograd's thread included,
    in the order the engine ran its nodes): ("a", uid, nbytes, op, phase) | ("f", uid) | ("p", phase).
    cublas_workspace: bytes of one cuBLAS workspace (0: none), allocated at the first matmul of the forward and of
    the backward of step 1 (each thread's first cuBLAS call) and never freed.

    A storage the step allocates and keeps (none in a set_to_none step) stays allocated into the next step; a step's
    free of an initial storage frees it (it is not re-made)."""
    ev = []
    state = [(uid, n) for uid, n, cat in initial if cat == "optimizer state"]
    for uid, n, cat in initial:
        if cat != "optimizer state":
            ev.append((ALLOC, ("i", uid), n))
    init_uids = {uid for uid, _, _ in initial}
    for k in range(1, steps + 1):
        if k == measured_step:
            ev.append((MARK, f"step {k}", 0))
        phase = None
        need_ws = {"forward": k == 1 and cublas_workspace > 0, "backward": k == 1 and cublas_workspace > 0}
        for e in step:
            kind = e[0]
            if kind == "a":
                ev.append((ALLOC, (k, e[1]), e[2]))
                if need_ws.get(phase) and e[3] in MATMUL_OPS:
                    ev.append((ALLOC, ("cublas", phase), cublas_workspace))
                    need_ws[phase] = False
            elif kind == "f":
                uid = e[1]
                ev.append((FREE, ("i", uid) if uid in init_uids else (k, uid), 0))
            else:
                phase = e[1]
                if phase in ("loss",):
                    phase = "forward"   # the loss runs on the Python thread, as the forward does
                if phase == "optimizer" and k == 1:
                    ev.extend((ALLOC, ("i", uid), n) for uid, n in state)
    return ev


def config_from_env(conf: str | None) -> dict:
    """The options of PYTORCH_CUDA_ALLOC_CONF this model follows (CUDAAllocatorConfig::parseArgs: comma-separated
    key:value pairs): {"expandable_segments": bool, "max_split_size_mb": int | None}; other keys are ignored."""
    out = {"expandable_segments": False, "max_split_size_mb": None}
    for item in (conf or "").split(","):
        key, _, value = item.strip().partition(":")
        if key == "expandable_segments":
            out["expandable_segments"] = value.strip() == "True"
        elif key == "max_split_size_mb" and value.strip().isdigit():
            out["max_split_size_mb"] = int(value)
    return out


def figures(events, capacity: int | None = None, conf: str | None = None) -> dict:
    """The record's keys for a replayed run whose MARK opens the measured step (planner/measure/training.py resets
    the peaks before it): reserved_peak_bytes (what max_memory_reserved would say), fragmentation_bytes (that less
    the replayed max_memory_allocated), and `allocator_replay`: the detail (per-pool cached bytes at the allocated
    peak, segments, the OOM point when `capacity` is given). conf: a PYTORCH_CUDA_ALLOC_CONF string."""
    res = replay(events, capacity=capacity, **config_from_env(conf))
    out = {"allocator_replay": {**res.as_dict(), "events": len(events), "alloc_conf": conf or ""}}
    if res.oom is None and res.windows:
        _, reserved, allocated = res.windows[-1]
        out["reserved_peak_bytes"] = reserved
        out["fragmentation_bytes"] = reserved - allocated
    return out


def run_figures(initial, step, cublas_workspace: int, capacity: int | None = None, conf: str | None = None) -> dict:
    """figures() for a run made up from one tracked step (training_events: build, step 1, step 2)."""
    return figures(training_events(initial, step, steps=2, cublas_workspace=cublas_workspace), capacity, conf)


def events_from_run(run, cublas_workspace: int = 0, measured_step: str = "step 2", host_scalars: bool = True) -> list:
    """The allocator's events from a whole simulated run (planner.measure.alloc_run.simulate_run: the build, then
    each step after its ("m", "step K") mark): ("a", uid, nbytes, op, phase, ndim) | ("f", uid) | ("p", phase) |
    ("m", label). A MARK (the peaks' reset) before `measured_step`; the cuBLAS workspaces after the first matmul of
    the first forward and of the first backward (each thread's first cuBLAS call).
    host_scalars: 0-dim tensors the optimizer phase makes are the host's (torch/optim/adamw.py _init_group keeps
    `step` on the CPU unless capturable or fused, and _multi_tensor_adamw adds a CPU tensor(1.0) to it), not the
    allocator's; so is a step's `torch.tensor(x)` (aten::lift_fresh, no device given: the CPU; e.g. the book's GELU
    `torch.tensor(2.0 / torch.pi)`). In the build, under `with torch.device(device)`, it is the device's."""
    ev = []
    phase = "setup"
    in_step = False
    need_ws = {"forward": cublas_workspace > 0, "backward": cublas_workspace > 0}
    for e in run:
        kind = e[0]
        if kind == "a":
            if host_scalars and e[5] == 0 and (phase == "optimizer" or (in_step and e[3] in HOST_SCALAR_OPS)):
                continue
            ev.append((ALLOC, e[1], e[2]))
            if need_ws.get(phase) and e[3] in MATMUL_OPS:
                ev.append((ALLOC, ("cublas", phase), cublas_workspace))
                need_ws[phase] = False
        elif kind == "f":
            ev.append((FREE, e[1], 0))
        elif kind == "p":
            phase = "forward" if e[1] == "loss" else e[1]
        elif kind == "m":
            phase = "setup"
            in_step = True
            if e[1] == measured_step:
                ev.append((MARK, e[1], 0))
    return ev
