"""Paged KV block accounting: a pool of fixed-size blocks, ref counts, prefix cache, copy-on-write.

Follows vLLM v1's ``BlockPool`` / ``KVCacheManager``:

- A block holds the K/V of ``block_size`` consecutive positions of one or more sequences
  (shared by ref count). ``seq.block_table[i]`` is the physical id of the block holding
  positions ``[i * block_size, (i + 1) * block_size)``.
- Free blocks (``ref_count == 0``) sit in ONE queue in eviction order. A freed block whose
  content is a cached full block keeps its hash and goes to the tail (most recently used),
  so it can still be hit; a freed block without a hash goes to the head (worthless, reused
  first). Allocation pops the head; popping a cached block evicts it (its hash is removed).
  A sequence's blocks are freed in reverse order, so its tail blocks are evicted first.
- Prefix caching: block ``i`` of a sequence is named by a chained hash
  ``sha256(parent_hash, token_ids of block i, extra_key)``, where ``extra_key`` digests the
  model + tokenizer identity and the KV storage format given at construction (a changed checkpoint,
  chat template or ``kv_cache_dtype`` never hits stale K/V), and for a request under a LoRA adapter the
  adapter's name too (``adapter_key``: the same prompt under two adapters never shares a block). Only full
  blocks whose K/V are computed get a hash.
- Sliding windows: when every layer attends within a window, blocks wholly before the window of
  the next position a sequence computes are never read again. ``free_outside_window`` releases
  them (cached ones stay hittable in the free queue) and leaves ``NULL_BLOCK`` in the table, so
  table index ``i`` still means positions ``[i * block_size, (i + 1) * block_size)``.
- Copy-on-write: a block is written only while it is private and uncached. Before a
  sequence writes a position in a block with ``ref_count > 1`` (shared after ``fork``) or
  with a hash (cached content is immutable: others may hit it in the same step), it gets a
  fresh block and ``(src, dst)`` is recorded; the runner copies those blocks before the
  step's forward.

Not thread-safe: the engine loop thread owns it.
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple
from typing import Sequence as Seq

from backend.core.sequence import Sequence

BlockHash = bytes   # sha256 digest (32 bytes)
NULL_BLOCK = -1     # block-table entry of a block freed because it fell out of every layer's window
_HASH_VERSION = b"kv-block-hash-v1"


def make_extra_key(cache_key: str, kv_cache_dtype: str = "auto") -> bytes:
    """Digest of the model + tokenizer identity and the KV storage format; part of every block hash."""
    kv = b"\0kv=" + kv_cache_dtype.encode("utf-8")
    return hashlib.sha256(_HASH_VERSION + b"\0" + cache_key.encode("utf-8") + kv).digest()


def adapter_key(extra_key: bytes, lora_name: str | None) -> bytes:
    """The block-hash key of a sequence: the engine's ``extra_key``, plus its adapter's name when it has one."""
    if lora_name is None:
        return extra_key
    return hashlib.sha256(extra_key + b"\0lora=" + lora_name.encode("utf-8")).digest()


def hash_block_tokens(parent: BlockHash | None, token_ids: Seq[int], extra_key: bytes) -> BlockHash:
    """Chained hash of one full block. ``parent`` is the previous block's hash (None for block 0)."""
    h = hashlib.sha256()
    h.update(len(extra_key).to_bytes(4, "little"))
    h.update(extra_key)
    h.update(parent if parent is not None else b"\0" * 32)
    h.update(array("q", token_ids).tobytes())     # int64 per token
    return h.digest()


@dataclass(eq=False)
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None    # set iff this block is the prefix cache's entry for that hash


