"""The service's keys and URLs, in one place.

Every key is derived from the state secret with its own label (``afterword/store/keys.py``
lists them all), so a token minted for one purpose never verifies for another; the URL paths
come from ``afterword/protocol/paths.py``.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ..continuations.capabilities import (
    CLAIM_TOKEN_PREFIX,
    claim_mac,
    claim_token,
    operator_token,
    parse_claim_token,
    result_token,
    verify_claim_mac,
    verify_host_token,
    verify_metrics_token,
    verify_operator_token,
    verify_result_token,
)
from ..continuations.errors import Unauthorized
from ..continuations.model import Claim, Continuation
from ..protocol import paths
from ..store import keys as labels
from ..store.keys import Purpose, derive_key

LABELS: dict[str, Purpose] = {
    "ids": labels.CONTINUATION_IDS,
    "result": labels.RESULT_TOKENS,
    "claim": labels.CLAIM_CAPABILITIES,
    "operator": labels.OPERATOR,
    "metrics": labels.METRICS,
    "host": labels.HOST,
    "claim_mac": labels.CLAIM_BINDING,
    "cursor": labels.OPERATOR_CURSOR,
    "status_page": labels.STATUS_PAGE,
}

K = TypeVar("K")
V = TypeVar("V")

CACHED = 4096  # entries per cache: more than the continuations a busy service has in flight


class BoundedCache(Generic[K, V]):
    """A bounded map of values already derived (or verified); the oldest entry goes first.

    Each request used to derive the same HMACs again: the result token at the HTTP layer's
    early check, again in the handler, again for a status read; the claim MAC at admission
    and at every worker step that checks it. Only values that were minted here or verified
    here are kept, so a flood of bad tokens cannot push out the good ones.
    """

    __slots__ = ("_items", "_limit")

    def __init__(self, limit: int = CACHED) -> None:
        self._items: dict[K, V] = {}
        self._limit = limit

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        items = self._items
        items[key] = value
        if len(items) > self._limit:
            try:
                del items[next(iter(items))]
            except (KeyError, RuntimeError, StopIteration):
                pass  # another thread evicted first: the bound still holds within one entry

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class ServiceKeys:
    """The derived keys; ``repr`` never shows them."""

    ids: bytes = field(repr=False)
    result: bytes = field(repr=False)
    claim: bytes = field(repr=False)
    operator: bytes = field(repr=False)
    metrics: bytes = field(repr=False)
    host: bytes = field(repr=False)
    claim_mac: bytes = field(repr=False)
    cursor: bytes = field(repr=False)
    status_page: bytes = field(repr=False)
    # What was already derived from these keys (never shown, never compared).
    _result_tokens: BoundedCache[str, str] = field(
        default_factory=BoundedCache, init=False, repr=False, compare=False
    )
    _claim_macs: BoundedCache[str, tuple[Claim, str]] = field(
        default_factory=BoundedCache, init=False, repr=False, compare=False
    )
    _claim_tokens: BoundedCache[str, str] = field(
        default_factory=BoundedCache, init=False, repr=False, compare=False
    )

    @classmethod
    def derive(cls, secret: bytes) -> ServiceKeys:
        return cls(**{name: derive_key(secret, label) for name, label in LABELS.items()})

    # -- tokens ------------------------------------------------------------------------------
    def operator_token(self) -> str:
        return operator_token(self.operator)

    def verify_operator(self, token: str) -> None:
        if not verify_operator_token(self.operator, token):
            raise Unauthorized("operator capability required")

    def verify_host(self, token: str) -> None:
        if not verify_host_token(self.host, token):
            raise Unauthorized("host capability required")

    def verify_metrics_reader(self, token: str) -> None:
        """The metrics endpoint opens to the operator or to the read-only metrics capability."""
        if not (verify_operator_token(self.operator, token) or verify_metrics_token(self.metrics, token)):
            raise Unauthorized("operator or metrics capability required")

    def result_token(self, cid: str) -> str:
        token = self._result_tokens.get(cid)
        if token is None:
            token = result_token(self.result, cid)
            self._result_tokens.put(cid, token)
        return token

    def check_result_token(self, cid: str, token: str) -> None:
        expected = self._result_tokens.get(cid)
        if expected is None:
            if not verify_result_token(self.result, cid, token):
                raise Unauthorized("a valid result token for this continuation is required")
            self._result_tokens.put(cid, token)  # verified: it is the token of cid
        elif not hmac.compare_digest(expected.encode(), token.encode()):
            raise Unauthorized("a valid result token for this continuation is required")

    def claim_capability(self, token: str) -> str | None:
        """The capability id inside an authentic claim token, else None."""
        if token.startswith(CLAIM_TOKEN_PREFIX):
            # Parsed as parse_claim_token does; only ids minted or verified here are remembered.
            capability_id = token[len(CLAIM_TOKEN_PREFIX) :].rpartition(".")[0]
            expected = self._claim_tokens.get(capability_id)
            if expected is not None:
                return capability_id if hmac.compare_digest(expected.encode(), token.encode()) else None
        cap_id = parse_claim_token(self.claim, token)
        if cap_id is not None:
            self._claim_tokens.put(cap_id, token)
        return cap_id

    def claim_token(self, capability_id: str) -> str:
        token = claim_token(self.claim, capability_id)
        self._claim_tokens.put(capability_id, token)
        return token

    # -- the claim binding -------------------------------------------------------------------
    def mac(self, claim: Claim) -> str:
        """The MAC that binds a claim's immutable fields to this state directory."""
        mac = claim_mac(self.claim_mac, claim)
        self._claim_macs.put(claim.id, (claim, mac))
        return mac

    def claim_intact(self, rec: Continuation) -> bool:
        """Whether the record's immutable claim still matches the MAC minted at admission.

        A claim equal to one whose MAC was minted or verified here has that same MAC (the MAC
        is a function of the claim's fields), so only the stored MAC needs comparing."""
        known = self._claim_macs.get(rec.claim.id)
        if known is not None and (known[0] is rec.claim or known[0] == rec.claim):
            return hmac.compare_digest(known[1].encode(), rec.claim_mac.encode())
        if not verify_claim_mac(self.claim_mac, rec.claim, rec.claim_mac):
            return False
        self._claim_macs.put(rec.claim.id, (rec.claim, rec.claim_mac))
        return True


@dataclass(frozen=True)
class ServiceUrls:
    """The URLs handed to producers; they must use them as given (docs/design.md, Contracts: HTTP)."""

    base_url: str

    @property
    def claim_url(self) -> str:
        return paths.url(paths.CLAIM, self.base_url)

    def result_url(self, cid: str) -> str:
        return paths.url(paths.RESULT, self.base_url, cid=cid)

    def status_url(self, cid: str) -> str:
        return paths.url(paths.STATUS, self.base_url, cid=cid)
