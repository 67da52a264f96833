"""Arrow IPC streams as buffer lists: the codec's very bytes, large columns uncopied, layouts reused."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.codec import CodecError, LayoutEncoder, decode, encode, encode_parts
from tdreplay.codec.parts import SMALL_PART
from tdreplay.codec.to_arrow import _flat_leaves


def batch(n: int, seed: int = 0, frame: int = 0) -> TensorDict:
    """Every kind of column: bools of odd widths, bfloat16, nested keys, zero-size, scalars."""
    g = torch.Generator().manual_seed(seed)
    td = TensorDict(
        {
            "obs": torch.randn(n, 3, generator=g),
            "action": torch.randint(0, 9, (n,), generator=g),
            "flags": torch.rand(n, 5, generator=g) < 0.5,
            "half": torch.randn(n, 2, generator=g).to(torch.bfloat16),
            "empty": torch.zeros(n, 0, 4),
            "next": {
                "done": torch.rand(n, 1, generator=g) < 0.5,
                "reward": torch.randn(n, generator=g).to(torch.float16),
            },
        },
        batch_size=[n],
    )
    if frame:
        td["frame"] = torch.randint(0, 256, (n, frame), dtype=torch.uint8, generator=g)
    return td


def joined(parts: list[memoryview]) -> bytes:
    return b"".join(parts)


@pytest.mark.parametrize("frame", [0, 40_000], ids=["small", "large"])
@pytest.mark.parametrize("n", [1, 7, 64])
def test_the_parts_are_the_codecs_bytes(n: int, frame: int) -> None:
    td = batch(n, frame=frame)
    assert joined(encode_parts(td)) == encode(td).to_pybytes()
    encoder = LayoutEncoder()
    for seed in range(4):  # seen once, learnt, then filled from the layout
        td = batch(n, seed, frame)
        assert joined(encoder.encode_parts(td)) == encode(td).to_pybytes()
    assert encoder.hits == 2


def test_large_columns_are_views_of_their_tensors() -> None:
    td = batch(64, frame=40_000)
    frame = td["frame"]
    encoder = LayoutEncoder()
    for parts in [encode_parts(td)] + [encoder.encode_parts(td) for _ in range(3)]:
        big = [p for p in parts if len(p) >= SMALL_PART]
        assert len(big) == 1 and len(big[0]) == frame.numel()
        assert torch.frombuffer(big[0], dtype=torch.uint8).data_ptr() == frame.data_ptr()
    assert encoder.hits == 1
    small = batch(8)  # a small stream is one buffer
    assert len(encode_parts(small)) == 1 and len(encoder.encode_parts(small)) == 1


def test_strided_and_grad_leaves_are_encoded_as_their_values() -> None:
    encoder = LayoutEncoder()
    for seed in range(3):
        base = torch.randn(6, 4, generator=torch.Generator().manual_seed(seed))
        td = {
            "t": base.t(),
            "g": torch.randn(4, 2).requires_grad_(),
            "s": base[::2, 0].repeat(2)[:4],
        }
        parts = encoder.encode_parts(td)
        assert joined(parts) == encode(td).to_pybytes()
        back = decode(joined(parts))
        assert torch.equal(back["t"], base.t()) and torch.equal(back["g"], td["g"].detach())
    assert encoder.hits == 1


def test_row_counts_and_layouts_are_told_apart() -> None:
    encoder = LayoutEncoder(max_layouts=2)
    for _ in range(3):
        for n in (3, 5, 9):  # three layouts, room for two: the encoder keeps working
            td = batch(n)
            assert joined(encoder.encode_parts(td)) == encode(td).to_pybytes()
    assert len(encoder._layouts) <= 2
    with pytest.raises(CodecError, match="has 3 rows, others have 2"):
        encoder.encode_parts({"a": torch.zeros(2), "b": torch.zeros(3)})
    with pytest.raises(CodecError, match="not a tensor"):
        encoder.encode_parts({"a": torch.zeros(2), "b": [1, 2]})  # type: ignore[dict-item]
    with pytest.raises(CodecError, match="0-d tensor"):
        encoder.encode_parts({"s": torch.tensor(1.0)})
    with pytest.raises(CodecError, match="nothing to encode"):
        encoder.encode_parts(TensorDict(batch_size=[2]))


def test_a_learnt_layout_still_checks_the_leaves_shapes() -> None:
    encoder = LayoutEncoder()
    for _ in range(3):
        encoder.encode_parts({"a": torch.zeros(4, 2), "b": torch.zeros(4)})
    with pytest.raises(CodecError, match="has 3 rows, others have 4"):
        encoder.encode_parts({"a": torch.zeros(4, 2), "b": torch.zeros(3)})
    td = {"a": torch.ones(4, 3), "b": torch.ones(4)}  # another item shape: another layout
    assert joined(encoder.encode_parts(td)) == encode(td).to_pybytes()
    assert list(_flat_leaves(td)) == ["a", "b"]


def test_zero_rows() -> None:
    encoder = LayoutEncoder()
    for _ in range(3):
        td = batch(0)
        assert joined(encoder.encode_parts(td)) == encode(td).to_pybytes()
