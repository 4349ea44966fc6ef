"""planner/allocator.py: each rule of c10/cuda/CUDACachingAllocator.cpp it models, on a hand-made sequence whose
answer follows from the rule (the arithmetic is in each test's comment)."""
from planner.allocator import (ALLOC, FREE, MARK, K_LARGE_BUFFER, K_SMALL_BUFFER, CachingAllocator, OutOfMemory,
                               get_allocation_size, replay, round_size, training_events)

MiB = 2**20


def test_round_size():
    # kMinBlockSize: below 512 -> 512; else up to a multiple of 512
    assert [round_size(n) for n in (1, 511, 512, 513, 1025)] == [512, 512, 512, 1024, 1536]


def test_get_allocation_size():
    # <= 1 MiB: a 2 MiB small segment; < 10 MiB: a 20 MiB segment; else rounded up to 2 MiB
    assert get_allocation_size(MiB) == K_SMALL_BUFFER
    assert get_allocation_size(MiB + 512) == K_LARGE_BUFFER
    assert get_allocation_size(10 * MiB - 512) == K_LARGE_BUFFER
    assert get_allocation_size(10 * MiB) == 10 * MiB
    assert get_allocation_size(10 * MiB + 1) == 12 * MiB


def test_small_requests_pack_into_one_small_segment():
    a = CachingAllocator()
    blocks = [a.malloc(1000) for _ in range(4)]           # 4 x 1024 B split off one 2 MiB segment
    assert a.reserved == 2 * MiB and a.allocated == 4 * 1024 and a.segments == 1
    a.malloc(2 * MiB - 4 * 1024)                          # a 1 MiB+ request goes to the large pool: a 20 MiB segment
    assert a.reserved == 22 * MiB
    for b in blocks:
        a.free(b)
    assert a.small.keys == [(0, 2 * MiB, a.small.keys[0][2])]   # merged back into one free 2 MiB block


def test_large_pool_split_threshold():
    a = CachingAllocator()
    b = a.malloc(3 * MiB)                  # a 20 MiB segment, 17 MiB remain (> 1 MiB: split)
    assert b.size == 3 * MiB
    c = a.malloc(16 * MiB + 512 * 1024)    # best fit: the 17 MiB block; 0.5 MiB would remain (<= kSmallSize): no split
    assert c.size == 17 * MiB and a.allocated == 20 * MiB and a.reserved == 20 * MiB


def test_best_fit_picks_the_smallest_block():
    a = CachingAllocator()
    big, small = a.malloc(40 * MiB), a.malloc(24 * MiB)
    small_addr = small.addr
    a.free(big)
    a.free(small)
    c = a.malloc(22 * MiB)                 # both free blocks fit; the 24 MiB one is taken (split: 2 MiB remain > 1 MiB)
    assert c.addr == small_addr and c.size == 22 * MiB and a.reserved == 64 * MiB


def test_cache_reused_no_new_segment():
    ev = []
    for step in range(3):
        ev += [(ALLOC, (step, 0), 30 * MiB), (ALLOC, (step, 1), 5 * MiB), (FREE, (step, 0), 0), (FREE, (step, 1), 0)]
    r = replay(ev)
    assert r.reserved_peak_bytes == 50 * MiB and r.segments == 2   # 30 MiB + one 20 MiB segment, reused each step


def test_oom_frees_cache_and_retries():
    # 100 MiB of device: a cached 60 MiB segment is released (empty_cache) so a 70 MiB request fits
    ev = [(ALLOC, "a", 60 * MiB), (FREE, "a", 0), (ALLOC, "b", 70 * MiB)]
    r = replay(ev, capacity=100 * MiB)
    assert r.oom is None and r.retries == 1 and r.reserved_end_bytes == 70 * MiB
    # a split segment cannot be released: 60 MiB split into 40 (held) + 20 free; 70 more does not fit in 100
    ev = [(ALLOC, "a", 40 * MiB), (ALLOC, "x", 20 * MiB), (FREE, "x", 0), (ALLOC, "b", 50 * MiB)]
    r = replay(ev, capacity=100 * MiB)
    assert r.oom is None   # 40 + 20 segments; the 20 MiB one is unsplit: released, 40 + 50 = 90 fits
    ev = [(ALLOC, "a", 60 * MiB), (FREE, "a", 0), (ALLOC, "c", 30 * MiB), (ALLOC, "b", 50 * MiB)]
    r = replay(ev, capacity=100 * MiB)
    # c splits the cached 60 MiB segment (30 held, 30 free, split): not releasable; 60 + 50 > 100: out of memory
    assert r.oom is not None and r.oom["event"] == 3 and r.oom["reserved_bytes"] == 60 * MiB


