"""The socket protocol between ``--workers N`` frontends and the engine process, and the per-batch packing it
carries.

Frames are length-prefixed pickles of message lists, one frame per event-loop pass and direction (both ends
are this package, on this host, over a socket only this user can open).

Frontend to engine:

- ``("embed", [(id, seconds_left, images, texts, normalize), ...])``: every request that arrived in one
  event-loop pass; ``images`` is ``(indices, jpeg bytes)``, ``texts`` is ``(indices, captions)``, two lists
  each (the engine queues them as one run per tower as they are), each caption either its token ids
  (``token_bytes``: int32, trailing padding trimmed; the frontend tokenized it with the engine's tokenizer,
  which the engine names in its state reply) or the string itself (the engine tokenizes it); ``normalize``:
  whether the request wants the L2-normalised vectors (else the raw features).
- ``("abandon", id)``; ``("state", id, observations)`` and ``("metrics", id, observations)``, observations
  being what the frontend's routes saw since (``RelayedMetrics.take()``: the engine holds the one registry).

Engine to frontend:

- ``("results", ids, indices, vectors, normalized, tokens, errors)``: one message per batch and connection;
  row ``r`` of the float32 matrix ``vectors`` is item ``indices[r]`` of request ``ids[r]``: its L2-normalised
  vector where ``normalized`` (one bool for every row, or bytes of one bool per row) says so, else its raw
  features (only what the request asked for travels: at 64 captions a request the rows are most of the bytes).
  ``errors`` is ``[(id, index, message)]``.
- ``("refused", id, "busy"|"not_ready", message)``; ``("state", id, state, error, description, depths,
  text_tokenizer, embedding_width)``; ``("metrics", id, text)``.
"""
from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

HEADER = struct.Struct("!I")
TOKEN_DTYPE = np.int32  # every OpenCLIP vocabulary fits; the engine widens to int64 per batch
SCATTER_FROM = 16  # rows from which padded_tokens scatters them all at once


class FrameProtocol(asyncio.BufferedProtocol):
    """One end of a connection: the socket's bytes read straight into one buffer, every complete frame in it (a
    frame carries every message the other side queued in one event-loop pass) unpickled from there, and their
    messages handed to :meth:`messages_received` in order, all the frames one read brought in one call.
    Subclasses say what the messages do, and what the connection's end does (``connection_lost``).

    Why not a ``StreamReader``: it copies every byte three times before ``pickle.loads`` reads it (into a bytes
    object per read, into its buffer, out again by ``readexactly``), with the GIL held, and one-JPEG requests
    bring a body each: 47.3-56.2 us of the reading thread's CPU per 84 kB request against 22.9-28.6 this way
    (``benchmarks/serve/bench_wire.py``); the engine process with a no-op model at 6,000 such requests/s,
    116-118 against 86-90 us of CPU a request (``benchmarks/serve/engine_rate.py``; both in
    ``benchmarks/results/cpu-2core/frame_protocol_ef3bf3c/``)."""

    def __init__(self, capacity: int = 1 << 20) -> None:
        self.transport: Optional[asyncio.BaseTransport] = None
        self._buffer = bytearray(capacity)
        self._start = 0  # the first byte not yet unpickled
        self._end = 0  # one past the last byte read

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self._buffer)[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        buffer, start, end = self._buffer, self._start, self._end
        messages: List[Any] = []
        with memoryview(buffer) as view:
            while end - start >= HEADER.size:
                length = HEADER.unpack_from(buffer, start)[0]
                if length == 0:
                    raise ValueError("a frame of no bytes")  # the transport closes: the other end does not speak this
                if end - start - HEADER.size < length:
                    break
                body = start + HEADER.size
                messages += pickle.loads(view[body:body + length])
                start = body + length
        self._keep_partial(start, end)
        if messages:
            self.messages_received(messages)

    def _keep_partial(self, start: int, end: int) -> None:
        """Make room after the bytes of the frame not yet whole (``start:end``): moved to the front, into a larger
        buffer when the frame is larger than this one, or left where they are while room remains."""
        if start == end:
            self._start = self._end = 0
            return
        needed = HEADER.size
        if end - start >= HEADER.size:
            needed += HEADER.unpack_from(self._buffer, start)[0]
        if needed > len(self._buffer):
            grown = bytearray(needed)
            grown[:end - start] = self._buffer[start:end]
            self._buffer = grown
        elif needed > len(self._buffer) - start:
            self._buffer[:end - start] = self._buffer[start:end]  # the same length: no resize
        else:
            self._start, self._end = start, end
            return
        self._start, self._end = 0, end - start

    def messages_received(self, messages: List[Any]) -> None:
        raise NotImplementedError

    def eof_received(self) -> bool:
        return False  # the other end is done: close this one


def frame_parts(messages: List[Any]) -> Tuple[bytes, bytes]:
    """A frame as (length header, pickle): written together without joining them (the pickle can be megabytes
    of embeddings)."""
    data = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)), data


def frame(messages: List[Any]) -> bytes:
    return b"".join(frame_parts(messages))


