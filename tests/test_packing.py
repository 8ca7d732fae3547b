import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import BITS, HEAD_DIMS
from turboquant.quant.packing import byte_sources, pack_codes, pack_sources, packed_size, unpack_codes


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_pack_unpack_identity(bits, d):
    g = torch.Generator().manual_seed(bits * 1000 + d)
    codes = torch.randint(0, 1 << bits, (3, 5, 7, d), generator=g, dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.shape == (3, 5, 7, d * bits // 8) == (3, 5, 7, packed_size(d, bits))
    assert torch.equal(unpack_codes(packed, bits, d), codes)


@given(bits=st.sampled_from(BITS), rows=st.integers(1, 9), blocks=st.integers(1, 6), data=st.data())
def test_pack_unpack_identity_property(bits, rows, blocks, data):
    d = 8 * blocks
    seed = data.draw(st.integers(0, 2**31 - 1))
    codes = torch.randint(0, 1 << bits, (rows, d), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    assert torch.equal(unpack_codes(pack_codes(codes, bits), bits, d), codes)


def test_documented_layouts():
    assert pack_codes(torch.tensor([1, 2]), 4).tolist() == [0x21]
    assert pack_codes(torch.tensor([1, 2, 3, 0]), 2).tolist() == [0b00111001]
    word = sum(c << (3 * i) for i, c in enumerate(range(8)))  # codes 0..7
    assert pack_codes(torch.arange(8), 3).tolist() == [word & 0xFF, (word >> 8) & 0xFF, word >> 16]
    # two words: byte-planar, byte k of word j at k·2 + j
    w2 = sum(c << (3 * i) for i, c in enumerate([7, 6, 5, 4, 3, 2, 1, 0]))
    assert pack_codes(torch.cat([torch.arange(8), 7 - torch.arange(8)]), 3).tolist() == [
        word & 0xFF, w2 & 0xFF, (word >> 8) & 0xFF, (w2 >> 8) & 0xFF, word >> 16, w2 >> 16]
    assert pack_codes(torch.tensor([255, 7]), 8).tolist() == [255, 7]


def test_bad_lengths_raise():
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_codes(torch.zeros(12, dtype=torch.uint8), 3)
    with pytest.raises(ValueError, match="take 12"):
        unpack_codes(torch.zeros(5, dtype=torch.uint8), 3, 32)


@given(bits=st.sampled_from(BITS), lead=st.lists(st.integers(1, 4), min_size=0, max_size=2),
       blocks=st.integers(1, 20), seed=st.integers(0, 2**31 - 1))
def test_byte_sources_pack_like_pack_codes(bits, lead, blocks, seed):
    """The fused-kernel form of packing (slots in the packed row's iteration space) is the layout."""
    d = 8 * blocks
    codes = torch.randint(0, 1 << bits, (*lead, d), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    slots = byte_sources(codes.to(torch.int32), bits)
    planes = 3 if bits == 3 else 1
    assert all(s.shape == (*lead, planes, d * bits // 8 // planes) for s in slots)
    # every element is some slot's: a range reduction over the slots sees the whole row
    seen = torch.zeros(d, dtype=torch.bool)
    index = byte_sources(torch.arange(d), bits)
    for s in index:
        seen[s.flatten()] = True
    assert seen.all()
    assert torch.equal(pack_sources(slots, bits), pack_codes(codes, bits))


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("bits", BITS)
def test_compiled_packing_traces_without_warnings(bits):
    """Dynamo traces the fused packing of a compiled cache write: no lru_cache-wrapped call inside it (Dynamo
    warns of a possible silent incorrectness on every compile), and the same bytes as eager."""
    codes = torch.randint(0, 1 << bits, (2, 3, 32), generator=torch.Generator().manual_seed(bits), dtype=torch.int32)

    def pack(c):
        return pack_sources(byte_sources(c, bits), bits)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        packed = torch.compile(pack, backend="eager", fullgraph=True)(codes)
    assert [str(w.message) for w in caught if "lru_cache" in str(w.message)] == []
    assert torch.equal(packed, pack_codes(codes.to(torch.uint8), bits))
