"""Error paths of the library's small readers that no other test reaches: each error is one line
naming the file and what was expected, worked out from the input written here."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_qaccuracy.tolerances import ini_settings, ini_task_metrics


@pytest.mark.parametrize("name", ["pyproject.toml", "pytest.ini"])
def test_a_settings_file_that_is_missing_names_it_once(tmp_path: Path, name: str) -> None:
    """The reason is the system's, without the path again (it read '[Errno 2] ... : <path>' before)."""
    with pytest.raises(ValueError) as info:
        ini_settings(tmp_path / name)
    assert str(info.value) == f"{tmp_path / name}: cannot read it (No such file or directory)"


def test_a_toml_file_that_does_not_parse_names_it_and_the_place(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.pytest.ini_options\nqaccuracy_min_cosine = 0.9\n", encoding="utf-8")
    with pytest.raises(ValueError) as info:
        ini_task_metrics(path)
    # Python 3.11's tomllib quotes the bracket with ', tomli (Python 3.10) with "
    message = str(info.value).replace('"]"', "']'")
    assert message == f"{path}: cannot read it (Expected ']' at the end of a table declaration (at line 1, column 25))"


@pytest.mark.parametrize("name", ["pyproject.toml", "tox.ini"])
def test_a_settings_file_that_is_not_utf8_names_it(tmp_path: Path, name: str) -> None:
    """A Latin-1 'é' (0xe9) in a comment: a bare UnicodeDecodeError without the file before."""
    path = tmp_path / name
    section = "[tool.pytest.ini_options]" if name.endswith(".toml") else "[pytest]"
    text = f"{section}\nqaccuracy_min_cosine = 0.9\n# caf".encode() + b"\xe9\n"
    path.write_bytes(text)
    with pytest.raises(ValueError) as info:
        ini_settings(path)
    position = text.index(b"\xe9")
    assert str(info.value) == (
        f"{path}: cannot read it ('utf-8' codec can't decode byte 0xe9 in position {position}: "
        "invalid continuation byte)"
    )


def test_an_ini_file_that_does_not_parse_names_it_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "tox.ini"
    path.write_text("[pytest\nqaccuracy_min_cosine = 0.9\n", encoding="utf-8")
    with pytest.raises(ValueError) as info:
        ini_settings(path)
    assert str(info.value).startswith(f"{path}: cannot read it (File contains no section headers.")
    assert f"file: '{path}', line: 1" in str(info.value) and "'[pytest\\n'" in str(info.value)


def test_the_public_api_is_imported_lazily_and_listed() -> None:
    """``pytest_qaccuracy.compare`` and the rest load their module on first use; a name that is not
    exported is an AttributeError naming it; ``dir()`` lists every exported name."""
    import pytest_qaccuracy

    assert set(pytest_qaccuracy.__all__) <= set(dir(pytest_qaccuracy))
    from pytest_qaccuracy.analysis.compare import compare

    assert pytest_qaccuracy.compare is compare
    with pytest.raises(AttributeError, match=r"^module 'pytest_qaccuracy' has no attribute 'nosuch'$"):
        pytest_qaccuracy.nosuch  # noqa: B018
