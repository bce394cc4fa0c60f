"""The engine's asyncio front end: requests arrive in real time, each gets a stream of tokens.

``AsyncEngine`` runs ``LLMEngine.step`` in the event loop's own thread, one step after another while any
request is unfinished, and lets the loop run between two steps: requests that arrived during a step are
taken in then, and the step's tokens are handed to their streams then (a step joins new requests only at
its start anyway). Running the step in a second thread would let the two threads fight over Python's
interpreter lock: the loop's work on the streams then lengthens every step. ``generate`` adds a request
and yields its tokens as the steps produce them; a client that stops reading (a closed connection)
aborts its request, and its blocks return to the pool at the next step. A stream's tokens wait in its
queue until they are read, however slowly; once its request has ended, the queue is the stream's alone
(the front end lets go of it, so a stream never read is freed with its last reference).

When nothing can run, the front end waits for what can change that. On a real clock it looks again
shortly (a batching window may close meanwhile). On a virtual clock (``LLMEngine.virtual``) it moves the
clock to the end of the earliest window (``LLMEngine.next_wake``), as ``LLMEngine.run`` does, or else
waits for a request, an abort or ``close``. A static batch (``policy="static"``) starts only when
``max_num_seqs`` requests wait or no more requests will come, and only the clients know the latter:
``close()`` says so, after which the waiting batch starts and no request is taken any more. A batch that
never fills would wait for ever in a front end that is never closed, so a static front end is refused unless
made with ``until_close=True`` by a client that will call ``close()`` (``open_loop`` does, after a workload's
last request); a server that is never closed wants the dynamic policy, the static one with a deadline
(``max_wait``). Closed, with requests waiting that nothing can admit, the front end stops with
``LLMEngine.stuck``'s error.

``open_loop`` is a benchmark client: it sends each request of a workload at its arrival time, whatever
the engine is doing (open loop: a slow engine does not slow the arrivals), and stamps each request's
arrival at the time it was due, so a late event loop cannot hide queueing from the latencies. It runs
in real time, so it refuses an engine on a virtual clock (``lib.engine.replay`` is the offline client).

Chapters: 8.
"""

from __future__ import annotations

import asyncio

from lib.engine.config import SamplingParams
from lib.engine.engine import LLMEngine, VirtualClock


class AsyncEngine:
    """``engine`` served to coroutines (see the module). Use as ``async with AsyncEngine(engine) as a: ...``.
    ``until_close``: the static policy is served only with it, by a client that calls ``close()``."""

    def __init__(self, engine: LLMEngine, *, until_close: bool = False):
        if engine.scheduler.policy.kind == "static" and not until_close:
            raise ValueError(
                "a static batch starts only when max_num_seqs requests wait or no more will come, and a front end "
                "takes requests until close(): a batch that never fills would wait for ever. Use the dynamic policy "
                "(policy='dynamic' with max_wait, a static batch with a deadline), or, for a client that calls "
                "close() after its last request, AsyncEngine(engine, until_close=True)")
        self.engine = engine
        self._streams: dict[int, asyncio.Queue] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._stop = False
        self._closed = False
        self.error: BaseException | None = None
        engine.on_events(self._deliver)

    async def __aenter__(self) -> AsyncEngine:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc) -> None:
        self._stop = True
        self._wake.set()
        await self._task

    def close(self) -> None:
        """No more requests will come: a batch or a batching window stops waiting for more
        (``LLMEngine.close``), and ``submit`` refuses new requests from now on."""
        self._closed = True
        self.engine.close()
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        e = self.engine
        virtual = isinstance(e.clock, VirtualClock)
        while not self._stop:
            if not e.unfinished:
                await self._wake.wait()
                self._wake.clear()
                continue
            try:
                made = e.step()
                idle = not made and not e.scheduler.running
                wake = e.next_wake() if idle else None
                if idle and wake is None and e.scheduler.arrivals_done and e.unfinished == e.scheduler.queued:
                    e.stuck()  # closed: no request will come to start a batch, and none of those waiting fits
            except BaseException as err:  # a failed step ends every stream with the error, never silently
                self.error = err
                for q in self._streams.values():
                    q.put_nowait(err)
                self._streams.clear()
                raise
            # let the loop run before the next step: the streams' tokens, and the requests due during this step.
            # Yield twice: a timer that came due during the step is queued behind this task's own wake-up, so
            # after one yield the next step would start before that request is added, and it would wait a
            # whole extra step. If nothing ran, wait as the module says.
            if not idle:
                await asyncio.sleep(0)
                await asyncio.sleep(0)
            elif not virtual:
                await asyncio.sleep(0.0005)
            elif wake is not None:
                e.clock.advance_to(wake)
                await asyncio.sleep(0)
            elif e.unfinished == e.scheduler.queued:  # only a new request, an abort or close() changes anything
                await self._wake.wait()
                self._wake.clear()
            else:  # requests were added during the step: take them in
                await asyncio.sleep(0)

    def _deliver(self, events: list) -> None:
        for rid, token, finished in events:
            q = self._streams.get(rid)
            if q is not None:
                q.put_nowait((token, finished))
                if finished:  # the stream keeps the queue: its reader still gets every token
                    del self._streams[rid]

    def submit(self, prompt, sampling: SamplingParams | None = None, *, kind: str = "",
               arrival: float | None = None) -> Stream:
        """Add a request (``LLMEngine.add_request``: its errors are raised here) and return its ``Stream``."""
        if self.error is not None:
            raise RuntimeError("the engine stopped on an error") from self.error
        if self._wake is None or self._stop:
            raise RuntimeError("the front end is not running: submit inside `async with AsyncEngine(engine) as a:`")
        if self._closed:
            raise RuntimeError("the front end was closed (close()): it takes no more requests")
        rid = self.engine.add_request(prompt, sampling, kind=kind, arrival=arrival)
        q = self._streams[rid] = asyncio.Queue()
        self._wake.set()
        return Stream(self, rid, q)

    async def generate(self, prompt, sampling: SamplingParams | None = None, *, kind: str = "",
                       arrival: float | None = None):
        """Add a request and yield its tokens as they come; leaving the loop early aborts the request."""
        async for token in self.submit(prompt, sampling, kind=kind, arrival=arrival):
            yield token

    def _close(self, rid: int, done: bool) -> None:
        self._streams.pop(rid, None)
        if not done:
            self.engine.abort(rid)
            self._wake.set()


