"""The restricted unpickler for data files: real ground-truth pickles load, a pickle that would call a
function is refused with one error naming the file and the global, and the function never runs."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from aggzoo.data.safe_pickle import load_data_pickle
from aggzoo.errors import DatasetFormatError, UnsafeDataFileError, UserError


class _TouchesOnLoad:
    """Pickles as ``os.system("touch <marker>")``: what a crafted ground-truth file would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


class _OpensOnLoad:
    """Pickles as ``open(path, "w")`` through the builtins: truncates/creates ``path`` if it ran."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return open, (self.path, "w")


def _gnd_like() -> dict:
    """A ground truth shaped like revisitop's: dicts, lists, strings, ints, floats, numpy arrays and scalars."""
    return {
        "imlist": ["all_souls_000001", "ashmolean_000000"],
        "qimlist": ["all_souls_000013"],
        "gnd": [{
            "bbx": [136.5, 34.25, 648.5, 955.75],
            "easy": np.array([0], dtype=np.int64),
            "hard": np.array([], dtype=np.int32),
            "junk": [1],
            "score": np.float32(0.5),
            "ok": (np.uint8(3), 2.5, None, True),
        }],
        "matrix": np.arange(12, dtype=np.float64).reshape(3, 4).T,  # non-contiguous: a Fortran-order pickle
        "names": np.array(["a", "bc"]),
    }


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (np.ndarray, np.generic)):
        return type(a) is type(b) and a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_real_ground_truth_pickles_load(tmp_path, protocol):
    data = _gnd_like()
    path = tmp_path / "gnd.pkl"
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    loaded = load_data_pickle(path)
    assert _same(data, loaded)


@pytest.mark.parametrize("payload", ["system", "open"])
def test_a_pickle_that_calls_a_function_is_refused_and_nothing_runs(tmp_path, payload):
    marker = tmp_path / "marker"
    bad = _TouchesOnLoad(marker) if payload == "system" else _OpensOnLoad(marker)
    path = tmp_path / "gnd_roxford5k.pkl"
    # The payload hides inside an honest-looking ground truth, after a numpy array that must load.
    data = _gnd_like()
    data["gnd"][0]["junk"] = [1, bad]
    path.write_bytes(pickle.dumps(data, protocol=4))
    with pytest.raises(UnsafeDataFileError) as err:
        load_data_pickle(path, what="revisitop ground truth")
    message = str(err.value)
    called = os.system if payload == "system" else open
    expected_global = f"{called.__module__}.{called.__name__}"  # posix.system, io.open
    assert str(path) in message and expected_global in message and "Nothing in the file was run" in message
    assert isinstance(err.value, UserError) and isinstance(err.value, DatasetFormatError)
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"not a pickle at all", pickle.dumps({"a": [1, 2, 3]})[:-4]],
                         ids=["empty", "text", "truncated"])
def test_an_unreadable_pickle_is_one_format_error(tmp_path, content):
    path = tmp_path / "gnd.pkl"
    path.write_bytes(content)
    with pytest.raises(DatasetFormatError, match="cannot read the data file as a pickle") as err:
        load_data_pickle(path)
    assert str(path) in str(err.value) and not isinstance(err.value, UnsafeDataFileError)


def test_a_pickle_written_under_the_other_numpy_spelling_loads(tmp_path):
    """numpy 1.x writes ``numpy.core.multiarray``, numpy 2.x ``numpy._core.multiarray``: both load."""
    array = np.arange(5, dtype=np.int16)
    raw = pickle.dumps(array, protocol=2)
    here = b"numpy._core.multiarray" if b"numpy._core.multiarray" in raw else b"numpy.core.multiarray"
    other = b"numpy.core.multiarray" if here == b"numpy._core.multiarray" else b"numpy._core.multiarray"
    assert here in raw  # the protocol-2 pickle names the module as text (a GLOBAL opcode)
    path = tmp_path / "other.pkl"
    path.write_bytes(raw.replace(here, other))
    loaded = load_data_pickle(path)
    assert loaded.dtype == np.int16 and loaded.tolist() == [0, 1, 2, 3, 4]