class Outbox:
    """Messages to one socket, sent together once per event-loop pass: one pickle and one write for every
    request that arrived (or batch that finished) in that pass, not one each. ``writer``: the connection's
    transport. ``before_flush`` (if given) runs first and may add messages (the frontend packs the pass's
    requests into one ``embed`` message there)."""

    def __init__(self, writer: asyncio.WriteTransport, before_flush: Optional[Any] = None) -> None:
        self.writer = writer
        self.before_flush = before_flush
        self._messages: List[Any] = []
        self._scheduled = False

    def send(self, message: Any) -> None:
        self._messages.append(message)
        self.schedule()

    def put_first(self, message: Any) -> None:
        """Queue a message ahead of the others without scheduling a flush (for ``before_flush``)."""
        self._messages.insert(0, message)

    def schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if self.before_flush is not None:
            self.before_flush()
        messages, self._messages = self._messages, []
        if messages and not self.writer.is_closing():
            self.writer.writelines(frame_parts(messages))

    def is_closing(self) -> bool:
        return self.writer.is_closing()


# -- token ids ----------------------------------------------------------------------------------------------------
def token_bytes(tokens: Any) -> List[bytes]:
    """Each row of a padded token tensor (``[n, context_length]``, padding id 0) as int32 bytes without its
    trailing zeros: re-padded with zeros (``padded_tokens``) it is the same row. Only trailing zeros go, so an
    id 0 inside a caption (OpenAI's vocabulary maps ``!`` to 0) survives."""
    rows = tokens.numpy() if hasattr(tokens, "numpy") else np.asarray(tokens)
    rows = rows.astype(TOKEN_DTYPE, copy=False)
    nonzero = rows != 0
    # index of the last nonzero id + 1 (0 for an all-zero row)
    lengths = rows.shape[1] - np.argmax(nonzero[:, ::-1], axis=1)
    lengths[~nonzero.any(axis=1)] = 0
    return [rows[row, :length].tobytes() for row, length in enumerate(lengths.tolist())]


def padded_tokens(payloads: Sequence[bytes], context_length: int) -> np.ndarray:
    """``token_bytes`` rows back into one zero-padded int64 ``[n, context_length]`` array: row by row for a
    few rows, one masked scatter for more (about 15 us from 16 rows on, where the loop's per-row cost passes it;
    the loop is 2 us for one row)."""
    out = np.zeros((len(payloads), context_length), dtype=np.int64)
    if len(payloads) < SCATTER_FROM:
        for row, payload in enumerate(payloads):
            ids = np.frombuffer(payload, dtype=TOKEN_DTYPE)
            if ids.size > context_length:
                raise ValueError(f"a caption has {ids.size} token ids; the context length is {context_length}")
            out[row, :ids.size] = ids
        return out
    itemsize = np.dtype(TOKEN_DTYPE).itemsize
    lengths = np.fromiter((len(payload) // itemsize for payload in payloads), dtype=np.int64, count=len(payloads))
    if int(lengths.max()) > context_length:
        raise ValueError(f"a caption has {int(lengths.max())} token ids; the context length is {context_length}")
    out[np.arange(context_length) < lengths[:, None]] = np.frombuffer(b"".join(payloads), dtype=TOKEN_DTYPE)
    return out


# -- results of one batch to one connection ---------------------------------------------------------------------
# The vectors travel as an ndarray: pickle (protocol 5) writes its buffer straight into the frame, where bytes
# made first with ``tobytes()`` would be one more copy of every row.
def _which(normalized: Sequence[bool]) -> Any:
    """``normalized`` as the message carries it: one bool when every row agrees, else one byte per row."""
    if all(normalized):
        return True
    if not any(normalized):
        return False
    return np.asarray(normalized, dtype=np.bool_).tobytes()


def pack_rows(ids: List[int], indices: List[int], positions: List[int], normalized: List[bool], rows: Any,
              errors: List[Tuple[int, int, str]]) -> Tuple[Any, ...]:
    """One ``results`` message from a batch's ``BatchRows``: row ``r`` is item ``indices[r]`` of request
    ``ids[r]``, position ``positions[r]`` of the batch (ascending), its normalised vector where
    ``normalized[r]``, else its raw one: one slice of the batch's half when the positions run unbroken, else
    one row gather."""
    if not ids:
        return ("results", ids, indices, np.zeros((0, 0), np.float32), True, [], errors)
    which = _which(normalized)
    if which is True or which is False:
        half = rows.both[1 if which else 0]
        first, last = positions[0], positions[-1]
        matrix = half[first:last + 1] if last - first + 1 == len(positions) else np.take(half, positions, axis=0)
    else:
        wants = np.asarray(normalized, dtype=np.bool_)
        at = np.asarray(positions)
        matrix = np.empty((len(at), rows.both.shape[2]), dtype=np.float32)
        matrix[wants] = rows.both[1][at[wants]]
        matrix[~wants] = rows.both[0][at[~wants]]
    tokens = [rows.tokens[position] for position in positions] if rows.tokens is not None else [0] * len(ids)
    return ("results", ids, indices, matrix, which, tokens, errors)


def unpack_batch(message: Tuple[Any, ...]) -> List[Tuple[int, int, Any]]:
    """A ``results`` message back into ``[(request id, item index, result)]`` (an ``Embedded`` carries the
    vector its request asked for; the other is None)."""
    from .jobs import Embedded, ItemError

    _, ids, indices, matrix, which, tokens, errors = message
    out: List[Tuple[int, int, Any]] = []
    if ids:
        flags = [which] * len(ids) if which is True or which is False else np.frombuffer(which, np.bool_).tolist()
        out = [(request_id, indices[row], Embedded(None, matrix[row], tokens[row]) if flags[row]
                else Embedded(matrix[row], None, tokens[row])) for row, request_id in enumerate(ids)]
    return out + [(request_id, index, ItemError(text)) for request_id, index, text in errors]
