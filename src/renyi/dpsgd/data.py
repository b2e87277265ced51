"""Datasets for DP-SGD demos and benchmarks, real data only, nothing downloaded.

* :func:`load_digits` — scikit-learn's bundled 8×8 handwritten digits (1797 images, shipped
  with scikit-learn, no download). The default for demos and tests.
* :func:`load_fashion_mnist` — Fashion-MNIST (Xiao, Rasul & Vollgraf 2017) from the four
  gzipped IDX files in a directory you give, or where Debian's ``dataset-fashion-mnist``
  package installs them (``/usr/share/datasets/fashion-mnist``). If they are absent the error
  says how to get them; there is never a silent fallback to other data.

Both return ``(train, test)`` as :class:`torch.utils.data.TensorDataset` of float32 images
of shape (N, 1, H, W) scaled to [0, 1] then standardised with the *public* constants below,
and int64 labels.

Example:
    >>> train, test = load_digits()
    >>> train.tensors[0].shape[1:]
    torch.Size([1, 8, 8])
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from renyi._validation import check_int, check_range, fail
from renyi.errors import RenyiError

__all__ = [
    "DEBIAN_FASHION_MNIST_DIR",
    "DatasetNotFoundError",
    "find_fashion_mnist",
    "load_digits",
    "load_doc_lines",
    "load_fashion_mnist",
    "read_idx",
]

DEBIAN_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
_FASHION_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
# Normalisation constants fixed in advance (not computed from the private training data).
_FASHION_MEAN, _FASHION_STD = 0.2860, 0.3530
_DIGITS_MEAN, _DIGITS_STD = 0.3, 0.4
_IDX_DTYPES: dict[int, Any] = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


class DatasetNotFoundError(RenyiError, FileNotFoundError):
    """The requested dataset is not on this machine (the message says how to get it)."""


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (LeCun's MNIST format), gzipped or not, into a numpy array."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise RenyiError(f"{path} is not an IDX file (bad magic number {raw[:4]!r})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int(d) for d in np.frombuffer(raw[4:header], dtype=">u4"))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise RenyiError(
            f"{path}: header says shape {shape} ({expected} bytes), file has "
            f"{len(raw) - header} bytes of data"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def _to_tensors(images: np.ndarray, labels: np.ndarray, mean: float, std: float) -> TensorDataset:
    x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))
    x = ((x - mean) / std).unsqueeze(1)
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    return TensorDataset(x, y)


def load_digits(
    test_fraction: float = 0.2, split_seed: int = 0
) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's digits as (train, test) of 1×8×8 images (pixel values / 16).

    The train/test split is a fixed permutation (``split_seed``), not a privacy mechanism.
    """
    from sklearn.datasets import load_digits as _sk_digits

    test_fraction = check_range(
        "test_fraction", test_fraction, 0.0, 1.0, low_open=True, high_open=True
    )
    split_seed = check_int("split_seed", split_seed, 0)
    bunch = _sk_digits()
    images = bunch.images.astype(np.float32) / 16.0
    labels = bunch.target
    order = np.random.default_rng(split_seed).permutation(len(labels))
    n_test = max(1, round(test_fraction * len(labels)))
    test_idx, train_idx = order[:n_test], order[n_test:]
    return (
        _to_tensors(images[train_idx], labels[train_idx], _DIGITS_MEAN, _DIGITS_STD),
        _to_tensors(images[test_idx], labels[test_idx], _DIGITS_MEAN, _DIGITS_STD),
    )


def _text_lines(texts: list[str], min_chars: int) -> list[str]:
    lines = (line.strip() for text in texts for line in text.splitlines())
    return sorted({line for line in lines if len(line) >= min_chars and line.isascii()})


