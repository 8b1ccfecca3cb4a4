"""``--workers N``'s per-request work moved off the engine process, piece by piece without a server: captions
tokenized in a frontend give the engine's own ids, results travel per batch (a request split across batches,
an abandoned request's late rows), and metrics aggregated in a frontend count what per-request calls count."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch

pytest.importorskip("prometheus_client", reason="the serve extra is not installed: pip install 'clip_flash[serve]'")

from clip_flash.serve.engine_server import FrontendConnection, RemoteRequest  # noqa: E402
from clip_flash.serve.inputs import TextInputs  # noqa: E402
from clip_flash.serve.jobs import BatchRows, EmbeddingJob, ItemError, QueuedInputs, deliver_rows  # noqa: E402
from clip_flash.serve.metrics import RelayedMetrics, ServeMetrics  # noqa: E402
from clip_flash.serve.remote_pool import RemotePool  # noqa: E402
from clip_flash.serve.wire import HEADER, FrameProtocol, frame, pack_rows, padded_tokens, token_bytes  # noqa: E402

TRICKY = [
    "",  # SOT, EOT: embedded like any caption (not an error)
    "a photo of a cat",
    "Ünïcödé café — naïve façade, 東京の写真, emoji 🐱🚀, Ελληνικά",
    "wow!#$ what?! !#$",  # '!' before '#' is id 0 in OpenAI's vocabulary: zeros inside a caption stay
    "!",
    "&amp; &lt;tag&gt; don't   stop\tbelieving\n",
    " ".join(f"word{n}" for n in range(200)),  # far past the context length: truncated, EOT kept
    "x" * 5000,
]


@pytest.fixture(scope="module")
def engine_text_inputs():
    from clip_flash.inputs.text.tokenizer import get_tokenizer

    return TextInputs(get_tokenizer("ViT-B-32"), 77, group_by_length=True, name="ViT-B-32")


def test_frontend_ids_are_the_engines(engine_text_inputs):
    """A frontend tokenizes with the (name, context length) the engine reports; padded back in the engine, the
    ids and usage counts are those of the engine tokenizing the strings itself, for every tricky caption."""
    from clip_flash.inputs.text.tokenizer import get_tokenizer

    name, context_length = engine_text_inputs.remote_spec
    frontend_tokenizer = get_tokenizer(name)  # what RemotePool._load_tokenizer loads
    payloads = token_bytes(frontend_tokenizer(TRICKY, context_length=context_length))
    assert all(type(payload) is bytes for payload in payloads)
    assert len(payloads[1]) < context_length * 4  # trimmed: a short caption travels short
    expected_tokens, expected_counts = engine_text_inputs.host(TRICKY)
    tokens, counts = engine_text_inputs.host(payloads)
    assert tokens.dtype == torch.long and torch.equal(tokens, expected_tokens)
    assert counts == expected_counts
    last = int(expected_tokens[3].nonzero().max())
    assert counts[0] == 2 and expected_tokens[3, :last].eq(0).any()  # an id 0 inside the caption
    assert expected_tokens[6, -1] != 0  # the long caption filled the context (truncated, ends with EOT)
    mixed = [payloads[0], TRICKY[1], payloads[2], TRICKY[3]] + payloads[4:]  # before a frontend has its tokenizer
    mixed_tokens, mixed_counts = engine_text_inputs.host(mixed)
    assert torch.equal(mixed_tokens, expected_tokens) and mixed_counts == expected_counts


def test_padded_tokens_refuses_rows_past_the_context():
    rows = torch.tensor([[5, 0, 7, 0], [1, 2, 3, 4], [0, 0, 0, 0]])
    payloads = token_bytes(rows)
    assert [len(payload) // 4 for payload in payloads] == [3, 4, 0]
    assert np.array_equal(padded_tokens(payloads, 4), rows.numpy())
    many = rows.repeat(7, 1)  # past SCATTER_FROM rows: the one-scatter path
    assert np.array_equal(padded_tokens(token_bytes(many), 4), many.numpy())
    for few_or_many in (payloads, payloads * 7):
        with pytest.raises(ValueError):
            padded_tokens(few_or_many, 3)


class _Outbox:
    def __init__(self):
        self.sent = []

    def send(self, message):
        self.sent.append(message)


class _Loop:
    def call_soon_threadsafe(self, function, *args):
        function(*args)


def _rows(values, errors=None) -> BatchRows:
    """A batch's rows: position p's raw vector is values[p] four times, its normalised one half that."""
    raw = np.repeat(np.asarray(values, dtype=np.float32)[:, None], 4, axis=1)
    return BatchRows(np.stack([raw, raw / 2]), [3] * len(values), errors or {})


def _run(request, indices):
    return QueuedInputs(request, list(indices), [b""] * len(indices))


def _frontend_and_engine():
    """A RemotePool (no socket) and the engine's FrontendConnection, wired by hand."""
    outbox = _Outbox()
    connection = FrontendConnection(_Loop(), outbox)
    pool = RemotePool("/nonexistent")
    return pool, connection, outbox