class ComputedBlocks(NamedTuple):
    """A prefix-cache hit: the leading full blocks whose K/V are already in the pool."""

    blocks: list[KVBlock]
    num_cached_tokens: int     # len(blocks) * block_size


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True,
                 cache_key: str = "", kv_cache_dtype: str = "auto"):
        if num_blocks < 1:
            raise ValueError(f"num_kv_blocks: must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size: must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.extra_key = make_extra_key(cache_key, kv_cache_dtype)
        self._adapter_keys: dict[str, bytes] = {}          # lora_name -> its block-hash key (adapter_key)
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # free blocks in eviction order (head = next to allocate / evict)
        self._free: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._cached: dict[BlockHash, KVBlock] = {}
        self._seq_hashes: dict[int, list[BlockHash]] = {}   # seq_id -> hashes of its full blocks (memo)
        self._num_committed: dict[int, int] = {}           # seq_id -> leading blocks already offered to the cache
        self._blocks_to_copy: list[tuple[int, int]] = []
        self.prefix_cache_queries = 0    # known tokens of sequences admitted with a lookup, cumulative
        self.prefix_cache_hits = 0       # of which were served from the cache
        self.num_reused_blocks = 0       # blocks served from the cache, cumulative

    # ---- counters ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_count 0, including evictable cached ones."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def free_block_ids(self) -> list[int]:
        """Free blocks in eviction order (head first)."""
        return list(self._free)

    # ---- prefix cache -----------------------------------------------------------------------
    def block_hashes(self, seq: Sequence) -> list[BlockHash]:
        """Chained hashes of the sequence's full blocks of known tokens (prompt + output)."""
        hashes = self._seq_hashes.setdefault(seq.seq_id, [])
        bs, n_full = self.block_size, seq.num_tokens // self.block_size
        if len(hashes) < n_full:
            tokens = seq.all_token_ids
            parent = hashes[-1] if hashes else None
            name = seq.params.lora_name
            key = self.extra_key if name is None else self._adapter_keys.setdefault(
                name, adapter_key(self.extra_key, name))
            for i in range(len(hashes), n_full):
                parent = hash_block_tokens(parent, tokens[i * bs:(i + 1) * bs], key)
                hashes.append(parent)
        return hashes

    def get_computed_blocks(self, seq: Sequence) -> ComputedBlocks:
        """Longest cached prefix of a sequence that holds no blocks. Changes nothing.

        Never covers every known token: the last one is always left to compute so the
        step yields logits for it.
        """
        if seq.block_table:
            raise ValueError(f"get_computed_blocks: sequence {seq.seq_id} already holds blocks")
        if not self.enable_prefix_caching:
            return ComputedBlocks([], 0)
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for h in self.block_hashes(seq)[:max_blocks]:
            block = self._cached.get(h)
            if block is None:
                break
            hits.append(block)
        return ComputedBlocks(hits, len(hits) * self.block_size)

    def commit_full_blocks(self, seq: Sequence) -> int:
        """Offer to the cache the blocks that became full of computed, known tokens. Returns how many were added."""
        if not self.enable_prefix_caching:
            return 0
        n_full = min(seq.num_computed_tokens, seq.num_tokens) // self.block_size
        n_full = min(n_full, len(seq.block_table))
        done = self._num_committed.get(seq.seq_id, 0)
        if n_full <= done:
            return 0
        hashes, added = self.block_hashes(seq), 0
        for i in range(done, n_full):
            if seq.block_table[i] == NULL_BLOCK:
                continue
            block, h = self.blocks[seq.block_table[i]], hashes[i]
            if block.block_hash is None and h not in self._cached:   # a duplicate stays uncached
                block.block_hash = h
                self._cached[h] = block
                added += 1
        self._num_committed[seq.seq_id] = n_full
        return added

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block. Only when no block is in use (returns False otherwise)."""
        if self.num_used_blocks:
            return False
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()
        self._seq_hashes.clear()
        self._num_committed.clear()
        return True

    # ---- allocation -------------------------------------------------------------------------
    def allocate_slots(self, seq: Sequence, num_new_tokens: int, computed: ComputedBlocks | None = None,
                       reserve: int = 0) -> list[int] | None:
        """Make ``seq.block_table`` cover the positions it computes next.

        Positions ``[start, start + num_new_tokens)`` where ``start`` is ``computed.num_cached_tokens``
        for an admission (``computed`` from ``get_computed_blocks``; the hit blocks are taken) or
        ``seq.num_computed_tokens`` otherwise. Shared blocks written by these positions are
        copied on write. At least ``reserve`` free blocks must remain afterwards (the admission
        watermark). Returns the ids of the newly allocated blocks, or None (nothing changed)
        when the pool is short.
        """
        if num_new_tokens < 1:
            raise ValueError(f"allocate_slots: num_new_tokens must be >= 1, got {num_new_tokens}")
        table, bs = seq.block_table, self.block_size
        if computed is not None:
            if table:
                raise ValueError(f"allocate_slots: sequence {seq.seq_id} already holds blocks")
            start, hits = computed.num_cached_tokens, computed.blocks
        else:
            start, hits = seq.num_computed_tokens, []
        end = start + num_new_tokens
        num_new_blocks = max(0, _cdiv(end, bs) - len(table) - len(hits))
        cow = [i for i in range(start // bs, min(len(table), _cdiv(end, bs)))
               if self.blocks[table[i]].ref_count > 1 or self.blocks[table[i]].block_hash is not None]
        num_hits_free = sum(1 for b in hits if b.ref_count == 0)    # taking them shrinks the free queue
        if len(self._free) - (num_new_blocks + len(cow) + num_hits_free) < reserve:
            return None

        for block in hits:
            if block.ref_count == 0:
                del self._free[block.block_id]
            block.ref_count += 1
            table.append(block.block_id)
        new_ids: list[int] = []
        for i in cow:
            src, dst = self.blocks[table[i]], self._pop_free()
            table[i] = dst.block_id
            self._release(src)                   # a cached src with no other holder becomes evictable
            self._blocks_to_copy.append((src.block_id, dst.block_id))
            new_ids.append(dst.block_id)
        for _ in range(num_new_blocks):
            block = self._pop_free()
            table.append(block.block_id)
            new_ids.append(block.block_id)
        if computed is not None:
            self._num_committed[seq.seq_id] = len(hits)
            if self.enable_prefix_caching:
                self.prefix_cache_queries += seq.num_tokens
                self.prefix_cache_hits += computed.num_cached_tokens
                self.num_reused_blocks += len(hits)
        return new_ids

    def take_blocks_to_copy(self) -> list[tuple[int, int]]:
        """Copy-on-write pairs (src_block, dst_block) recorded since the last call."""
        pairs, self._blocks_to_copy = self._blocks_to_copy, []
        return pairs

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Make ``child`` (holding no blocks, whose tokens are a prefix of the parent's) share the parent's blocks."""
        if child.block_table:
            raise ValueError(f"fork: child sequence {child.seq_id} already holds blocks")
        for bid in parent.block_table:
            if bid != NULL_BLOCK:
                self.blocks[bid].ref_count += 1
        child.block_table = list(parent.block_table)
        n_full = child.num_tokens // self.block_size
        if parent.seq_id in self._seq_hashes:
            self._seq_hashes[child.seq_id] = self._seq_hashes[parent.seq_id][:n_full]
        self._num_committed[child.seq_id] = min(self._num_committed.get(parent.seq_id, 0), n_full)

    def free(self, seq: Sequence) -> None:
        """Release every block of the sequence (tail first, so tails are evicted first). Idempotent."""
        for bid in reversed(seq.block_table):
            if bid != NULL_BLOCK:
                self._release(self.blocks[bid])
        seq.block_table = []
        self._seq_hashes.pop(seq.seq_id, None)
        self._num_committed.pop(seq.seq_id, None)

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Drop the K/V of positions ``>= num_tokens`` (speculative rollback); the caller lowers
        ``num_computed_tokens``. Blocks wholly beyond are freed; a kept cached block is copied
        on its next write, so the cache stays valid."""
        if num_tokens < 0:
            raise ValueError(f"truncate: num_tokens must be >= 0, got {num_tokens}")
        keep = _cdiv(num_tokens, self.block_size)
        table = seq.block_table
        for bid in reversed(table[keep:]):
            if bid != NULL_BLOCK:
                self._release(self.blocks[bid])
        del table[keep:]
        n_full = num_tokens // self.block_size
        if seq.seq_id in self._seq_hashes:
            del self._seq_hashes[seq.seq_id][n_full:]
        if seq.seq_id in self._num_committed:
            self._num_committed[seq.seq_id] = min(self._num_committed[seq.seq_id], n_full)

    def free_outside_window(self, seq: Sequence, window: int) -> int:
        """Free the blocks no query of ``seq`` can read again when every layer sees only the last
        ``window`` keys: those wholly before position ``num_computed_tokens - window + 1`` (the first
        key the next position to compute sees; later queries, drafts and re-verified positions all
        sit at or after ``num_computed_tokens``). Their table entries become ``NULL_BLOCK``. Call
        after ``commit_full_blocks`` so that full blocks stay hittable. Returns how many were freed.
        """
        table = seq.block_table
        n = min(max(0, seq.num_computed_tokens - window + 1) // self.block_size, len(table))
        freed = 0
        for i in range(n - 1, -1, -1):       # newest first, as ``free``: older blocks are evicted last
            if table[i] == NULL_BLOCK:
                break                        # everything before was freed by an earlier call
            self._release(self.blocks[table[i]])
            table[i] = NULL_BLOCK
            freed += 1
        return freed

    # ---- internals --------------------------------------------------------------------------
    def _pop_free(self) -> KVBlock:
        _, block = self._free.popitem(last=False)
        if block.block_hash is not None:       # evict: the cached content is about to be overwritten
            self._uncache(block)
        block.ref_count = 1
        return block

    def _uncache(self, block: KVBlock) -> None:
        if self._cached.get(block.block_hash) is block:
            del self._cached[block.block_hash]
        block.block_hash = None

    def _release(self, block: KVBlock) -> None:
        if block.ref_count <= 0:
            raise RuntimeError(f"double free of KV block {block.block_id}")
        block.ref_count -= 1
        if block.ref_count == 0:
            self._free[block.block_id] = block
            if block.block_hash is None:
                self._free.move_to_end(block.block_id, last=False)
