"""The server under load: what its own endpoints say it serves, and what its API accepts of ours.

:func:`discover_target` asks ``/v1/models`` and ``/metrics``; :func:`probe_request` sends one short
request shaped like the load's before the load starts, so a server that rejects a field we add
(``transformers serve`` answers 422 to ``ignore_eos``) has it dropped, said so, and is loaded
anyway, and one that is not an OpenAI-compatible server at all is a clear error, not thousands of
failed requests.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import psutil

from loadtests.client.load_context import API_PATHS, request_body

# Fields the load adds beyond the OpenAI API, which a server may refuse; dropped in this order.
OPTIONAL_FIELDS = ("ignore_eos",)
PROBE_TIMEOUT_S = 120.0


@dataclass(slots=True, frozen=True)
class Target:
    """The server under load, as its own endpoints describe it."""

    url: str
    model: str
    max_model_len: int | None
    has_metrics: bool

    @property
    def metrics_url(self) -> str | None:
        return f"{self.url}/metrics" if self.has_metrics else None


def discover_target(url: str, served_model: str | None = None, api_key: str | None = None) -> Target:
    """Ask ``url`` for its models (``/v1/models``) and whether it serves Prometheus ``/metrics``."""
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        models = _get_json(f"{url}/v1/models", headers)["data"]
    except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
        raise ValueError(f"{url} does not answer GET /v1/models as an OpenAI-compatible server: {exc}") from exc
    names = [m.get("id") for m in models]
    if served_model is not None:
        if served_model not in names:
            raise ValueError(f"{url} does not serve {served_model!r}; it serves {names}")
        card = models[names.index(served_model)]
    elif models:
        card = models[0]
    else:
        raise ValueError(f"{url} lists no models at /v1/models")
    max_len = card.get("max_model_len")
    return Target(url, str(card["id"]), int(max_len) if isinstance(max_len, int) else None, _has_metrics(url))



def _get_json(url: str, headers: dict[str, str]) -> Any:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=10.0) as response:  # noqa: S310 - the target URL we were given
        return json.loads(response.read())


def _has_metrics(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5.0) as response:  # noqa: S310 - as above
            return response.status == 200 and b"# TYPE" in response.read(1 << 20)
    except (urllib.error.URLError, OSError):
        return False


@dataclass(slots=True, frozen=True)
class ProbeResult:
    """What the probe request found: the fields the target refused (to be dropped) and its answer."""

    dropped_fields: tuple[str, ...]
    status_code: int


def probe_request(target: Target, api: str, ignore_eos: bool, api_key: str | None = None) -> ProbeResult:
    """Send one one-token streaming request as the load would; drop the fields the target refuses.

    Raises ``ValueError`` naming the status and body when the target refuses the request for any
    other reason, answers something that is not an SSE stream, or does not answer.
    """
    fields = {"ignore_eos": ignore_eos}
    dropped: list[str] = []
    while True:
        status, text, content_type = _post_probe(target, api, fields["ignore_eos"], api_key)
        if 200 <= status < 300:
            if "text/event-stream" not in content_type and not text.lstrip().startswith("data:"):
                raise ValueError(f"{target.url}{API_PATHS[api]} answered a streaming request with "
                                 f"{content_type or 'no content type'}, not an SSE stream: {text[:200]!r}")
            return ProbeResult(tuple(dropped), status)
        refused = [name for name in OPTIONAL_FIELDS if fields[name] and name in text]
        if 400 <= status < 500 and refused:
            dropped.append(refused[0])
            fields[refused[0]] = False
            continue
        raise ValueError(f"{target.url}{API_PATHS[api]} refused the load's request: HTTP {status}: {text[:300]}")


def _post_probe(target: Target, api: str, ignore_eos: bool, api_key: str | None) -> tuple[int, str, str]:
    body = request_body(target.model, api, "Hello", 1, ignore_eos)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    request = urllib.request.Request(f"{target.url}{API_PATHS[api]}", data=json.dumps(body).encode(), headers=headers,
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as response:  # noqa: S310 - our target
            return response.status, response.read(1 << 16).decode("utf-8", errors="replace"), \
                response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(1 << 16).decode("utf-8", errors="replace"), exc.headers.get("Content-Type", "")
    except (urllib.error.URLError, OSError) as exc:
        raise ValueError(f"{target.url}{API_PATHS[api]} did not answer the probe request: {exc}") from exc


def is_this_machine(url: str) -> bool:
    """Whether ``url``'s host is this machine (loopback or one of its addresses): then the bandwidth measured here
    bounds it and servescope's optimized path can be timed beside it."""
    host = urlsplit(url).hostname or ""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    mine = {a.address.split("%")[0] for nics in psutil.net_if_addrs().values() for a in nics}
    return all(ipaddress.ip_address(a.split("%")[0]).is_loopback or a in mine for a in addresses)