def test_max_split_size():
    a = CachingAllocator(max_split_size_mb=50)
    big = a.malloc(100 * MiB)
    a.free(big)
    b = a.malloc(60 * MiB)                 # >= max_split: may take an oversize block only within kLargeBuffer: 100 >= 80
    assert a.reserved == 160 * MiB and b.size == 60 * MiB
    a.free(b)
    c = a.malloc(90 * MiB)                 # 100 < 90 + 20: reuses the 100 MiB block whole (oversize blocks never split)
    assert c.size == 100 * MiB and a.reserved == 160 * MiB
    d = a.malloc(5 * MiB)                  # < max_split: an oversize (60 MiB) cached block is not handed out
    assert a.reserved == 180 * MiB and d.size == 5 * MiB


def test_expandable_segments_map_pages():
    # one segment grows by 20 MiB pages (large pool); three 30 MiB requests: 90 MiB -> 100 MiB mapped
    ev = [(ALLOC, i, 30 * MiB) for i in range(3)]
    r = replay(ev, expandable_segments=True)
    assert r.reserved_peak_bytes == 100 * MiB
    assert replay(ev).reserved_peak_bytes == 90 * MiB       # cudaMalloc'd: 30 MiB segments each
    # the pattern expandable segments were made for: a freed block too small for a bigger request is grown into
    ev = [(ALLOC, "a", 30 * MiB), (ALLOC, "b", 10 * MiB), (FREE, "b", 0), (ALLOC, "c", 12 * MiB)]
    assert replay(ev).reserved_peak_bytes == 52 * MiB        # 30 + 10 + a new 12 MiB segment
    assert replay(ev, expandable_segments=True).reserved_peak_bytes == 60 * MiB   # 42 MiB -> three 20 MiB pages


def test_expandable_segments_oom_unmaps_free_pages():
    ev = [(ALLOC, "a", 60 * MiB), (ALLOC, "b", 40 * MiB), (FREE, "b", 0), (ALLOC, "c", 100 * MiB)]
    # 100 MiB mapped; c needs 100 MiB more than the free 40 at the end: mapping 60 MiB more exceeds 140 MiB; the retry
    # unmaps the free pages (40 MiB) and maps from there: 60 + 100 = 160 > 140 still: out of memory
    assert replay(ev, capacity=140 * MiB, expandable_segments=True).oom is not None
    r = replay(ev, capacity=160 * MiB, expandable_segments=True)
    assert r.oom is None and r.reserved_end_bytes == 160 * MiB


def test_windows_reset_peaks():
    ev = [(ALLOC, "a", 30 * MiB), (FREE, "a", 0), (MARK, "step 2", 0), (ALLOC, "b", 10 * MiB)]
    r = replay(ev)
    # the window keeps the cache (30 MiB segment reused by b, split: 20 MiB remain > 1 MiB) and its reserved peak
    assert r.windows == [["step 2", 30 * MiB, 10 * MiB]]


def test_training_events_layout():
    initial = [(0, 4096, "parameter"), (1, 4096, "optimizer state"), (2, 64, "input")]
    step = [("p", "forward"), ("a", 10, 2 * MiB, "aten::mm", "forward"), ("p", "backward"),
            ("a", 11, 2 * MiB, "aten::mm", "backward"), ("f", 10), ("f", 11), ("p", "optimizer"), ("p", "zero_grad")]
    ev = training_events(initial, step, steps=2, cublas_workspace=32 * MiB)
    kinds = [(k, key) for k, key, _ in ev]
    # build (no optimizer state yet), step 1 with the two workspaces after each thread's first matmul and the
    # optimizer's state at its phase, then the mark and step 2
    assert kinds[:2] == [(ALLOC, ("i", 0)), (ALLOC, ("i", 2))]
    assert (ALLOC, ("cublas", "forward")) in kinds and (ALLOC, ("cublas", "backward")) in kinds
    assert kinds.index((ALLOC, ("i", 1))) < kinds.index((MARK, "step 2"))
    assert kinds.count((ALLOC, ("cublas", "forward"))) == 1
