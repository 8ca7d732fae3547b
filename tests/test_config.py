import pytest
import torch

from turboquant import KVQuantConfig, quantize_kv


def test_defaults_and_roles():
    cfg = KVQuantConfig()
    assert cfg.method == "affine" and cfg.bits == 4 and cfg.metadata_dtype == torch.float16
    mixed = KVQuantConfig(method="turbo", bits=3, k_bits=8)
    assert mixed.spec("k").bits == 8 and mixed.spec("v").bits == 3
    assert KVQuantConfig(metadata_dtype="bf16").metadata_dtype == torch.bfloat16


@pytest.mark.parametrize("kwargs, words", [
    (dict(method="int4"), ["method='int4'", "'affine'", "'turbo'"]),
    (dict(bits=5), ["bits=5", "2, 3, 4, 8"]),
    (dict(bits=1), ["bits=1"]),
    (dict(bits="4"), ["bits='4'"]),
    (dict(bits=True), ["bits=True"]),
    (dict(k_bits=6), ["k_bits=6"]),
    (dict(v_bits=16), ["v_bits=16"]),
    (dict(group_size=48), ["group_size=48", "32, 64, 128"]),
    (dict(method="turbo", group_size=64), ["group_size=64", "affine"]),
    (dict(clip_percentile=101), ["clip_percentile=101", "(50, 100]"]),
    (dict(clip_percentile=10.0), ["clip_percentile=10.0"]),
    (dict(method="turbo", clip_percentile=99.9), ["clip_percentile=99.9", "affine"]),
    (dict(metadata_dtype=torch.int8), ["metadata_dtype=torch.int8", "torch.float16"]),
    (dict(metadata_dtype="fp8"), ["metadata_dtype='fp8'"]),
    (dict(seed=-1), ["seed=-1"]),
])
def test_invalid_values_raise_at_construction(kwargs, words):
    with pytest.raises(ValueError) as e:
        KVQuantConfig(**kwargs)
    for w in words:
        assert w in str(e.value)


def test_unknown_option_and_role():
    with pytest.raises(ValueError, match="'bitz'.*allowed: bits"):
        KVQuantConfig.from_kwargs(bitz=3)
    with pytest.raises(ValueError, match="role='q'"):
        KVQuantConfig().spec("q")


@pytest.mark.parametrize("d, group", [(80, 64), (96, 64), (80, 32), (64, 128)])
def test_group_size_must_divide_head_dim(d, group):
    with pytest.raises(ValueError, match=f"group_size={group} does not divide head_dim={d}"):
        quantize_kv(torch.randn(2, d), KVQuantConfig(group_size=group))


def test_head_dim_must_pack():
    with pytest.raises(ValueError, match="head_dim=20 .* multiple of 8"):
        quantize_kv(torch.randn(3, 20), KVQuantConfig(bits=3))
    with pytest.raises(ValueError, match="x.dtype=torch.int32"):
        quantize_kv(torch.ones(3, 64, dtype=torch.int32))


def test_protected_layers_resolve_per_layer():
    c = KVQuantConfig(bits=3, k_bits=4, protected_layers=[-1, 0, 0], protected_bits=8)
    assert c.protected_layers == (-1, 0)
    assert [c.for_layer(i, 4) and c.for_layer(i, 4).spec("k").bits for i in range(4)] == [8, 4, 4, 8]
    assert c.for_layer(1, 4) is c and c.for_layer(3, 4).spec("v").bits == 8
    dense = KVQuantConfig(bits=2, protected_layers=(1, -1))
    assert [dense.for_layer(i, 3) is None for i in range(3)] == [False, True, True]
    assert dense.for_layer(2, None) is dense  # a negative index needs the layer count


@pytest.mark.parametrize("bad, msg", [(dict(protected_layers="0"), "protected_layers='0'"),
                                      (dict(protected_layers=(True,)), "protected_layers"),
                                      (dict(protected_bits=8), "needs protected_layers"),
                                      (dict(protected_layers=(0,), protected_bits=6), "protected_bits=6")])
def test_protected_options_are_validated(bad, msg):
    with pytest.raises(ValueError, match=msg):
        KVQuantConfig(**bad)
