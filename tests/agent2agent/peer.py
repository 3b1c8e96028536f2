"""A third-party A2A agent for the tests, written with `fasta2a` (pydantic's implementation of the
protocol, independent of a2a-sdk): run as `python peer.py PORT [TOKEN]` and served by uvicorn on
127.0.0.1. With TOKEN it refuses (401) any JSON-RPC request without `Authorization: Bearer TOKEN`.

It echoes: "echo: <text>" as the task's artifact. A message starting with "slow" leaves its task
working until it is cancelled (the in-memory broker runs operations one at a time, so the task is
left running rather than awaited); "later N" finishes N seconds later."""
from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass

import uvicorn
from fasta2a import FastA2A, Worker
from fasta2a.broker import InMemoryBroker
from fasta2a.storage import InMemoryStorage
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse


@dataclass
class EchoWorker(Worker):
    async def run_task(self, params) -> None:
        text = " ".join(p.get("text", "") for p in params["message"].get("parts", []))
        await self.storage.update_task(params["id"], state="working")
        if text.startswith("slow"):
            return
        if text.startswith("later"):  # finished a moment later, in the background (the broker is not held)
            import asyncio

            asyncio.get_running_loop().create_task(self._finish_later(params, text))
            return
        artifact = {"artifact_id": uuid.uuid4().hex, "name": "echo", "parts": [{"text": f"echo: {text}"}]}
        await self.publish_artifact(params["id"], params["context_id"], artifact)
        await self.storage.update_task(params["id"], state="completed", new_artifacts=[artifact])

    async def _finish_later(self, params, text: str) -> None:
        import asyncio

        await asyncio.sleep(float(text.split()[1]))
        artifact = {"artifact_id": uuid.uuid4().hex, "name": "echo", "parts": [{"text": f"echo: {text}"}]}
        await self.storage.update_task(params["id"], state="completed", new_artifacts=[artifact])

    async def cancel_task(self, params) -> None:
        await self.storage.update_task(params["id"], state="canceled")

    def build_message_history(self, history):
        return history

    def build_artifacts(self, result):
        return []


class BearerOnly(BaseHTTPMiddleware):
    def __init__(self, app, token: str) -> None:
        super().__init__(app)
        self.token = token

    async def dispatch(self, request, call_next):
        if request.url.path.startswith("/.well-known/"):  # the card is public; the agent is not
            return await call_next(request)
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        return await call_next(request)


def main() -> None:
    port, token = int(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "")
    storage, broker = InMemoryStorage(), InMemoryBroker()
    worker = EchoWorker(broker=broker, storage=storage)
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        async with app.task_manager:
            async with worker.run():
                yield

    app = FastA2A(storage=storage, broker=broker, name="echo-peer", description="Echoes what it is sent (fasta2a)",
                  url=f"http://127.0.0.1:{port}/", lifespan=lifespan,
                  middleware=[Middleware(BearerOnly, token=token)] if token else None)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
