import pytest
import torch

from backend.attention.metadata import AttentionMetadata, build_attention_metadata


def test_mixed_step_tensors():
    # seq 0: decode at position 5 (block size 4: block table [7, 2] -> position 5 in block 2, offset 1)
    # seq 1: prefill chunk of 3 tokens from position 2 over a 2-token cached prefix
    md = build_attention_metadata([5, 2], [1, 3], [[7, 2], [4, 9]], block_size=4)
    assert md.slot_mapping.tolist() == [2 * 4 + 1, 4 * 4 + 2, 4 * 4 + 3, 9 * 4 + 0]
    assert md.slot_mapping.dtype == torch.int64
    assert md.query_start_loc.tolist() == [0, 1, 4] and md.query_start_loc.dtype == torch.int32
    assert md.seq_lens.tolist() == [6, 5] and md.seq_lens.dtype == torch.int32
    assert md.block_tables.tolist() == [[7, 2], [4, 9]] and md.block_tables.dtype == torch.int32
    assert md.positions.tolist() == [5, 2, 3, 4]
    assert (md.max_query_len, md.max_seq_len, md.num_seqs, md.num_tokens) == (3, 6, 2, 4)
    assert not md.is_pure_decode


def test_block_tables_are_padded_with_zero():
    md = build_attention_metadata([0, 0], [3, 9], [[5], [6, 7, 8]], block_size=4, pad_blocks_to=5)
    assert md.block_tables.tolist() == [[5, 0, 0, 0, 0], [6, 7, 8, 0, 0]]
    assert md.slot_mapping.tolist() == [20, 21, 22] + [24, 25, 26, 27, 28, 29, 30, 31, 32]


def test_pure_decode():
    md = build_attention_metadata([3, 16, 40], [1, 1, 1], [[1], [2, 3], [4, 5, 6]], block_size=16)
    assert md.is_pure_decode
    assert md.positions.tolist() == [3, 16, 40]
    assert md.slot_mapping.tolist() == [19, 48, 6 * 16 + 8]


@pytest.mark.parametrize("computed,new,tables,msg", [
    ([4], [1], [[0]], "cannot hold"),         # position 4 needs a second block of size 4
    ([0], [0], [[0]], "new token"),
    ([0, 1], [1], [[0]], "differ in length"),
])
def test_invalid_inputs(computed, new, tables, msg):
    with pytest.raises(ValueError, match=msg):
        build_attention_metadata(computed, new, tables, block_size=4)


def test_to_device_keeps_fields():
    md = build_attention_metadata([1], [2], [[3]], block_size=4)
    md2 = md.to("cpu")
    assert isinstance(md2, AttentionMetadata)
    assert md2.positions.tolist() == [1, 2] and md2.block_size == 4
