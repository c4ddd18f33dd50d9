import pytest
import torch

from backend.core.kv_cache import KVCache, kv_bytes_per_block, num_blocks_for_budget


def test_shapes_and_views_share_storage():
    c = KVCache(num_layers=3, num_blocks=5, block_size=4, num_kv_heads=2, head_dim=8)
    assert len(c.k) == len(c.v) == 3
    assert c.k[1].shape == (5, 4, 2, 8) and c.k[1].is_contiguous()
    c.k[2][3, 1, 0, 0] = 7.0
    assert c.data[0, 2, 3, 1, 0, 0] == 7.0 and c.v[2].abs().sum() == 0
    assert c.nbytes == 2 * 3 * 5 * 4 * 2 * 8 * 4 and c.num_slots == 20


def test_budget_sizing():
    per = kv_bytes_per_block(num_layers=2, block_size=16, num_kv_heads=4, head_dim=64, dtype=torch.float16)
    assert per == 2 * 2 * 16 * 4 * 64 * 2
    assert num_blocks_for_budget(per * 10 + per - 1, 2, 16, 4, 64, torch.float16) == 10
    c = KVCache.from_budget(per * 3, 2, 16, 4, 64, dtype=torch.float16)
    assert c.num_blocks == 3 and c.nbytes == per * 3
    with pytest.raises(ValueError, match="holds no block"):
        num_blocks_for_budget(per - 1, 2, 16, 4, 64, torch.float16)


def test_copy_blocks_every_layer():
    c = KVCache(num_layers=2, num_blocks=4, block_size=2, num_kv_heads=1, head_dim=3)
    c.data.copy_(torch.randn_like(c.data))
    before = c.data.clone()
    c.copy_blocks([(1, 3), (3, 0)])  # sources read before writes: block 0 gets the OLD block 3
    for layer in range(2):
        assert torch.equal(c.k[layer][3], before[0, layer, 1]) and torch.equal(c.v[layer][3], before[1, layer, 1])
        assert torch.equal(c.k[layer][0], before[0, layer, 3]) and torch.equal(c.v[layer][0], before[1, layer, 3])
        assert torch.equal(c.k[layer][1], before[0, layer, 1]) and torch.equal(c.k[layer][2], before[0, layer, 2])
    c.copy_blocks([])
    with pytest.raises(IndexError):
        c.copy_blocks([(0, 4)])