class Stream:
    """One request's tokens, in order, as an async iterator; ``id`` is its engine request id. Closing the
    iterator before the last token (``aclose``, or leaving an ``async for``) aborts the request."""

    def __init__(self, owner: AsyncEngine, rid: int, q: asyncio.Queue):
        self.owner, self.id, self._q = owner, rid, q

    async def __aiter__(self):
        done = False
        try:
            while not done:
                item = await self._q.get()
                if isinstance(item, BaseException):
                    raise RuntimeError("the engine stopped on an error") from item
                token, done = item
                if token >= 0:
                    yield token
        finally:
            self.owner._close(self.id, done)


async def open_loop(aengine: AsyncEngine, workload: list[dict], prompts: list[list[int]], *, sampling=None,
                    close: bool | None = None) -> dict:
    """Send request i of ``workload`` ({"id", "arrival", "output", "kind"}) with the tokens ``prompts[i]`` at
    its arrival time (seconds from now), asking for exactly its ``output`` tokens (``sampling(r)`` to
    choose otherwise). Returns {"tokens": {workload id: tokens received}, "results": the finished
    requests' metrics (``LLMEngine.results``) under their workload ids, arrivals relative to the start,
    "start": the start on the engine's clock, "ids": {engine request id: workload id}}. The arrivals are
    stamped when they were due (or when sent, if the event loop's timer fired a hair early). ``close``:
    close the front end after the workload's last request, its arrivals all in (as the simulator knows
    they are); None: only under the static policy, whose last batch would otherwise wait for ever (its front
    end is made with ``until_close=True``)."""
    clock = aengine.engine.clock
    if isinstance(clock, VirtualClock):
        raise ValueError("open_loop sends requests in real time, but this engine runs on a virtual clock: run the "
                         "workload through lib.engine.replay instead")
    if close is None:
        close = aengine.engine.scheduler.policy.kind == "static"
    start = clock()
    got, ids = {}, {}
    unsent = [len(workload)]

    async def one(i: int, r: dict):
        due = start + r["arrival"]
        await asyncio.sleep(max(0.0, due - clock()))
        sp = sampling(r) if sampling else SamplingParams(max_tokens=r["output"], ignore_eos=True)
        stream = aengine.submit(prompts[i], sp, kind=r.get("kind", ""), arrival=min(due, clock()))
        ids[stream.id] = r["id"]
        unsent[0] -= 1
        if close and not unsent[0]:
            aengine.close()
        got[r["id"]] = [t async for t in stream]

    await asyncio.gather(*(one(i, r) for i, r in enumerate(workload)))
    results = [{**r, "id": ids[r["id"]], "arrival": r["arrival"] - start} for r in aengine.engine.results()
               if r["id"] in ids]
    return {"tokens": got, "results": sorted(results, key=lambda r: r["id"]), "start": start, "ids": ids}