def _remote_request(connection, request_id, count, normalize=True):
    request = RemoteRequest(connection, request_id, deadline=1e18, arrival=0.0, normalize=normalize)
    request.texts = [_run(request, range(count))]
    request.pending = count
    connection.waiting[request_id] = request
    return request


def test_a_request_split_across_batches_completes_with_its_last_batch():
    pool, connection, outbox = _frontend_and_engine()
    loop = asyncio.new_event_loop()
    try:
        job = EmbeddingJob(loop, 3, deadline=1e18)
        other = EmbeddingJob(loop, 1, deadline=1e18)
        pool._jobs.update({10: job, 11: other})
        request, neighbour = _remote_request(connection, 10, 3), _remote_request(connection, 11, 1)
        # batch 1: input 2 of request 10 and request 11; batch 2: inputs 0 (an error) and 1 of request 10
        deliver_rows([_run(request, [2]), _run(neighbour, [0])], _rows([2.0, 9.0]))
        assert len(outbox.sent) == 1  # one message for the batch, both requests in it
        assert 10 in connection.waiting and 11 not in connection.waiting
        pool._receive(outbox.sent[0])
        assert not job.future.done() and other.future.done() and 11 not in pool._jobs
        deliver_rows([_run(request, [0, 1])], _rows([0.0, 1.0], {0: ItemError("bad caption")}))
        assert not connection.waiting
        pool._receive(outbox.sent[1])
        assert job.future.done() and not pool._jobs
        assert job.results[0].message == "bad caption"
        # only the vector a request asks for travels (here the normalised one, the default)
        assert job.results[1].normalized.tolist() == [0.5] * 4 and job.results[2].normalized.tolist() == [1.0] * 4
        assert job.results[1].raw is None
        assert job.results[2].tokens == 3 and other.results[0].normalized.tolist() == [4.5] * 4
    finally:
        loop.close()


def test_a_batchs_rows_reach_each_request_as_the_vector_it_asked_for():
    """One batch for a request that wants normalised vectors and one that wants raw features: each gets its own
    half of its rows, in its own input order, with its token counts and its errors."""
    pool, connection, outbox = _frontend_and_engine()
    loop = asyncio.new_event_loop()
    try:
        wants_normalized, wants_raw = EmbeddingJob(loop, 2, 1e18), EmbeddingJob(loop, 3, 1e18, normalize=False)
        pool._jobs.update({1: wants_normalized, 2: wants_raw})
        first, second = _remote_request(connection, 1, 2), _remote_request(connection, 2, 3, normalize=False)
        batch = [_run(second, [2]), _run(first, [1]), _run(second, [0]), _run(first, [0]), _run(second, [1])]
        both = np.arange(2 * len(batch) * 4, dtype=np.float32).reshape(2, len(batch), 4)  # raw, normalised
        rows = BatchRows(both, [5, 6, 7, 8, 9], {4: ItemError("bad caption")})
        deliver_rows(batch, rows)
        assert len(outbox.sent) == 1 and not connection.waiting
        pool._receive(outbox.sent[0])
        assert wants_normalized.future.done() and wants_raw.future.done()
        assert wants_normalized.results[1].normalized.tolist() == both[1, 1].tolist()
        assert wants_normalized.results[0].normalized.tolist() == both[1, 3].tolist()
        assert wants_normalized.results[0].raw is None and wants_normalized.results[0].tokens == 8
        assert wants_raw.results[2].raw.tolist() == both[0, 0].tolist() and wants_raw.results[2].normalized is None
        assert wants_raw.results[0].raw.tolist() == both[0, 2].tolist() and wants_raw.results[0].tokens == 7
        assert wants_raw.results[1].message == "bad caption"
    finally:
        loop.close()


def test_an_abandoned_requests_late_rows_are_ignored():
    pool, connection, outbox = _frontend_and_engine()
    loop = asyncio.new_event_loop()
    try:
        job = EmbeddingJob(loop, 2, deadline=1e18)
        pool._jobs[5] = job
        request = _remote_request(connection, 5, 2)
        # rows already packed (the batch was in flight) when the frontend gave up on the request
        late = pack_rows([5], [0], [0], [True], _rows([1.0]), [])
        pool._forget(5)
        pool._receive(late)
        assert job.results == [None, None] and not job.future.done()
        # the engine side hears of it: rows finished afterwards are not sent at all, and nothing is kept
        connection.abandon(5)
        assert request.abandoned and not connection.waiting
        deliver_rows([_run(request, [1])], _rows([2.0]))
        assert outbox.sent == []
    finally:
        loop.close()


def test_answer_threads_of_both_towers_settle_one_request_once_each():
    _, connection, outbox = _frontend_and_engine()
    request = _remote_request(connection, 1, 2000)
    halves = [range(1000), range(1000, 2000)]
    threads = [threading.Thread(target=lambda indices=indices: [deliver_rows([_run(request, [index])], _rows([0.0]))
                                                                   for index in indices]) for indices in halves]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert request.pending == 0 and not connection.waiting
    assert sum(len(message[1]) for message in outbox.sent) == 2000


