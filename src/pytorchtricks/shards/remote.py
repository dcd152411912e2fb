"""Packs on object storage: URLs through fsspec, retries, and URLs that are safe to print.

``s3://``, ``gs://``, ``az://`` (``abfs://``), ``http(s)://`` and ``file://`` URLs are opened through fsspec and its
backends (``pip install 'pytorchtricks[remote]'``: s3fs, gcsfs, adlfs). Endpoint and credentials come the standard
way of each backend (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``GOOGLE_APPLICATION_CREDENTIALS``, ...); they are never
logged, and every message names a URL without its userinfo or signed query (``scrub_url``). Transient errors
(timeouts, connection resets, 5xx) are retried with exponential backoff (``with_retries``). The node-shared shard
cache that reads packs at a URL is ``shards.cache``.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

from pytorchtricks.core import MissingExtraError, PttError, require
from pytorchtricks.data.errors import ShardError

T = TypeVar("T")

#: scheme -> (module, extra) that fsspec needs for it
SCHEMES: dict[str, tuple[str | None, str]] = {
    "s3": ("s3fs", "remote"),
    "s3a": ("s3fs", "remote"),
    "gs": ("gcsfs", "remote"),
    "gcs": ("gcsfs", "remote"),
    "az": ("adlfs", "remote"),
    "abfs": ("adlfs", "remote"),
    "abfss": ("adlfs", "remote"),
    "http": ("aiohttp", "remote"),
    "https": ("aiohttp", "remote"),
    "file": (None, "core"),
    "memory": (None, "core"),
}
_SECRET_QUERY = (
    "sig",
    "signature",
    "token",
    "key",
    "secret",
    "credential",
    "password",
    "sas",
    "x-amz-",
    "se",
)
RETRIES = 4  # attempts per transfer, transient errors only
BACKOFF_S = 0.5  # first wait; doubles per attempt


def is_url(path: Any) -> bool:
    """True for ``scheme://...`` strings (a plain path, even with ``:``, is not a URL).

    Example:
        >>> is_url("s3://bucket/p"), is_url("/data/p"), is_url("C:/x")
        (True, False, False)
    """
    if not isinstance(path, str) or "://" not in path:
        return False
    scheme = path.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise PttError(
            f"unsupported URL scheme {scheme!r} in {scrub_url(path)}: use one of "
            f"{', '.join(s + '://' for s in SCHEMES)} or a local path."
        )
    return True


def scrub_url(url: str) -> str:
    """``url`` without userinfo and with secret-looking query values masked: safe to print or log.

    Example:
        >>> scrub_url("https://user:pw@host/p?X-Amz-Signature=abc&part=1")
        'https://host/p?X-Amz-Signature=***&part=1'
    """
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unprintable URL>"
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = "&".join(
        f"{k}={'***' if any(k.lower().startswith(s) for s in _SECRET_QUERY) else v}"
        for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def join_url(base: str, name: str) -> str:
    """``base`` + ``/`` + ``name`` (no query strings: pack URLs name a folder)."""
    return base.rstrip("/") + "/" + name


def filesystem(url: str) -> tuple[Any, str]:
    """``(fsspec filesystem, path inside it)`` for ``url``; the backend's extra is named when missing."""
    scheme = url.split("://", 1)[0].lower()
    module, extra = SCHEMES[scheme]
    if module is not None:
        require(module, extra)
    fsspec = require("fsspec", "remote")
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise MissingExtraError(
            f"no fsspec backend for {scheme}://: install it with `pip install 'pytorchtricks[remote]'` ({exc})"
        ) from exc
    return fs, path


def _transient(exc: BaseException) -> bool:
    permanent = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, PttError)
    return isinstance(exc, Exception) and not isinstance(exc, permanent)


def with_retries(fn: Callable[[], T], what: str, url: str, *, attempts: int = RETRIES) -> T:
    """``fn()``, retried on transient errors with backoff 0.5, 1, 2 s; then a ``ShardError`` naming ``url``."""
    wait = threading.Event()  # a timed wait without reading a clock (clock.py owns clocks)
    for k in range(attempts):
        try:
            return fn()
        except FileNotFoundError as exc:
            raise ShardError(f"{what}: not found (check the URL and the pack)", path=scrub_url(url)) from exc
        except PermissionError as exc:
            raise ShardError(
                f"{what}: access denied (check credentials: AWS_PROFILE / AWS_ACCESS_KEY_ID, "
                "GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*)",
                path=scrub_url(url),
            ) from exc
        except Exception as exc:
            if not _transient(exc) or k + 1 == attempts:
                raise ShardError(
                    f"{what} failed after {k + 1} attempt(s): {type(exc).__name__}: {_scrub_text(str(exc), url)}",
                    path=scrub_url(url),
                ) from exc
            wait.wait(BACKOFF_S * 2**k)
    raise AssertionError("unreachable")


def _scrub_text(text: str, url: str) -> str:
    return text.replace(url, scrub_url(url))[:300]


def fetch_bytes(url: str) -> bytes:
    """The whole object at ``url`` (small files: a manifest), with retries."""
    fs, rpath = filesystem(url)
    return with_retries(lambda: fs.cat_file(rpath), "read", url)