def load_doc_lines(
    seq_len: int = 48,
    per_class: int | None = 2000,
    test_fraction: float = 0.2,
    split_seed: int = 0,
) -> tuple[TensorDataset, TensorDataset]:
    """A text task from text that packages ship (no download): who wrote this line?

    Class 0: lines of the Python language reference (``pydoc_data.topics``, shipped with
    CPython); class 1: lines of numpy's docstrings (shipped with numpy). Each example is
    the line's first ``seq_len`` bytes as tokens 1..127 (ASCII lines only), padded with 0
    (a public vocabulary: nothing is learnt from the data to tokenise it). Classes are
    balanced (``per_class`` lines each, chosen by a fixed permutation; None = as many as
    the smaller class has).

    Returns:
        ``(train, test)`` ``TensorDataset`` of int64 tokens ``[N, seq_len]`` and int64 labels.
    """
    import pydoc_data.topics

    seq_len = check_int("seq_len", seq_len, 1)
    split_seed = check_int("split_seed", split_seed, 0)
    test_fraction = check_range(
        "test_fraction", test_fraction, 0.0, 1.0, low_open=True, high_open=True
    )
    python = _text_lines(list(pydoc_data.topics.topics.values()), 20)
    numpy_docs = []
    for name in sorted(dir(np)):
        doc = getattr(getattr(np, name, None), "__doc__", None)
        if isinstance(doc, str):
            numpy_docs.append(doc)
    numpy_lines = _text_lines(numpy_docs, 20)
    rng = np.random.default_rng(split_seed)
    count = min(len(python), len(numpy_lines))
    if per_class is not None:
        count = min(count, check_int("per_class", per_class, 1))
    chosen = [
        [lines[i] for i in rng.permutation(len(lines))[:count]] for lines in (python, numpy_lines)
    ]
    tokens = np.zeros((2 * count, seq_len), dtype=np.int64)
    labels = np.repeat(np.arange(2, dtype=np.int64), count)
    for row, line in enumerate(chosen[0] + chosen[1]):
        raw = np.frombuffer(line.encode("ascii")[:seq_len], dtype=np.uint8)
        tokens[row, : raw.size] = raw
    order = rng.permutation(2 * count)
    n_test = max(1, round(test_fraction * 2 * count))
    test_idx, train_idx = order[:n_test], order[n_test:]
    as_ds = lambda idx: TensorDataset(  # noqa: E731
        torch.from_numpy(tokens[idx]), torch.from_numpy(labels[idx])
    )
    return as_ds(train_idx), as_ds(test_idx)


def _dpkg_directories() -> list[Path]:
    """Directories ``dpkg -L dataset-fashion-mnist`` lists as holding the IDX files."""
    import shutil
    import subprocess

    if shutil.which("dpkg") is None:
        return []
    try:
        out = subprocess.run(
            ["dpkg", "-L", "dataset-fashion-mnist"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    name = _FASHION_FILES["train_images"]
    return sorted({Path(line).parent for line in out.splitlines() if line.endswith(name)})


def find_fashion_mnist(directory: str | os.PathLike[str] | None = None) -> Path:
    """The directory holding the four Fashion-MNIST IDX files, or a helpful error.

    Looks in ``directory`` if given, else ``$RENYI_FASHION_MNIST``, else Debian's location
    (and wherever ``dpkg -L dataset-fashion-mnist`` says the files are).
    """
    if directory is not None:
        candidates = [Path(directory)]
    elif os.environ.get("RENYI_FASHION_MNIST"):
        candidates = [Path(os.environ["RENYI_FASHION_MNIST"])]
    else:
        candidates = [DEBIAN_FASHION_MNIST_DIR, *_dpkg_directories()]
    for cand in candidates:
        if all((cand / name).is_file() for name in _FASHION_FILES.values()):
            return cand
    where = ", ".join(str(c) for c in candidates)
    raise DatasetNotFoundError(
        f"Fashion-MNIST not found in {where} (need {', '.join(_FASHION_FILES.values())}). "
        "Install it with `sudo apt install dataset-fashion-mnist` (Debian/Ubuntu; files go to "
        f"{DEBIAN_FASHION_MNIST_DIR}), or download the four .gz files from "
        "https://github.com/zalandoresearch/fashion-mnist and pass their directory "
        "(--data-dir DIR, or RENYI_FASHION_MNIST=DIR)."
    )


def load_fashion_mnist(
    directory: str | os.PathLike[str] | None = None, *, limit: int | None = None
) -> tuple[TensorDataset, TensorDataset]:
    """Fashion-MNIST as (train, test) of 1×28×28 images (60000 / 10000 examples).

    ``limit`` keeps the first ``limit`` examples of each split (for quick experiments).
    """
    root = find_fashion_mnist(directory)
    arrays = {key: read_idx(root / name) for key, name in _FASHION_FILES.items()}
    if limit is not None:
        limit = check_int("limit", limit, 1)
        arrays = {k: v[:limit] for k, v in arrays.items()}
    for split in ("train", "test"):
        if arrays[f"{split}_images"].shape[0] != arrays[f"{split}_labels"].shape[0]:
            raise fail(f"{split} files", root, "as many labels as images")
    scale = 1.0 / 255.0
    return (
        _to_tensors(
            arrays["train_images"] * scale, arrays["train_labels"], _FASHION_MEAN, _FASHION_STD
        ),
        _to_tensors(
            arrays["test_images"] * scale, arrays["test_labels"], _FASHION_MEAN, _FASHION_STD
        ),
    )
