"""The presets' names (presets.py): the one list, and onnxruntime presets pinned to a release
(``onnxruntime-arm64-neon@1.28``)."""

from __future__ import annotations

import pytest

from pytest_qaccuracy.analysis.recipe import check_targets
from pytest_qaccuracy.backend import get_scheme
from pytest_qaccuracy.backend.scheme import for_onnxruntime
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.plugin.schemes import check_scheme
from pytest_qaccuracy.presets import HOST, HOST_FAMILIES, NAMES, OLDEST, split_release
from pytest_qaccuracy.tolerances import BadValue


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("onnxruntime-vnni", ("onnxruntime-vnni", None)),
        ("tflite", ("tflite", None)),
        ("onnxruntime-arm64-neon@1.28", ("onnxruntime-arm64-neon", (1, 28))),
        ("onnxruntime@1.20.1", ("onnxruntime", (1, 20))),  # a patch number is ignored
        ("onnxruntime-avx2@1.18", ("onnxruntime-avx2", (1, 18))),
        ("onnxruntime-avx2@2.0", ("onnxruntime-avx2", (2, 0))),
    ],
)
def test_a_name_splits_into_preset_and_release(name: str, want: tuple) -> None:
    assert split_release(name) == want


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("onnxruntime-vnni@1", "expected PRESET@MAJOR.MINOR"),
        ("onnxruntime-vnni@1.x", "expected PRESET@MAJOR.MINOR"),
        ("onnxruntime-vnni@", "expected PRESET@MAJOR.MINOR"),
        ("@1.28", "expected PRESET@MAJOR.MINOR"),
        ("onnxruntime@1.2@1.3", "expected PRESET@MAJOR.MINOR"),
        ("tflite@1.28", "only onnxruntime's presets"),
        ("onnxruntime-vnni@1.17", "before 1.18 are not emulated"),
        ("onnxruntime-vnni@0.99", "before 1.18 are not emulated"),
    ],
)
def test_a_bad_release_is_refused_by_every_reader(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        split_release(name)
    with pytest.raises(InputError, match=message):
        get_scheme(name)
    with pytest.raises(BadValue, match=message):
        check_scheme(name)
    with pytest.raises(InputError, match=message):
        check_targets([name])


def test_a_pinned_preset_is_the_preset_as_that_release_computes() -> None:
    assert OLDEST == (1, 18)
    for preset in ("onnxruntime-avx2", "onnxruntime-vnni", "onnxruntime-arm64", "onnxruntime-arm64-neon"):
        for release in ((1, 18), (1, 20), (1, 28), (1, 29), (1, 31), (1, 32)):
            pinned = get_scheme(f"{preset}@{release[0]}.{release[1]}")
            assert pinned == for_onnxruntime(get_scheme(preset), release).replace(name=pinned.name)
            assert pinned.name == f"{preset}@{release[0]}.{release[1]}"
    assert get_scheme("onnxruntime-arm64-neon@1.29").neon_int8_conv_pairs
    assert not get_scheme("onnxruntime-arm64-neon@1.30").neon_int8_conv_pairs
    assert (
        get_scheme("onnxruntime-vnni@1.28").softmax_int8_wraps and not get_scheme("onnxruntime@1.29").softmax_int8_wraps
    )
    host = get_scheme("onnxruntime")
    assert get_scheme("onnxruntime@1.20").name == f"{host.name}@1.20"  # this machine's family, that release


#: each field that changed between onnxruntime releases: (the last release before, the first after,
#: the value before); the releases and values as measured (backend/scheme.py's docstrings)
CHANGES = {
    "quantize_float_weights": ((1, 20), (1, 21), False),
    "qdq_pairs_removed_first": ((1, 18), (1, 19), False),
    "pool_size_plain": ((1, 20), (1, 21), True),
    "softmax_int8_wraps": ((1, 28), (1, 29), True),
    "softmax_float64": ((1, 31), (1, 32), False),
}


@pytest.mark.parametrize("field", sorted(CHANGES))
@pytest.mark.parametrize("preset", ["onnxruntime-avx2", "onnxruntime-vnni", "onnxruntime-arm64-neon"])
def test_each_release_dependent_field_changes_at_its_release(preset: str, field: str) -> None:
    before, after, value = CHANGES[field]
    scheme = get_scheme(preset)
    assert getattr(for_onnxruntime(scheme, before), field) is value
    assert getattr(for_onnxruntime(scheme, after), field) is (not value)
    assert getattr(for_onnxruntime(scheme, (after[0] + 1, 0)), field) is (not value)  # a 2.0 as the newest
    assert for_onnxruntime(scheme, after).name == preset  # the name kept, not "custom"


def test_1_22_alone_leaves_float_weights_in_float() -> None:
    scheme = get_scheme("onnxruntime-vnni")
    assert [for_onnxruntime(scheme, (1, minor)).quantize_float_weights for minor in (21, 22, 23)] == [True, False, True]


def test_unknown_presets_are_refused_with_or_without_a_release() -> None:
    with pytest.raises(InputError, match="unknown scheme 'onnxruntime-foo'"):
        get_scheme("onnxruntime-foo@1.20")
    with pytest.raises(BadValue, match=r"unknown scheme 'onnxruntime-foo@1\.20'"):
        check_scheme("onnxruntime-foo@1.20")
    with pytest.raises(InputError, match=r"unknown deployment target 'onnxruntime-foo@1\.20'"):
        check_targets(["onnxruntime-foo@1.20"])
    assert check_targets(["onnxruntime-arm64@1.24", "onnxruntime"]) == ("onnxruntime-arm64@1.24", "onnxruntime")


def test_every_named_preset_is_taken_by_the_option_the_recipe_targets_and_the_backend() -> None:
    assert NAMES[0] == HOST and set(HOST_FAMILIES) <= set(NAMES) and len(set(NAMES)) == len(NAMES)
    for name in NAMES:
        assert check_scheme(name) == name
        assert check_targets([name]) == (name,)
        assert get_scheme(name).name in (name, *HOST_FAMILIES)


def test_an_unknown_preset_is_refused_with_the_same_list_everywhere() -> None:
    listed = ", ".join(NAMES)
    with pytest.raises(BadValue, match=f"presets: {listed}"):
        check_scheme("onnxruntime-sse")
    with pytest.raises(InputError, match=f"expected one of {listed}$"):
        check_targets(["onnxruntime-sse"])
    with pytest.raises(InputError, match=f"presets: {listed}$"):
        get_scheme("onnxruntime-sse")
