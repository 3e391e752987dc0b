"""Credentials stay in memory: what the job writes or prints has them replaced by `***`.

A job needs credentials to read and write: `storage_options` entries (`key`, `secret`, `token`,
`client_kwargs.aws_session_token`, `account_key`, `sas_token`, `headers.Authorization`, ...),
the user-info of a URL (`https://user:password@host/...`) and the signature parameters of a
presigned URL (`X-Amz-Signature`, `X-Amz-Credential`, `sig`, ...). None of them may reach an
object the job writes, a line it prints, or its fingerprint (a rotated key is not a new job).

Three tools, each used where text leaves the process:
  - `redact_config` / `redact_options`: a job spec or storage options as data, credential-named
    entries replaced (for `_job.json` and `--dry-run`);
  - `redact_text`: any text (an error message, a log line, a JSON value, a Parquet error
    record): URL user-info and credential query parameters found in it, and every credential
    the process was told about (`remember_secrets`), become `***`;
  - `location_identity`: a URL as the job's identity sees it, without user-info and signature
    parameters (for the fingerprint, the input listing and the split plan), and
    `with_credentials_of` to give such a URL back the credentials of the configured one.

This module is on the ground floor: it imports nothing from shardinfer.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

REDACTED = "***"
# Words that make an option, header, environment variable or query parameter a credential.
_SECRET_WORDS = {
    "key",
    "secret",
    "secrets",
    "password",
    "passwd",
    "pwd",
    "passphrase",
    "token",
    "credential",
    "credentials",
    "signature",
    "sig",
    "sas",
    "auth",
    "authorization",
    "apikey",
    "cookie",
    "bearer",
}
# Query parameters that belong to a URL's signature without being secret themselves: they
# change whenever the URL is signed again, so the job's identity leaves them out too.
_SIGNING_PREFIXES = ("x-amz-", "x-goog-")
_SIGNING_NAMES = {"expires", "key-pair-id", "policy", "se", "st", "sv", "sp", "sr", "spr", "ss", "srt", "si"}
# Azure's URLs name `container@account` before the host: there `@` does not end credentials.
_CONTAINER_AT_ACCOUNT = {"abfs", "abfss", "az", "adl", "wasb", "wasbs"}
# Object stores whose bucket names never hold ':' or '@': there `key:secret@` written into the URL is
# a credential even when the secret holds '/' (as AWS secret keys often do), which ends a URL's
# user-info everywhere else.
_BUCKET_SCHEMES = {"s3", "s3a", "gs", "gcs", "oci", "r2"}
_BUCKET_USERINFO = re.compile(
    rf"(?P<scheme>\b(?:{'|'.join(sorted(_BUCKET_SCHEMES))})://)"
    r"(?P<userinfo>[^\s/:@'\"<>]+:[^\s@'\"<>]+)@",
    re.IGNORECASE,
)
_MIN_SECRET_LEN = 4  # shorter values would blank out ordinary words of every message
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s@?#'\"<>]+)@")
# `"secret": "..."`, `secret = "..."`, `key='...'`: a credential-named entry quoted in a message (an
# options dict's repr, a JSON or TOML fragment an argument parser echoes back).
_QUOTED_ENTRY = re.compile(
    r"(?P<lead>[\"']?(?P<name>[A-Za-z][A-Za-z0-9_.\-]*)[\"']?\s*[:=]\s*)(?P<quote>[\"'])(?P<value>(?:\\.|(?!(?P=quote))[^\\\n])*)(?P=quote)"
)
_QUERY_PARAM = re.compile(r"(?P<lead>[?&;](?P<name>[A-Za-z0-9_.\-]+)=)(?P<value>[^&\s'\"#;<>]*)")


def is_credential_key(name: str) -> bool:
    """Whether an option, header, environment variable or query parameter of this name holds a
    credential: `key`, `secret`, `aws_session_token`, `X-Amz-Signature`, `sig`, `AccountKey`..."""
    words = {w.lower() for w in _WORD.findall(name)}
    if words & _SECRET_WORDS:
        return True
    return {"connection", "string"} <= words  # Azure's connection_string holds the account key


def _is_signing_param(name: str, signed: bool) -> bool:
    lowered = name.lower()
    if is_credential_key(name) or lowered.startswith(_SIGNING_PREFIXES):
        return True
    return signed and lowered in _SIGNING_NAMES


def _split(url: str) -> Any:
    if "://" not in url:
        return None
    url = _quote_bucket_userinfo(url)
    try:
        return urlsplit(url)
    except ValueError:
        return None


def _quote_bucket_userinfo(url: str) -> str:
    """`url` with the '/' of credentials written into an object-store URL percent-encoded, so that
    the user-info ends at its '@' (`s3://KEY:a/b@bucket` is the bucket `bucket`, not `KEY:a`)."""
    match = _BUCKET_USERINFO.match(url)
    if match is None:
        return url
    userinfo = match.group("userinfo").replace("/", "%2F")
    return f"{match.group('scheme')}{userinfo}@{url[match.end() :]}"


def _userinfo(parts: Any) -> tuple[str, str] | None:
    """(user-info, the rest of the netloc) of a split URL, None when it carries none."""
    if "@" not in parts.netloc or parts.scheme.lower() in _CONTAINER_AT_ACCOUNT:
        return None
    userinfo, host = parts.netloc.rsplit("@", 1)
    return userinfo, host


def redact_url(url: str) -> str:
    """`url` with its user-info and credential query parameters replaced by `***`."""
    parts = _split(url)
    if parts is None:
        return url
    found = _userinfo(parts)
    netloc = f"{REDACTED}@{found[1]}" if found else parts.netloc
    query = parts.query
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(is_credential_key(k) for k, _ in pairs):
        query = urlencode([(k, REDACTED if is_credential_key(k) else v) for k, v in pairs], safe="*")
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def location_identity(url: str) -> str:
    """`url` as the job's identity sees it: without user-info and without the parameters of a
    signature (a presigned URL signed again, or a rotated password, names the same file)."""
    parts = _split(url)
    if parts is None:
        return url
    found = _userinfo(parts)
    netloc = found[1] if found else parts.netloc
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    signed = any(is_credential_key(k) for k, _ in pairs)
    kept = [(k, v) for k, v in pairs if not _is_signing_param(k, signed)]
    query = parts.query if len(kept) == len(pairs) else urlencode(kept)
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def with_credentials_of(url: str, source: str) -> str:
    """`url` (a location in its identity form, as stored in `_job.json`) with the credentials of
    `source` (the configured `input.path`) put back: the whole source when it names the same
    file, else its user-info when both are on the same scheme and host."""
    if location_identity(source) == location_identity(url):
        return source
    parts, src = _split(url), _split(source)
    if parts is None or src is None or _userinfo(parts) is not None:
        return url
    credentials = _userinfo(src)
    if credentials is None or parts.scheme != src.scheme or parts.netloc != credentials[1]:
        return url
    netloc = f"{credentials[0]}@{credentials[1]}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def has_userinfo(url: str) -> bool:
    parts = _split(url)
    return parts is not None and _userinfo(parts) is not None


def redact_options(value: Any) -> Any:
    """A copy of storage options (or a runtime environment) safe to write or print: every
    credential-named entry, at any depth, holds `***`; other strings go through `redact_text`."""
    if isinstance(value, dict):
        return {
            k: REDACTED if is_credential_key(str(k)) and value[k] not in (None, "") else redact_options(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_options(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


# Entries of a job spec (JobConfig.to_dict()) that hold credentials by name.
_OPTION_ENTRIES = {("input", "storage_options"), ("model", "storage_options"), ("output", "storage_options")}
_OPTION_ENTRIES |= {("ray", "runtime_env")}


def redact_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a job spec as a dict (JobConfig.to_dict()) with its credentials replaced."""
    out: dict[str, Any] = {}
    for section, body in config.items():
        if not isinstance(body, dict):
            out[section] = redact_strings(body)
            continue
        out[section] = {
            key: redact_options(value) if (section, key) in _OPTION_ENTRIES else redact_strings(value)
            for key, value in body.items()
        }
    return out


