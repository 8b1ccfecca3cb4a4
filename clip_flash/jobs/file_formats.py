"""The bytes of a shard's files: embeddings as ``.npy``, metadata and failures as parquet (text columns, names
that are not UTF-8 escaped rather than stopping the job), and the shard's inputs as gzipped JSON."""
from __future__ import annotations

import io
import json
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np


def stored_text(text: str) -> str:
    """``text`` as valid UTF-8: unchanged when it is; else each byte a lone surrogate stands for (a file name
    that is not UTF-8, decoded by Python with ``surrogateescape``) written ``\\xNN``."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace") \
            if _only_escaped_bytes(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _only_escaped_bytes(text: str) -> bool:
    return all(not 0xD800 <= ord(char) <= 0xDFFF or 0xDC80 <= ord(char) <= 0xDCFF for char in text)


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array))
    return buffer.getvalue()


def parquet_bytes(columns: Dict[str, List[Any]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def text_column(values: Any) -> "pa.Array":
        if hasattr(values, "to_arrow"):  # batches.LazyColumn: made in bulk here
            try:
                return values.to_arrow()
            except UnicodeEncodeError:
                values = list(values)
        try:
            return pa.array(values, type=pa.string())
        except UnicodeEncodeError:  # a name that is not UTF-8: stored escaped rather than stopping the job
            return pa.array([None if value is None else stored_text(value) for value in values], type=pa.string())

    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({name: text_column(values) for name, values in columns.items()}), sink)
    return sink.getvalue().to_pybytes()


def inputs_bytes(inputs: Sequence[Tuple[str, str]]) -> bytes:
    import gzip

    # surrogates kept (json escapes them): compared with the next run's names as they are
    return gzip.compress(json.dumps([list(pair) for pair in inputs]).encode(), mtime=0)
