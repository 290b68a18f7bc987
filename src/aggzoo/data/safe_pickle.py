"""Reading pickled data files (ground truth) without letting the file choose code to run.

A pickle is a program: every class or function it names (a *global*) is imported and may be called
while it loads, so ``pickle.load`` on a downloaded file runs whatever the file says
(``os.system``, ``shutil.copyfile``). Data files need none of that: dicts, lists, tuples, strings,
bytes, numbers, booleans and ``None`` are opcodes of their own, and numpy arrays and scalars need
only numpy's own reconstructors. :class:`DataUnpickler` resolves exactly those globals and refuses
every other one *before* it is imported or called, so a refused file ran nothing.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, BinaryIO

from aggzoo.errors import DatasetFormatError, UnsafeDataFileError

__all__ = ["ALLOWED_GLOBALS", "DataUnpickler", "load_data_pickle", "unpickle_data"]

_NUMPY_CORE = ("numpy.core", "numpy._core")  # numpy 1.x and 2.x spell the same modules both ways

#: ``(module, name)`` a data pickle may name: what numpy writes for arrays and scalars, in both
#: spellings of numpy's core package. ``_codecs.encode`` turns the latin-1 text of an array's bytes
#: back into bytes in protocol-2 pickles written by Python 3; ``_frombuffer`` rebuilds arrays in
#: protocol-5 pickles. None of them runs anything but the copy of data into an array.
ALLOWED_GLOBALS = frozenset({
    *((f"{core}.multiarray", name) for core in _NUMPY_CORE for name in ("_reconstruct", "scalar")),
    *((f"{core}.numeric", "_frombuffer") for core in _NUMPY_CORE),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
    ("builtins", "bytes"),
    ("__builtin__", "bytes"),
})


class _RefusedGlobal(pickle.UnpicklingError):
    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"{module}.{name}")
        self.global_name = f"{module}.{name}"


class DataUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` that resolves only :data:`ALLOWED_GLOBALS`.

    Any other global (and any persistent id) raises before it is imported, so nothing the file
    names is ever called.
    """

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED_GLOBALS:
            raise _RefusedGlobal(module, name)
        try:
            return super().find_class(module, name)
        except ImportError:
            # Written under the other numpy major version: the same function lives under the other spelling.
            core, _, rest = module.partition(".")[2].partition(".")
            other = {"core": "numpy._core", "_core": "numpy.core"}.get(core)
            if other is None:
                raise
            return super().find_class(f"{other}.{rest}", name)


def unpickle_data(file: BinaryIO, path: str | Path, *, what: str = "data file",
                  fix: str = "re-download it from its source") -> Any:
    """The object pickled in the open ``file`` (read from its current position) by :class:`DataUnpickler`;
    ``path``, ``what`` and ``fix`` word the errors (see :func:`load_data_pickle`)."""
    try:
        return DataUnpickler(file).load()
    except _RefusedGlobal as err:
        raise UnsafeDataFileError(
            f"{path}: refusing the global {err.global_name}: a {what} holds only dicts, lists, strings, numbers "
            f"and numpy arrays, and this pickle would import and call {err.global_name} to load. Nothing in the "
            f"file was run; {fix}."
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            ImportError, UnicodeDecodeError, OverflowError, MemoryError, RecursionError, OSError) as err:
        reason = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        raise DatasetFormatError(f"{path}: cannot read the {what} as a pickle ({reason}); {fix}.") from None


def load_data_pickle(path: str | Path, *, what: str = "data file", fix: str = "re-download it from its source") -> Any:
    """The object pickled in ``path`` (dicts, lists, strings, numbers, numpy arrays), read by
    :class:`DataUnpickler`.

    Args:
        path: the pickle file.
        what: what the file is, for the messages (``"revisitop ground truth"``).
        fix: what to do about a bad file, for the messages.

    Raises:
        UnsafeDataFileError: the file names a global outside :data:`ALLOWED_GLOBALS` (it would run
            code to load); nothing in it was run.
        DatasetFormatError: the file is not a readable pickle (truncated, empty, another format).
    """
    try:
        with Path(path).open("rb") as file:
            return unpickle_data(file, path, what=what, fix=fix)
    except OSError as err:  # opening it: unreadable, a folder
        raise DatasetFormatError(f"{path}: cannot open the {what} ({type(err).__name__}: {err}); {fix}.") from None