def redact_strings(value: Any) -> Any:
    """A copy of a JSON-like value with `redact_text` applied to every string in it."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact_strings(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_strings(v) for v in value]
    return value


def secrets_in(value: Any) -> set[str]:
    """Every credential inside `value` (a job spec, storage options, a URL): the values of
    credential-named entries, URL user-info (whole, and user and password apart, as written
    and decoded) and credential query parameters."""
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                if is_credential_key(str(k)) and _is_scalar(v):
                    found.add(str(v))
                elif is_credential_key(str(k)) and isinstance(v, list | tuple):
                    # Several credentials under one name (tokens, a key pair): each is one.
                    found |= {str(item) for item in v if _is_scalar(item)}
                    stack.extend(item for item in v if not _is_scalar(item))
                else:
                    stack.append(v)
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, str):
            found |= _url_secrets(item)
    return {s for s in found if len(s) >= _MIN_SECRET_LEN}


def _is_scalar(value: Any) -> bool:
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def _url_secrets(text: str) -> set[str]:
    parts = _split(text)
    if parts is None:
        return set()
    found: set[str] = set()
    if (pair := _userinfo(parts)) is not None:
        userinfo = pair[0]
        found.add(userinfo)
        found |= {p for piece in userinfo.split(":", 1) for p in (piece, unquote(piece))}
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return found
    for k, v in pairs:
        if is_credential_key(k) and v:
            found |= {v, urlencode({"": v})[1:]}
    return found


class _KnownSecrets:
    """The credentials this process holds, for `redact_text` (each spelled as written and as a
    JSON string body, since log lines and records are often JSON)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ordered: tuple[str, ...] = ()

    def add(self, secrets: set[str]) -> None:
        spellings = set(secrets) | {json.dumps(s)[1:-1] for s in secrets}
        with self._lock:
            merged = set(self._ordered) | {s for s in spellings if len(s) >= _MIN_SECRET_LEN}
            # Longest first: a secret that contains another is replaced whole.
            self._ordered = tuple(sorted(merged, key=lambda s: (-len(s), s)))

    def snapshot(self) -> tuple[str, ...]:
        return self._ordered

    def restore(self, saved: tuple[str, ...]) -> None:
        with self._lock:
            self._ordered = saved

    def scrub(self, text: str) -> str:
        for secret in self._ordered:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text


