"""Channel adapters: post one chunk natively and return its receipt, or say why not.

Contract of ``post``: return a :class:`ChunkReceipt` only when the channel confirmed the post;
raise :class:`RetryableDeliveryError` or :class:`PermanentDeliveryError` only when nothing was
posted. Anything else (a timeout, a dropped connection after sending) is an unknown outcome.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Protocol

import anyio
import httpx
import msgspec

from ..continuations.rules import format_ms
from ..disk import Disk, OsDisk
from ..protocol.headers import sendable_header_name, sendable_header_value
from .errors import PermanentDeliveryError, RetryableDeliveryError, UnconfirmedDeliveryError
from .outbox import OutboxFailed, OutboxFile, OutboxNotWritten, OutboxUnsynced


class ChunkDelivery(msgspec.Struct, frozen=True, kw_only=True):
    delivery_key: str  # stable per continuation and chunk: "<id>:<index>"
    conversation_id: str
    chunk_index: int
    chunk_count: int
    text: str


class ChunkReceipt(msgspec.Struct, frozen=True, kw_only=True):
    delivery_id: str
    channel_id: str | None = None


class Channel(Protocol):
    max_chunk_chars: int

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt: ...


class ReconcilingChannel(Channel, Protocol):
    """A channel that can prove whether a chunk was posted, by its delivery key.

    Declared with ``can_reconcile = True``. After a crash in the middle of a delivery the
    worker asks it instead of declaring the outcome unknown, and its ``post`` must be a no-op
    returning the same receipt for a key it already holds. Adapters without the attribute
    (Slack, webhook, most embedded ones) cannot reconcile.
    """

    can_reconcile: bool

    async def lookup(self, delivery_keys: Sequence[str]) -> Mapping[str, ChunkReceipt]: ...


def can_reconcile(channel: object) -> bool:
    return getattr(channel, "can_reconcile", False) is True and callable(getattr(channel, "lookup", None))


def split_chunks(text: str, limit: int) -> list[str]:
    """Split at paragraph, line or word boundaries where possible; never drop characters."""
    if len(text) <= limit:
        return [text]
    chunks: list[str] = []
    rest = text
    while len(rest) > limit:
        window = rest[:limit]
        cut = max(window.rfind("\n\n"), window.rfind("\n"), window.rfind(" "))
        if cut <= limit // 2:
            cut = limit
        chunks.append(rest[:cut])
        rest = rest[cut:]
    if rest:
        chunks.append(rest)
    return chunks


class OutboxLine(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    delivery_key: str
    conversation_id: str
    chunk_index: int
    chunk_count: int
    text: str
    delivered_at: str


class OutboxChannel:
    """The embedded default: one fsynced JSON line per delivered chunk.

    The outbox is afterword's own file, so it can answer "was this chunk posted?": it keeps
    an index of the delivery keys its file holds (``can_reconcile``). A post whose key is
    already there writes nothing and returns the same receipt, so after a crash the worker
    can look each interrupted chunk up and post only what is missing. Concurrent posts share
    one write and one fdatasync (:class:`~afterword.worker.outbox.OutboxFile`); each returns
    only after the fdatasync covering its line.
    """

    max_chunk_chars = 4000
    can_reconcile = True

    def __init__(self, path: str, *, disk: Disk | None = None) -> None:
        self.file = OutboxFile(path, disk or OsDisk())
        self.path = self.file.path
        self._encoder = msgspec.json.Encoder()

    async def lookup(self, delivery_keys: Sequence[str]) -> dict[str, ChunkReceipt]:
        """The receipts of the chunks the outbox holds, by delivery key (absent: not posted)."""
        present = await anyio.to_thread.run_sync(self.file.present, delivery_keys)
        return {k: ChunkReceipt(delivery_id=k, channel_id="outbox") for k in delivery_keys if k in present}

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        line = OutboxLine(
            delivery_key=delivery.delivery_key,
            conversation_id=delivery.conversation_id,
            chunk_index=delivery.chunk_index,
            chunk_count=delivery.chunk_count,
            text=delivery.text,
            delivered_at=format_ms(time.time_ns() // 1_000_000),  # the wall clock, as the service's
        )
        data = self._encoder.encode(line) + b"\n"
        try:
            await self.file.append(delivery.delivery_key, data)
        except (OutboxNotWritten, OutboxFailed) as exc:  # nothing was written for this post
            raise RetryableDeliveryError("outbox_io", f"outbox write failed: {exc}") from None
        except OutboxUnsynced as exc:
            # The line may be in the file, but its fdatasync did not succeed: unproven.
            raise UnconfirmedDeliveryError(f"outbox write or sync failed: {exc}", "outbox_unsynced") from None
        return ChunkReceipt(delivery_id=delivery.delivery_key, channel_id="outbox")


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


# The most of a channel's answer that is read: a receipt needs a few fields, and a huge
# answer must not cost memory per post in flight. Compressed answers are not asked for, so
# the bound counts the bytes as they arrive.
MAX_ANSWER_BYTES = 256 * 1024


def _request(
    client: httpx.AsyncClient, url: str, body: Mapping[str, object], headers: dict[str, str]
) -> httpx.Request:
    """The request, complete before any connection is opened.

    Anything wrong with it (a header no HTTP client can send, text that cannot be encoded)
    shows here, while provably nothing has left the process: a permanent, definite failure,
    never an unknown outcome.
    """
    for name, value in headers.items():
        if not (sendable_header_name(name) and sendable_header_value(value)):
            # The value stays out of the message: it may be a credential.
            raise PermanentDeliveryError(
                "unsendable_request", f"header {name!r} cannot be sent; nothing was posted"
            )
    try:
        return client.build_request(
            "POST", url, json=body, headers={**headers, "Accept-Encoding": "identity"}
        )
    except (ValueError, TypeError, httpx.HTTPError) as exc:  # UnicodeError is a ValueError
        raise PermanentDeliveryError(
            "unsendable_request", f"the request could not be built ({type(exc).__name__}); nothing was posted"
        ) from None


async def _send(
    client: httpx.AsyncClient, request: httpx.Request, who: str
) -> tuple[httpx.Response, bytes | None]:
    """Send and read at most :data:`MAX_ANSWER_BYTES` of the answer.

    The body is ``None`` when it was longer, content-encoded or broken off: the status still
    counts, only the fields a receipt would take from the body are missing.
    """
    try:
        response = await client.send(request, stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout):  # nothing was sent
        raise RetryableDeliveryError("connect_failed", f"could not connect to {who}") from None
    try:
        if response.headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity"):
            return response, None
        data = bytearray()
        async for part in response.aiter_raw():
            data += part
            if len(data) > MAX_ANSWER_BYTES:
                return response, None  # closing the response drops the rest unread
        return response, bytes(data)
    except httpx.TransportError:
        return response, None
    finally:
        await response.aclose()


def _json_object(body: bytes | None) -> dict[str, object] | None:
    if body is None:
        return None
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    return data if isinstance(data, dict) else None


def _redirect(status: int, who: str) -> PermanentDeliveryError:
    # Never followed: a redirected POST reaches no handler of ours, and following one would
    # send the chunk (and its credentials) wherever the answer points.
    return PermanentDeliveryError(
        f"http_{status}",
        f"{who} answered a redirect (HTTP {status}); redirects are not followed, nothing was posted",
    )


# Slack has no idempotency key, so a failure may be retried only when it proves that nothing
# was posted. These errors do: the request was refused before any message was created.
SLACK_NOT_POSTED = {
    "ratelimited",  # refused by the rate limiter before the method ran
    "request_timeout",  # the POST body arrived missing or truncated
}
# Slack documents these as possibly having done part of the work ("it's possible some aspect
# of the operation succeeded"): the outcome is unknown even though ok is false.
SLACK_MAYBE_POSTED = {"internal_error", "fatal_error", "service_unavailable"}

SLACK_PERMANENT = {
    "channel_not_found",
    "not_in_channel",
    "is_archived",
    "invalid_auth",
    "not_authed",
    "account_inactive",
    "token_revoked",
    "missing_scope",
    "restricted_action",
    "msg_too_long",
    "no_text",
    "thread_not_found",
}


class SlackChannel:
    """chat.postMessage into the bound thread (``slack:<channel>:<thread_ts>``).

    Slack accepts no idempotency key, so only a failure that proves nothing was posted is
    retried (no connection, a rate limit, a truncated request); a 5xx or an internal error
    after the request was sent is an unknown outcome for the operator, never a second post.
    """

    max_chunk_chars = 3500
    can_reconcile = False  # Slack cannot be asked whether a given post exists

    def __init__(self, base_url: str, token: str, *, timeout_s: float = 30.0) -> None:
        self._url = base_url.rstrip("/") + "/chat.postMessage"
        self._token = token
        self._timeout = timeout_s

    def __repr__(self) -> str:
        return f"<SlackChannel {self._url}>"

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        parts = delivery.conversation_id.split(":")
        if len(parts) < 2 or not parts[1]:
            raise PermanentDeliveryError(
                "bad_route", "slack conversation ids look like slack:CHANNEL[:THREAD_TS]"
            )
        body: dict[str, str] = {"channel": parts[1], "text": delivery.text}
        if len(parts) > 2 and parts[2]:
            body["thread_ts"] = parts[2].split("#", 1)[0]
        if not self._token:
            raise PermanentDeliveryError(
                "token_missing", "no Slack token is set (the channel's tokenEnv variable); nothing was posted"
            )
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Content-Type": "application/json; charset=utf-8",
        }
        async with httpx.AsyncClient(timeout=self._timeout) as client:
            response, raw = await _send(client, _request(client, self._url, body, headers), "Slack")
        status = response.status_code
        if status == 429:
            raise RetryableDeliveryError(
                "rate_limited", "Slack rate limited the post", _retry_after(response)
            )
        data = _json_object(raw)
        said = data.get("error") if data is not None else None
        error = said[:64] if isinstance(said, str) else None
        if status >= 500:
            if error in SLACK_NOT_POSTED:
                raise RetryableDeliveryError(
                    error, f"Slack refused the post: {error}", _retry_after(response)
                )
            raise UnconfirmedDeliveryError(
                f"Slack answered HTTP {status} after the request was sent; it may have posted",
                f"http_{status}",
            )
        if 300 <= status < 400:
            raise _redirect(status, "Slack")
        if data is None:
            if response.is_success:  # a 2xx may well have posted: not safe to try again
                raise UnconfirmedDeliveryError("Slack answered 2xx without a readable JSON object")
            raise RetryableDeliveryError("bad_response", "Slack answered without JSON")
        if data.get("ok") is True and response.is_success:
            ts = data.get("ts")
            if isinstance(ts, str):
                return ChunkReceipt(delivery_id=ts, channel_id=str(data.get("channel") or parts[1]))
            raise UnconfirmedDeliveryError("Slack accepted the post without a message ts")
        error = error or "unknown_error"
        if error == "ratelimited":
            raise RetryableDeliveryError(
                "rate_limited", "Slack rate limited the post", _retry_after(response)
            )
        if error in SLACK_MAYBE_POSTED:
            raise UnconfirmedDeliveryError(f"Slack reported {error}; the post may have happened", error)
        if error in SLACK_PERMANENT or 400 <= status < 500:
            raise PermanentDeliveryError(error, f"Slack refused the post: {error}")
        raise RetryableDeliveryError(error, f"Slack did not accept the post: {error}")


class WebhookChannel:
    """POST one JSON document per chunk with an ``Idempotency-Key`` header.

    A 5xx, 408 or 429 is retried with the same ``Idempotency-Key`` (the chunk's delivery
    key): that is safe exactly when the receiver drops a key it has already accepted, which
    this adapter requires of it. A timeout or a dropped connection after sending is still an
    unknown outcome, because afterword cannot ask the receiver what it kept.
    """

    max_chunk_chars = 16000
    can_reconcile = False

    def __init__(self, url: str, headers: dict[str, str] | None = None, *, timeout_s: float = 30.0) -> None:
        self._url = url
        self._headers = dict(headers or {})
        self._timeout = timeout_s

    def __repr__(self) -> str:
        return "<WebhookChannel>"

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        body = {
            "deliveryKey": delivery.delivery_key,
            "conversationId": delivery.conversation_id,
            "chunkIndex": delivery.chunk_index,
            "chunkCount": delivery.chunk_count,
            "text": delivery.text,
        }
        headers = {**self._headers, "Idempotency-Key": delivery.delivery_key}
        async with httpx.AsyncClient(timeout=self._timeout) as client:
            response, raw = await _send(client, _request(client, self._url, body, headers), "the webhook")
        status = response.status_code
        if status == 429 or status >= 500 or status == 408:
            raise RetryableDeliveryError(
                f"http_{status}", f"webhook answered HTTP {status}", _retry_after(response)
            )
        if 300 <= status < 400:
            raise _redirect(status, "the webhook")
        if not response.is_success:  # only a 2xx confirms a post
            raise PermanentDeliveryError(f"http_{status}", f"webhook refused the delivery (HTTP {status})")
        data = _json_object(raw)
        answered_id = data.get("id") if data is not None else None
        delivery_id = answered_id if isinstance(answered_id, str) else delivery.delivery_key
        return ChunkReceipt(delivery_id=delivery_id, channel_id="webhook")
