"""probing.layers: one meaning of a layer spec everywhere (-1 = last), and its errors."""

import pytest

from probing.layers import LayerSpecError, resolve_layer, resolve_layers, shared_layers


@pytest.mark.parametrize("spec,expected", [
    (None, [0, 1, 2, 3, 4, 5, 6]), ("all", [0, 1, 2, 3, 4, 5, 6]), ("0,3,-1", [0, 3, 6]), ("-1", [6]),
    ("-2", [5]), ("-7", [0]), ("2-4", [2, 3, 4]), ("0-1,-1", [0, 1, 6]), ("-3--1", [4, 5, 6]),
    ("5,1,5", [1, 5]), (" 1 , 2 ", [1, 2]), ([0, -1], [0, 6]), (3, [3]),
])
def test_every_meaning_of_a_spec(spec, expected):
    assert resolve_layers(spec, 6) == expected


@pytest.mark.parametrize("spec,message", [
    ("7", r"--layers '7': layer 7 is out of range; this model has layers 0..6 \(0 = embeddings; -1 = 6"),
    ("-8", r"layer -8 is out of range; this model has layers 0..6"),
    ("x", r"'x' is not an integer or a range a-b"),
    ("1.5", r"'1.5' is not an integer"),
    ("4-2", r"range '4-2' runs backwards \(4 > 2\)"),
    ("", r"no layer given"),
    (",", r"no layer given"),
])
def test_errors_name_the_spec_and_the_range(spec, message):
    with pytest.raises(LayerSpecError, match=message):
        resolve_layers(spec, 6)
    assert issubclass(LayerSpecError, ValueError)


def test_stored_layers_limit_and_default():
    assert resolve_layers(None, 6, stored=[0, 3, 6]) == [0, 3, 6]
    assert resolve_layers("-1", 6, stored=[0, 3, 6]) == [6]
    with pytest.raises(LayerSpecError, match=r"layer\(s\) \[4\] are not stored; the cache holds layers \[0, 3, 6\]"):
        resolve_layers("3,4", 6, stored=[0, 3, 6])


def test_one_layer():
    assert resolve_layer("-1", 12) == 12 and resolve_layer(2, 12) == 2
    with pytest.raises(LayerSpecError, match=r"--probe-layer '1,2' names 2 layers \[1, 2\]; this takes exactly one"):
        resolve_layer("1,2", 12, option="--probe-layer")
    with pytest.raises(LayerSpecError, match="this takes one layer"):
        resolve_layer("all", 12)


class _FakeCache:
    def __init__(self, name, layers, n_layers=6):
        from pathlib import Path

        self.path, self.layers, self.manifest = Path(name), layers, {"model": {"n_layers": n_layers}}


def test_shared_layers_of_several_caches():
    a, b = _FakeCache("a", [0, 2, 4, 6]), _FakeCache("b", [2, 6])
    assert shared_layers(None, a, b) == [2, 6]
    assert shared_layers("-1", a, b) == [6]
    with pytest.raises(LayerSpecError, match=r"\[4\] are not stored"):
        shared_layers("4", a, b)
    with pytest.raises(LayerSpecError, match="no layer is stored in every cache: a holds"):
        shared_layers(None, a, _FakeCache("c", [1]))
