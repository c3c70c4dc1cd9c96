"""AsyncEngine without HTTP: outputs equal the offline engine's, refusals stay per request, a failed step
fails its requests and the thread lives on, limits answer 429/503, shutdown drains or aborts."""
from __future__ import annotations

import asyncio

import pytest

from hyspec.engine.engine import LLMEngine
from hyspec.engine.sampling_params import SamplingParams
from hyspec.errors import RequestError
from hyspec.server.async_engine import (AsyncEngine, EngineStepError, RequestAbortedError, ServerBusyError,
                                        ServiceUnavailableError)
from tests.server.conftest import ENGINE_ARGS

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
LONG = SamplingParams(temperature=0, max_tokens=80, ignore_eos=True)


@pytest.fixture
def engine(tiny_model_dir):
    return LLMEngine(tiny_model_dir, **ENGINE_ARGS)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def offline(engine, prompt, params):
    seq = engine.add_request(prompt, params)
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == seq.request_id and out.finished:
                final = out
    return final.outputs[0].token_ids


def pool_empty(engine):
    return engine.pool.num_free == engine.pool.num_pages


async def collect(stream):
    ids, text, last = [], "", None
    async for out in stream:
        ids += out.new_token_ids
        text += out.new_text
        last = out
    return ids, text, last


def test_concurrent_streams_equal_offline_runs_and_deltas_add_up(engine):
    prompts = ["def add(a, b):", "import os\n", "class Foo:", "x = ["]
    expected = [offline(engine, p, GREEDY) for p in prompts]

    async def main():
        ae = AsyncEngine(engine)
        streams = [await ae.add_request(p, GREEDY) for p in prompts]
        results = await asyncio.gather(*(collect(s) for s in streams))
        assert ae.num_in_flight == 0
        await ae.shutdown(5)
        return streams, results

    streams, results = run(main())
    for want, (ids, text, last), stream in zip(expected, results, streams):
        assert ids == want == last.outputs[0].token_ids
        assert text == last.outputs[0].text and last.finished
        assert stream.finish_reason == "length" and stream.num_output_tokens == len(want)
        assert stream.first_token_time is not None and stream.finish_time >= stream.first_token_time
    assert pool_empty(engine)


def test_a_refused_request_fails_alone(engine):
    async def main():
        ae = AsyncEngine(engine)
        good = await ae.add_request("def add(a, b):", GREEDY)
        with pytest.raises(RequestError, match="max_model_len"):
            await ae.add_request({"prompt_token_ids": [5] * engine.max_model_len}, GREEDY)
        ids, _, _ = await collect(good)
        await ae.shutdown(5)
        return ids, ae.num_in_flight

    ids, in_flight = run(main())
    assert len(ids) == GREEDY.max_tokens and in_flight == 0


