"""Stamps at each hand-off of a request inside a running ``clip-flash serve``, in every process (the HTTP frontends and
the engine), for ``benchmarks/serve/handoff_trace.py``.

Python imports ``sitecustomize`` at start-up from the first directory on ``sys.path`` that has one, so with this
folder on ``PYTHONPATH`` every process of the server (spawned frontends and engines too) loads it. It does nothing
unless ``CLIP_FLASH_TRACE_DIR`` is set; then, as each server module is imported, it wraps the functions a request
passes through so that each records ``(label, time.perf_counter(), time.thread_time())`` (CLOCK_MONOTONIC on Linux:
one clock for every process of the host), and each process appends its new stamps to
``CLIP_FLASH_TRACE_DIR/stamps_<pid>.jsonl`` every second and at exit. A diagnostic: each stamp costs the wrapped call
a few microseconds.

Labels, in a request's order (``handoff_trace.py`` orders them by their median offset from ``arrive``):
``arrive``/``body_read`` (the route reads the body), ``submit``/``fe_flush`` (a frontend queues the request and sends
its frame), ``eng_frame`` (the engine process handles the frame), ``put`` (queued in the tower's batcher), ``taken``
(the collector closed a batch), ``host0``/``host1`` (the CPU step; inside it ``scan0``/``scan1``, the native scan,
``plan0``/``plan1`` and ``dct_plan0``/``dct_plan1``, the resize layout's and the JPEG kernels' plans,
``alloc0``/``alloc1``, the layout's page-locked head, and ``decode0``/``decode1``, the native decode),
``to_launch.put``/``launch.got`` (the hand-off to the launch thread, absent when the collector launches a lone batch),
``dev0``/``dev1`` (the device step), with an early launch (``--no-early-launch`` off) ``gate0``/``gate1`` (the host
gate's wait queued) and ``early_dev0``/``early_dev1`` (its device step, queued behind the gate while the CPU decodes),
inside either device step ``rows0``/``rows1`` (the extension's ``packed_rows`` call with its arguments' making),
``outcome.put``/``outcome.got`` (the CPU step's outcome handed to the launch thread), ``encoder0``/``encoder1`` (the
image encoder's call; inside it ``replay0``/``replay1``, the graph's replay with its copies in and out, and
``graph0``/``graph1``, torch's replay call where the extension's one call does not replay it),
``encoded`` (the encoder's launches returned), ``to_answer.put``/``answer.got`` (to the answer thread), ``deliver``
(the results are on the host), ``eng_deliver``/``eng_deliver_done``/``outbox_flush`` (packed for and written to the
frontend), ``fe_results`` (the frontend read them), ``respond``/``response_made`` (the route builds the response).
"""
import os
import sys

TRACE_DIR = os.environ.get("CLIP_FLASH_TRACE_DIR")