_KNOWN = _KnownSecrets()


def remember_secrets(value: Any) -> None:
    """Tell `redact_text` about the credentials in `value` (a job spec, storage options, a URL),
    so that no text this process writes or prints can carry them from here on."""
    _KNOWN.add(secrets_in(value))


@contextmanager
def secrets_scope() -> Iterator[None]:
    """Credentials remembered inside the block are forgotten after it: a job run in-process (a
    test, a program calling the CLI's `main`) leaves no secret behind in this process."""
    saved = _KNOWN.snapshot()
    try:
        yield
    finally:
        _KNOWN.restore(saved)


def _userinfo_out(match: re.Match[str]) -> str:
    if match.group("scheme")[:-3].lower() in _CONTAINER_AT_ACCOUNT:
        return match.group(0)
    return f"{match.group('scheme')}{REDACTED}@"


# Python's exception names (`KeyError: 'prompt'`, `TokenError: '...'`) precede a quoted value the way
# a credential entry does; what follows them is the error's subject, never a credential.
_EXCEPTION_NAME = re.compile(r"[A-Z][A-Za-z0-9]*(Error|Exception|Warning)")


def _entry_out(match: re.Match[str]) -> str:
    name = match.group("name")
    if _EXCEPTION_NAME.fullmatch(name):
        return match.group(0)
    if is_credential_key(name) and match.group("value") not in ("", REDACTED):
        quote = match.group("quote")
        return f"{match.group('lead')}{quote}{REDACTED}{quote}"
    return match.group(0)


def _param_out(match: re.Match[str]) -> str:
    if is_credential_key(match.group("name")) and match.group("value") not in ("", REDACTED):
        return match.group("lead") + REDACTED
    return match.group(0)


def redact_text(text: str) -> str:
    """`text` with URL user-info, credential query parameters, quoted credential-named entries and
    every remembered credential replaced by `***`: the one function every boundary where text
    leaves the process calls."""
    if not text:
        return text
    text = _KNOWN.scrub(text)
    if "://" in text:
        text = _BUCKET_USERINFO.sub(_userinfo_out, text)
        text = _USERINFO.sub(_userinfo_out, text)
    if "=" in text:
        text = _QUERY_PARAM.sub(_param_out, text)
    if "=" in text or ":" in text:
        text = _QUOTED_ENTRY.sub(_entry_out, text)
    return text