def test_a_failing_step_fails_its_requests_with_500_and_the_engine_keeps_serving(engine):
    real_step, calls = engine.step, {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("boom in the forward")
        return real_step()

    engine.step = flaky_step

    async def main():
        ae = AsyncEngine(engine)
        doomed = await ae.add_request("def add(a, b):", LONG)
        with pytest.raises(EngineStepError, match="boom in the forward"):
            await collect(doomed)
        assert doomed.finish_reason == "error"
        after = await ae.add_request("import os\n", GREEDY)
        ids, _, _ = await collect(after)
        stats = ae.stats
        await ae.shutdown(5)
        return ids, stats, ae.failed

    ids, stats, failed = run(main())
    assert len(ids) == GREEDY.max_tokens and failed is None
    assert stats.num_step_failures == 1 and pool_empty(engine)


def test_queue_limit_answers_busy_and_shutdown_refuses_new_requests(engine):
    async def main():
        ae = AsyncEngine(engine, max_queue=1)
        ae.capacity = 2  # two slots, whatever max_num_seqs says
        first = await ae.add_request("a", LONG)
        second = await ae.add_request("b", LONG)
        with pytest.raises(ServerBusyError, match="capacity"):
            await ae.add_request("c", GREEDY)
        first.abort()
        second.abort()
        ae.begin_shutdown()
        with pytest.raises(ServiceUnavailableError, match="shutting down"):
            await ae.add_request("d", GREEDY)
        await ae.shutdown(5)

    run(main())
    assert pool_empty(engine)


def test_abort_frees_kv_at_once(engine):
    async def main():
        ae = AsyncEngine(engine)
        stream = await ae.add_request("def add(a, b):", LONG)
        await stream.__anext__()
        stream.abort()
        with pytest.raises(RequestAbortedError):
            while True:
                await stream.__anext__()
        for _ in range(200):  # the engine thread applies the abort between steps
            if pool_empty(engine):
                break
            await asyncio.sleep(0.01)
        await ae.shutdown(5)
        return stream

    stream = run(main())
    assert stream.finish_reason == "abort" and stream.num_output_tokens < LONG.max_tokens
    assert pool_empty(engine) and not engine.has_unfinished_requests()


def test_shutdown_drains_in_flight_requests(engine):
    async def main():
        ae = AsyncEngine(engine)
        streams = [await ae.add_request(p, GREEDY) for p in ("x", "y", "z")]
        readers = [asyncio.ensure_future(collect(s)) for s in streams]
        await ae.shutdown(30)
        assert not ae.thread_alive
        return [len((await r)[0]) for r in readers]

    assert run(main()) == [GREEDY.max_tokens] * 3
    assert pool_empty(engine)


def test_shutdown_timeout_aborts_what_is_left(engine):
    real_step = engine.step

    def slow_step():
        import time
        time.sleep(0.02)
        return real_step()

    engine.step = slow_step

    async def main():
        ae = AsyncEngine(engine)
        stream = await ae.add_request("def add(a, b):", LONG)
        reader = asyncio.ensure_future(collect(stream))
        await ae.shutdown(0.2)
        with pytest.raises(RequestAbortedError, match="shut down"):
            await reader
        return ae

    ae = run(main())
    assert not ae.thread_alive and pool_empty(engine)


def test_driven_on_the_callers_thread_the_engine_steps_there(engine):
    """hyspec serve steps the engine on its main thread (the OpenMP pool's owner), the event loop elsewhere."""
    import threading

    expected = offline(engine, "def add(a, b):", GREEDY)
    stepped_on: set[int] = set()
    step = engine.step

    def recording_step():
        stepped_on.add(threading.get_ident())
        return step()

    engine.step = recording_step
    ae = AsyncEngine(engine)
    results = {}

    def event_loop_thread():
        async def main():
            ae.start()
            assert ae.started and ae.thread_alive and ae._thread is None  # no engine thread of its own
            results["ids"], _, _ = await collect(await ae.add_request("def add(a, b):", GREEDY))
            await ae.shutdown(5)

        asyncio.run(main())

    loop_thread = threading.Thread(target=event_loop_thread)
    ae.claim_driver()  # before the loop thread can reach start(), as hyspec serve does
    loop_thread.start()
    ae.drive_on_this_thread(keep_waiting=loop_thread.is_alive)  # returns once shutdown() stopped it
    loop_thread.join(10)
    assert results["ids"] == expected
    assert stepped_on == {threading.get_ident()}
    assert not ae.thread_alive and pool_empty(engine)


def test_a_driver_returns_when_the_event_loop_never_starts(engine):
    ae = AsyncEngine(engine)
    ae.drive_on_this_thread(keep_waiting=lambda: False)  # e.g. uvicorn died binding its port
    assert not ae.started
    with pytest.raises(RuntimeError, match="before start"):
        async def bind_then_drive():
            ae.start()
            ae.drive_on_this_thread(keep_waiting=lambda: False)

        run(bind_then_drive())