if TRACE_DIR:
    import atexit
    import functools
    import importlib.abc
    import inspect
    import json
    import threading
    import time

    _stamps = []

    def stamp(label):
        # With the thread's CPU time: a call whose stamps are far apart but whose thread ran little was waiting.
        _stamps.append((label, time.perf_counter(), time.thread_time()))

    def stamp_around(owner, name, before=None, after=None):
        """Replace ``owner.name`` by a wrapper stamping ``before`` it runs and ``after`` it returns."""
        original = getattr(owner, name)
        if inspect.iscoroutinefunction(original):
            @functools.wraps(original)
            async def wrapped(*args, **kwargs):
                if before:
                    stamp(before)
                result = await original(*args, **kwargs)
                if after:
                    stamp(after)
                return result
        else:
            @functools.wraps(original)
            def wrapped(*args, **kwargs):
                if before:
                    stamp(before)
                result = original(*args, **kwargs)
                if after:
                    stamp(after)
                return result
        setattr(owner, name, wrapped)

    def trace_app(module):
        stamp_around(module, "read_body", "arrive", "body_read")
        stamp_around(module, "embeddings_response", "respond")
        stamp_around(module, "json_response", None, "response_made")

    def trace_remote_pool(module):
        stamp_around(module.RemotePool, "submit", "submit")
        pack_pending = module.RemotePool._pack_pending

        def pack(self):
            if self._pending:
                stamp("fe_flush")
            return pack_pending(self)

        module.RemotePool._pack_pending = pack
        receive = module.RemotePool._receive

        def received(self, message):
            if message[0] == "results":
                stamp("fe_results")
            return receive(self, message)

        module.RemotePool._receive = received

    def trace_engine_server(module):
        stamp_around(module.EngineServer, "_embed", "eng_frame")
        stamp_around(module.FrontendConnection, "deliver_rows", "eng_deliver", "eng_deliver_done")

    def trace_wire(module):
        flush = module.Outbox._flush

        def flushed(self):
            if any(message[0] == "results" for message in self._messages):  # not the state polls' replies
                stamp("outbox_flush")
            return flush(self)

        module.Outbox._flush = flushed

    def stamp_queue(queue, put_label, got_label):
        put, get = queue.put, queue.get

        def stamped_put(item, *args, **kwargs):
            stamp(put_label)
            return put(item, *args, **kwargs)

        def stamped_get(*args, **kwargs):
            item = get(*args, **kwargs)
            stamp(got_label)
            return item

        queue.put, queue.get = stamped_put, stamped_get

    def trace_batcher(module):
        stamp_around(module.TowerBatcher, "put_locked", "put")
        stamp_around(module.TowerBatcher, "_take_locked", None, "taken")
        stamp_around(module, "encode_in_pieces", None, "encoded")
        stamp_around(module, "deliver_rows", "deliver")
        init = module.TowerBatcher.__init__

        def traced_init(self, *args, **kwargs):
            # the stage threads start inside __init__ and already wait in the queues' get: their first "got"
            # stamps are missing (the server's warm-up batches, which the table does not count)
            init(self, *args, **kwargs)
            stamp_queue(self._to_launch, "to_launch.put", "launch.got")
            stamp_queue(self._to_answer, "to_answer.put", "answer.got")

        module.TowerBatcher.__init__ = traced_init
        early_init = module._EarlyLaunch.__init__

        def traced_early_init(self, *args, **kwargs):
            early_init(self, *args, **kwargs)
            stamp_queue(self.outcome, "outcome.put", "outcome.got")

        module._EarlyLaunch.__init__ = traced_early_init

    def trace_inputs(module):
        stamp_around(module.FastImageInputs, "host", "host0", "host1")
        stamp_around(module.FastImageInputs, "device", "dev0", "dev1")
        stamp_around(module.FastImageInputs, "device_early", "early_dev0", "early_dev1")

    def trace_native_decode(module):
        stamp_around(module.NativeBatchDecoder, "decode", "decode0", "decode1")
        stamp_around(module.NativeBatchDecoder, "scan", "scan0", "scan1")

    def trace_native_batch(module):
        stamp_around(module, "plan_batch", "plan0", "plan1")
        stamp_around(module, "plan_dct_batch", "dct_plan0", "dct_plan1")

    def trace_capture(module):
        stamp_around(module.CaptureSpace, "replay", "replay0", "replay1")
        stamp_around(module.torch.cuda.CUDAGraph, "replay", "graph0", "graph1")

    def trace_host_gate(module):
        stamp_around(module.HostGate, "wait", "gate0", "gate1")

    def trace_image_resample(module):
        stamp_around(module.BatchPlan, "allocate_host", "alloc0", "alloc1")
        stamp_around(module, "_packed_rows", "rows0", "rows1")

    def trace_encoder(module):
        stamp_around(module.GraphedEncoder, "encode_image", "encoder0", "encoder1")

    TRACED_MODULES = {
        "clip_flash.serve.app": trace_app,
        "clip_flash.serve.remote_pool": trace_remote_pool,
        "clip_flash.serve.engine_server": trace_engine_server,
        "clip_flash.serve.wire": trace_wire,
        "clip_flash.serve.batcher": trace_batcher,
        "clip_flash.serve.inputs": trace_inputs,
        "clip_flash.inputs.image.native_decode": trace_native_decode,
        "clip_flash.inputs.image.native_batch": trace_native_batch,
        "clip_flash.graphs.capture": trace_capture,
        "clip_flash.ops.host_gate": trace_host_gate,
        "clip_flash.ops.image_resample": trace_image_resample,
        "clip_flash.graphs.encoder": trace_encoder,
    }

    class TracingFinder(importlib.abc.MetaPathFinder):
        """Finds the traced modules through the other finders and wraps their functions once executed."""

        def find_spec(self, fullname, path, target=None):
            if fullname not in TRACED_MODULES:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
            exec_module = spec.loader.exec_module

            def traced_exec(module):
                exec_module(module)
                TRACED_MODULES[fullname](module)

            spec.loader.exec_module = traced_exec
            return spec

    sys.meta_path.insert(0, TracingFinder())

    _written = [0]
    _writing = threading.Lock()

    def write_stamps():
        # Appends only the stamps since the last write: re-serializing every stamp each second holds the GIL for a
        # time that grows with the run (traced runs' p99 at 50 req/s was 11-69 ms, untraced runs' 7-9).
        with _writing:
            fresh = _stamps[_written[0]:]
            if fresh:
                with open(os.path.join(TRACE_DIR, f"stamps_{os.getpid()}.jsonl"), "a") as out:
                    out.write("".join(json.dumps(entry) + "\n" for entry in fresh))
                _written[0] += len(fresh)

    def write_every_second():
        while True:  # a process killed at the end of a run still leaves its stamps up to the last second
            time.sleep(1.0)
            write_stamps()

    atexit.register(write_stamps)
    threading.Thread(target=write_every_second, daemon=True, name="handoff-trace-writer").start()
