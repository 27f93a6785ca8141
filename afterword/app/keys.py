"""The service's keys and URLs, in one place.

Every key is derived from the state secret with its own label (``afterword/store/keys.py``
lists them all), so a token minted for one purpose never verifies for another; the URL paths
come from ``afterword/protocol/paths.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..continuations.capabilities import (
    claim_mac,
    operator_token,
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
        return result_token(self.result, cid)

    def check_result_token(self, cid: str, token: str) -> None:
        if not verify_result_token(self.result, cid, token):
            raise Unauthorized("a valid result token for this continuation is required")

    # -- the claim binding -------------------------------------------------------------------
    def mac(self, claim: Claim) -> str:
        """The MAC that binds a claim's immutable fields to this state directory."""
        return claim_mac(self.claim_mac, claim)

    def claim_intact(self, rec: Continuation) -> bool:
        """Whether the record's immutable claim still matches the MAC minted at admission."""
        return verify_claim_mac(self.claim_mac, rec.claim, rec.claim_mac)


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