def _samples(metrics: ServeMetrics):
    from prometheus_client.parser import text_string_to_metric_families

    text = metrics.render().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if not sample.name.endswith("_created")}


def test_aggregated_metrics_count_what_per_request_calls_count():
    rng = np.random.default_rng(0)
    direct, relayed_into = ServeMetrics(lambda tower: 0), ServeMetrics(lambda tower: 0)
    relayed = RelayedMetrics()
    routes = ["/v1/embeddings", "/v1/embeddings/image"]
    for n in range(3000):
        route, status = routes[n % 2], (200, 200, 400, 429, 503)[n % 5]
        seconds = float(rng.choice([1e-4, 5e-3, 0.1, 10.0, 30.0])) if n % 7 else float(rng.exponential(0.02))
        answer = None if n % 3 == 0 else seconds / 10
        for target in (direct, relayed):
            target.answered(route, status, seconds if n % 11 else None, answer)
            target.outcomes("text" if n % 2 else "image", n % 4, n % 3)
        if n % 500 == 499:  # taken every poll, as a frontend does
            relayed_into.apply(relayed.take())
    relayed_into.apply(relayed.take())
    relayed_into.apply(relayed.take())  # nothing new: adds nothing
    expected, got = _samples(direct), _samples(relayed_into)
    assert expected.keys() == got.keys()
    for key, value in expected.items():
        if key[0].endswith("_sum"):
            assert got[key] == pytest.approx(value, rel=1e-9), key
        else:
            assert got[key] == value, key  # counts and bucket counts exactly


def test_queue_waits_bucketed_at_once_match_observe():
    waits = [0.0, 1e-4, 1.0000001e-4, 3e-3, 0.25, 11.0] * 5
    one, many = ServeMetrics(lambda tower: 0), ServeMetrics(lambda tower: 0)
    for seconds in waits:
        one.queued("text", [seconds])
    many.queued("text", waits)
    expected, got = _samples(one), _samples(many)
    assert {k: v for k, v in got.items() if k[0].endswith("_bucket")} == \
        {k: v for k, v in expected.items() if k[0].endswith("_bucket")}


def test_engines_name_a_tokenizer_for_frontends_only_when_its_ids_are_reproducible():
    """``--inputs fast``: (get_tokenizer name, context length); stock OpenCLIP inputs or a loading engine:
    None, and frontends send the captions themselves."""
    from types import SimpleNamespace

    from clip_flash.serve.config import ServeConfig
    from clip_flash.serve.engine import READY, EnginePool

    pool = EnginePool(ServeConfig(model="ViT-B-32", device="cpu"))
    assert pool.text_tokenizer is None  # still loading
    engine = pool.engines[0]
    engine.state = READY
    engine.batchers = {"text": SimpleNamespace(inputs=TextInputs(None, 77, True, name="ViT-B-32"))}
    assert pool.text_tokenizer == ("ViT-B-32", 77)
    engine.batchers = {"text": SimpleNamespace(inputs=TextInputs(None, 77, True))}  # --inputs stock
    assert pool.text_tokenizer is None


class _Collecting(FrameProtocol):
    def __init__(self, capacity):
        super().__init__(capacity)
        self.calls = []

    def messages_received(self, messages):
        self.calls.append(list(messages))


def _feed(protocol, data, sizes):
    """The bytes as reads of the given sizes would bring them (each at most what ``get_buffer`` offers)."""
    position, turn = 0, 0
    while position < len(data):
        buffer = protocol.get_buffer(-1)
        size = min(sizes[turn % len(sizes)], len(buffer), len(data) - position)
        assert size > 0, "the protocol offered no room"
        buffer[:size] = data[position:position + size]
        protocol.buffer_updated(size)
        position += size
        turn += 1


@pytest.mark.parametrize("capacity, sizes", [(1 << 20, [1 << 20]), (64, [1, 3, 7]), (4096, [5000, 13, 2048]),
                                             (100, [37])])
def test_frame_protocol_reads_frames_however_the_reads_cut_them(capacity, sizes):
    """Frames split across reads, several in one read, larger than the buffer (it grows): every message once, in
    order, each read's complete frames in one call."""
    batches = [[("embed", [(n, 30.0, ([0], [bytes([n]) * (n * 997 % 20000)]), ([], []), True)])]
               for n in range(40)] + [[("state", 7)], [("abandon", 3), ("abandon", 4)]]
    data = b"".join(frame(batch) for batch in batches)
    protocol = _Collecting(capacity)
    _feed(protocol, data, sizes)
    assert [message for call in protocol.calls for message in call] == [m for batch in batches for m in batch]
    assert all(protocol.calls)  # no call without messages


def test_frame_protocol_refuses_an_empty_frame():
    protocol = _Collecting(64)
    with pytest.raises(ValueError, match="no bytes"):
        _feed(protocol, HEADER.pack(0), [4])
