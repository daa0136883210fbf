"""HTTP to a Prometheus-compatible TSDB: the query API's envelope and the errors it maps to.

Connection errors, timeouts, 5xx and 429 are :class:`TsdbUnavailable` (retry later); any
other 4xx is :class:`TsdbRefused` with the TSDB's own message (the query or the samples are
wrong, and will be on the next try too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from tuneloop.errors import InvalidInput, Unavailable

DEFAULT_TIMEOUT_S = 30.0
_MESSAGE_LIMIT = 500

Params = Sequence[tuple[str, str]]


class TsdbUnavailable(Unavailable):
    """The TSDB did not answer, or answered that it cannot take the request now."""


class TsdbRefused(InvalidInput):
    """The TSDB refused the request (4xx); ``str()`` carries its message."""


class PrometheusClient:
    """One connection pool to the TSDB at ``url``; ``headers`` go with every request (an
    ``Authorization`` header, a tenant header). Safe to share between threads."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(headers=dict(headers or {}), timeout=timeout_s)

    def api(self, path: str, params: Params, *, method: str = "POST") -> Any:
        """``data`` of a successful answer of ``/api/v1/<path>``. Sent as a form POST where
        the endpoint takes one (long selectors then never meet URL limits), else a GET."""
        form: dict[str, list[str]] = {}
        for name, value in params:
            form.setdefault(name, []).append(value)
        url = f"{self.url}/api/v1/{path}"
        if method == "GET":
            response = self._send("GET", url, params=form)
        else:
            response = self._send("POST", url, data=form)
        try:
            body = response.json()
        except ValueError:
            raise TsdbUnavailable(f"the TSDB answered {path} with something not JSON") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise TsdbRefused(f"the TSDB refused {path}: {_message(response)}")
        return body.get("data")

    def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> None:
        """POST ``body`` to ``path`` (relative to the URL); raise unless 2xx."""
        self._send("POST", f"{self.url}/{path.lstrip('/')}", content=body, headers=headers)

    def close(self) -> None:
        self._http.close()

    def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise TsdbUnavailable(f"the TSDB at {self.url} did not answer: {exc}") from None
        status = response.status_code
        if status == 429 or status >= 500:
            raise TsdbUnavailable(f"the TSDB answered {status}: {_message(response)}")
        if status >= 400:
            raise TsdbRefused(f"the TSDB refused the request ({status}): {_message(response)}")
        return response


def _message(response: httpx.Response) -> str:
    """The TSDB's own words: the envelope's ``error`` if there is one, else the body."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        text: str = body["error"]
    else:
        text = response.text
    return " ".join(text.split())[:_MESSAGE_LIMIT] or response.reason_phrase
