"""Tokens, fingerprints and ids: pure derivations from purpose keys (HMAC-SHA256).

Nothing here is stored: a result token, the operator capability and continuation ids are
recomputed from the store secret on demand, so they stay valid across restarts. Claim
capability tokens carry a random capability id (passed in) and are valid only while the
issuing run keeps that capability open.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from .model import Claim, canonical_claim

CLAIM_TOKEN_PREFIX = "awc1."
RESULT_TOKEN_PREFIX = "awr1."
OPERATOR_TOKEN_PREFIX = "awo1."
METRICS_TOKEN_PREFIX = "awm1."
HOST_TOKEN_PREFIX = "awh1."


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _mac(key: bytes, *parts: str) -> bytes:
    return hmac.new(key, "\x00".join(parts).encode(), hashlib.sha256).digest()


def continuation_id(key: bytes, kind: str, server_name: str, task_key: str) -> str:
    """Deterministic id of a claim identity: a repeated claim maps to the same id."""
    digest = _mac(key, "continuation-id", kind, server_name, task_key)
    return "c_" + base64.b32encode(digest[:15]).decode().lower()


def result_token(key: bytes, continuation_id_: str) -> str:
    return RESULT_TOKEN_PREFIX + _b64(_mac(key, "result-token", continuation_id_))


def verify_result_token(key: bytes, continuation_id_: str, token: str) -> bool:
    return hmac.compare_digest(result_token(key, continuation_id_).encode(), token.encode())


def claim_token(key: bytes, capability_id: str) -> str:
    return f"{CLAIM_TOKEN_PREFIX}{capability_id}.{_b64(_mac(key, 'claim-capability', capability_id))}"


def parse_claim_token(key: bytes, token: str) -> str | None:
    """The capability id inside an authentic claim token, else None."""
    if not token.startswith(CLAIM_TOKEN_PREFIX):
        return None
    body = token[len(CLAIM_TOKEN_PREFIX) :]
    capability_id, sep, _mac_part = body.rpartition(".")
    if not sep or not capability_id:
        return None
    if not hmac.compare_digest(claim_token(key, capability_id).encode(), token.encode()):
        return None
    return capability_id


def operator_token(key: bytes) -> str:
    return OPERATOR_TOKEN_PREFIX + _b64(_mac(key, "operator-capability"))


def verify_operator_token(key: bytes, token: str) -> bool:
    return hmac.compare_digest(operator_token(key).encode(), token.encode())


def metrics_token(key: bytes) -> str:
    """A read-only capability for a metrics scraper: it opens the metrics endpoint only."""
    return METRICS_TOKEN_PREFIX + _b64(_mac(key, "metrics-capability"))


def verify_metrics_token(key: bytes, token: str) -> bool:
    return hmac.compare_digest(metrics_token(key).encode(), token.encode())


def host_token(key: bytes) -> str:
    """The host capability: binds runs and reads captured text over the host API, nothing else."""
    return HOST_TOKEN_PREFIX + _b64(_mac(key, "host-capability"))


def verify_host_token(key: bytes, token: str) -> bool:
    return hmac.compare_digest(host_token(key).encode(), token.encode())


def verify_bearer(expected: str, presented: str) -> bool:
    """Constant-time comparison of a configured bearer secret."""
    return hmac.compare_digest(expected.encode(), presented.encode())


def fingerprint(
    run_id: str | None,
    server_name: str,
    conversation_id: str | None,
    reply_to: str | None,
    mode: str,
    route: str | None = None,
) -> str:
    """A public digest of the binding, so a server can tell which binding it holds."""
    parts = "\x00".join(p or "" for p in ("v1", run_id, server_name, conversation_id, reply_to, mode, route))
    return "sha256:" + hashlib.sha256(parts.encode()).hexdigest()[:32]


def claim_mac(key: bytes, claim: Claim) -> str:
    return hmac.new(key, canonical_claim(claim), hashlib.sha256).hexdigest()


def verify_claim_mac(key: bytes, claim: Claim, mac: str) -> bool:
    return hmac.compare_digest(claim_mac(key, claim).encode(), mac.encode())
