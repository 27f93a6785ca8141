"""The job queue over HTTP (Quart): ``python -m examples.jobqueue.app STATE_DIR [--port N]``.

    POST /jobs              {"key", "payload"}        201 created, 200 a repeat of the key
    POST /leases            {"leaseSeconds"}          200 {"job", "leaseToken"}, 204 nothing due
    POST /jobs/<id>/ack     {"leaseToken"}            200, 409 lease_lost
    POST /jobs/<id>/nack    {"leaseToken", "error"}   200 (ready again after a backoff, or dead)
    GET  /jobs[?state=ready|leased|done|dead]         200 {"items": [...]}

Errors are ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import argparse
from typing import Annotated, Any, Literal

import msgspec
from quart import Quart, request

from afterword.errors import CallerError, StateError

from .queue import Job, JobQueue, QueueError

STATUS = {"invalid_request": 400, "not_found": 404, "lease_lost": 409, "key_reused": 409, "too_large": 413}
STATUS["state_corrupt"] = 503


class EnqueueBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    key: str
    payload: msgspec.Raw


class LeaseBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    lease_seconds: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 30.0


class SettleBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    lease_token: int
    error: str = ""


def view(job: Job) -> dict[str, Any]:
    payload = msgspec.json.decode(job.payload) if job.payload else None
    return {"id": job.id, "key": job.key, "state": job.state, "attempts": job.attempts} | {
        "dueMs": job.due_ms,
        "error": job.error,
        "payload": payload,
    }


def error(code: str, message: str, status: int) -> tuple[dict[str, Any], int]:
    return {"error": {"code": code, "message": message}}, status


def create_app(path: str, **queue_options: Any) -> Quart:
    app = Quart(__name__)
    app.config["MAX_CONTENT_LENGTH"] = 128 * 1024
    held: list[JobQueue] = []

    @app.before_serving
    async def open_queue() -> None:
        held.append(JobQueue.open(path, **queue_options))  # takes the ownership lock

    @app.after_serving
    async def close_queue() -> None:
        held.pop().close()

    async def body(kind: type[Any]) -> Any:
        return msgspec.json.decode(await request.get_data(), type=kind)

    @app.errorhandler(msgspec.ValidationError)
    @app.errorhandler(msgspec.DecodeError)
    async def bad_body(exc: Exception) -> tuple[dict[str, Any], int]:
        return error("invalid_request", f"bad body: {exc}", 400)

    @app.errorhandler(QueueError)
    async def refused(exc: QueueError) -> tuple[dict[str, Any], int]:
        return error(exc.code, str(exc), STATUS[exc.code])

    @app.errorhandler(CallerError)
    @app.errorhandler(StateError)
    async def store_refused(exc: Exception) -> tuple[dict[str, Any], int]:
        # A full or failed disk, a closed store: the queue cannot write; try again later.
        return error("unavailable", type(exc).__name__, 503)

    @app.post("/jobs")
    async def enqueue() -> Any:
        b = await body(EnqueueBody)
        job, created = await held[0].enqueue(b.key, bytes(b.payload))
        return view(job), 201 if created else 200

    @app.post("/leases")
    async def lease() -> Any:
        got = await held[0].lease(int((await body(LeaseBody)).lease_seconds * 1000))
        return ("", 204) if got is None else {"job": view(got[0]), "leaseToken": got[1]}

    @app.post("/jobs/<jid>/ack")
    async def ack(jid: str) -> Any:
        return view(await held[0].ack(jid, (await body(SettleBody)).lease_token))

    @app.post("/jobs/<jid>/nack")
    async def nack(jid: str) -> Any:
        b = await body(SettleBody)
        return view(await held[0].nack(jid, b.lease_token, b.error[:500]))

    @app.get("/jobs")
    async def jobs() -> Any:
        state = msgspec.convert(request.args.get("state"), Literal["ready", "leased", "done", "dead"] | None)
        return {"items": [view(j) for j in held[0].list_jobs(state)]}

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m examples.jobqueue.app")
    parser.add_argument("state_dir")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    create_app(args.state_dir).run(host="127.0.0.1", port=args.port)
