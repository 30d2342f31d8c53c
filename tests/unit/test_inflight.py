"""The leader's in-flight count (`lockstep_sglang.inflight`): what a drain waits for.

The middleware in front of a real FastAPI app, over HTTP semantics (httpx's ASGI transport).
The drain drills use it through the stand-in's and SGLang's apps."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from lockstep_sglang.inflight import InflightCounter, InflightMiddleware

pytestmark = pytest.mark.unit


def _app(counter: InflightCounter, release: asyncio.Event) -> FastAPI:
    app = FastAPI()
    app.add_middleware(InflightMiddleware, counter=counter)

    @app.post("/generate")
    async def generate() -> StreamingResponse:
        async def chunks():  # type: ignore[no-untyped-def]
            yield b"first token "
            await release.wait()
            yield b"last token"

        return StreamingResponse(chunks())

    @app.post("/v1/completions")
    async def completions() -> JSONResponse:
        await release.wait()
        return JSONResponse({"ok": True})

    @app.post("/broken")
    async def broken() -> JSONResponse:
        raise RuntimeError("boom")

    @app.get("/health")
    async def health() -> JSONResponse:
        await release.wait()
        return JSONResponse({})

    return app


def test_a_streamed_generation_counts_until_its_last_chunk_and_gets_do_not_count() -> None:
    async def scenario() -> list[int]:
        counter, release = InflightCounter(), asyncio.Event()
        transport = httpx.ASGITransport(app=_app(counter, release), raise_app_exceptions=False)
        seen = []
        async with httpx.AsyncClient(transport=transport, base_url="http://leader") as client:
            stream = asyncio.create_task(client.post("/generate"))
            plain = asyncio.create_task(client.post("/v1/completions"))
            health = asyncio.create_task(client.get("/health"))
            await asyncio.sleep(0.05)
            seen.append(counter.value)  # two POSTs held, the GET not counted
            release.set()
            for task in (stream, plain, health):
                (await task).raise_for_status()
            seen.append(counter.value)
            (await client.post("/broken")).status_code  # noqa: B018
            seen.append(counter.value)  # a failed request does not leak a count
        return seen

    assert asyncio.run(scenario()) == [2, 0, 0]
