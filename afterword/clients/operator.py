"""The local operator client: derives the operator capability from the owner-only secret.

Only a user who can read ``<stateDir>/secret`` (the service's owner) can derive the
capability; the secret itself never leaves this process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from ..config import Config
from ..continuations.capabilities import host_token, metrics_token, operator_token
from ..disk import StateRoot
from ..errors import AfterwordError
from ..protocol import paths
from ..protocol.wire import DetailBody, HealthBody, ListResponse, StatusBody, UiLoginBody
from ..store.keys import HOST, METRICS, OPERATOR, derive_key
from ..store.loading import SECRET, SECRET_BYTES

if TYPE_CHECKING:
    import httpx


class OperatorError(AfterwordError):
    """The operator request failed; ``status`` is the HTTP status (0: service unreachable)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status = status
        self.code = code
        super().__init__(message)


def _read_secret(config: Config) -> bytes:
    root = StateRoot(config.state_dir, create=False)
    secret = root.read_file(SECRET, max_size=SECRET_BYTES)
    if len(secret) != SECRET_BYTES:
        raise OperatorError(0, "bad_secret", f"{root.path(SECRET)}: not a valid secret")
    return secret


def read_operator_token(config: Config) -> str:
    return operator_token(derive_key(_read_secret(config), OPERATOR))


def read_metrics_token(config: Config) -> str:
    """The read-only metrics capability (opens ``GET /v1/operator/metrics`` and nothing else)."""
    return metrics_token(derive_key(_read_secret(config), METRICS))


def read_host_token(config: Config) -> str:
    """The host capability (the ``/v1/host`` API only; see docs/host-api.md)."""
    return host_token(derive_key(_read_secret(config), HOST))


class OperatorClient:
    def __init__(self, config: Config, token: str, *, timeout_s: float = 10.0) -> None:
        # Imported here, not at the top: every `afterword` command imports this module, and
        # httpx is a third of the CLI's start-up time; only the verbs that call the service pay.
        import httpx

        self._base = config.base_url
        # trust_env=False: the operator credential is restart-stable and all-powerful, so it must
        # go only to the loopback service, never to a proxy named in HTTP_PROXY/ALL_PROXY.
        self._client: httpx.Client = httpx.Client(
            timeout=timeout_s,
            headers={"Authorization": f"Bearer {token}"},
            trust_env=False,
            follow_redirects=False,
        )

    def __repr__(self) -> str:
        return f"<OperatorClient {self._base}>"

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None) -> Any:
        import httpx  # already loaded by __init__

        try:
            response = self._client.request(method, self._base + path, params=params, json=body)
        except httpx.HTTPError as exc:
            raise OperatorError(
                0,
                "unreachable",
                f"cannot reach the service at {self._base} ({type(exc).__name__}): is `afterword serve` "
                f"running with this config? check with: curl -s {paths.url(paths.LIVEZ, self._base)}",
            ) from None
        if response.status_code >= 400:
            try:
                err = response.json()["error"]
                raise OperatorError(response.status_code, err["code"], err["message"])
            except (ValueError, KeyError, TypeError):
                raise OperatorError(
                    response.status_code, "http_error", f"HTTP {response.status_code}"
                ) from None
        return response.content

    def show(self, cid: str) -> DetailBody:
        return msgspec.json.decode(self._call("GET", paths.url(paths.SHOW, cid=cid)), type=DetailBody)

    def health(self) -> HealthBody:
        return msgspec.json.decode(self._call("GET", paths.HEALTH), type=HealthBody)

    def list(
        self,
        limit: int | None = None,
        cursor: str | None = None,
        *,
        state: str | None = None,
        server: str | None = None,
        route: str | None = None,
        newest: bool = False,
    ) -> ListResponse:
        params: dict[str, Any] = {}
        if limit is not None:
            params["limit"] = str(limit)
        if cursor is not None:
            params["cursor"] = cursor
        for name, value in (("state", state), ("server", server), ("route", route)):
            if value is not None:
                params[name] = value
        if newest:
            params["order"] = "newest"
        data = self._call("GET", paths.LIST, params=params)
        return msgspec.json.decode(data, type=ListResponse)

    def retry(self, cid: str, allow_unknown: bool) -> StatusBody:
        data = self._call("POST", paths.url(paths.RETRY, cid=cid), body={"allowUnknown": allow_unknown})
        return msgspec.json.decode(data, type=StatusBody)

    def cancel(self, cid: str) -> StatusBody:
        return msgspec.json.decode(self._call("POST", paths.url(paths.CANCEL, cid=cid)), type=StatusBody)

    def acknowledge(self, cid: str) -> StatusBody:
        return msgspec.json.decode(self._call("POST", paths.url(paths.ACKNOWLEDGE, cid=cid)), type=StatusBody)

    def resolve(self, cid: str, kind: str, delivery_id: str | None) -> StatusBody:
        body = {"kind": kind, "deliveryId": delivery_id}
        data = self._call("POST", paths.url(paths.RESOLVE, cid=cid), body=body)
        return msgspec.json.decode(data, type=StatusBody)

    def ui_login(self) -> UiLoginBody:
        """A one-time login link to the status page (``afterword continuations ui``)."""
        return msgspec.json.decode(self._call("POST", paths.UI_LOGIN), type=UiLoginBody)

    def metrics(self) -> str:
        return bytes(self._call("GET", paths.METRICS)).decode()
