"""redaction.py: what is hidden, what is kept, and the way back from a stored location."""

from __future__ import annotations

import copy
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardinfer.errors import EXIT_CONFIG, ConfigError
from shardinfer.jobs.secrets_guard import (
    RedactedError,
    RedactingStream,
    environment_secrets,
    guard_job,
    guarded_run,
    redacted_error,
)
from shardinfer.redaction import (
    has_userinfo,
    is_credential_key,
    location_identity,
    redact_config,
    redact_options,
    redact_text,
    redact_url,
    remember_secrets,
    secrets_in,
    secrets_scope,
    with_credentials_of,
)


@pytest.fixture(autouse=True)
def _forget_remembered_secrets() -> Iterator[None]:
    with secrets_scope():  # what a test remembers stays out of the other tests of this process
        yield


def test_credential_keys() -> None:
    secret = [
        "key",
        "secret",
        "token",
        "password",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "AWS_SECRET_ACCESS_KEY",
        "account_key",
        "AccountKey",
        "sas_token",
        "connection_string",
        "client_secret",
        "X-Amz-Signature",
        "X-Amz-Credential",
        "X-Amz-Security-Token",
        "X-Goog-Signature",
        "AWSAccessKeyId",
        "sig",
        "Authorization",
        "apiKey",
        "HF_TOKEN",
    ]
    public = [
        "endpoint_url",
        "anon",
        "region_name",
        "profile",
        "requester_pays",
        "use_ssl",
        "keyword",
        "max_tokens",
        "prompt_tokens",
        "tokenizer.sha256",
        "X-Amz-Date",
        "version_aware",
    ]
    assert [k for k in secret if not is_credential_key(k)] == []
    assert [k for k in public if is_credential_key(k)] == []


def test_redact_url_hides_user_info_and_signatures_only() -> None:
    assert redact_url("https://bob:hunter22@example.com:8443/a/b.jsonl?x=1&sig=abcd") == (
        "https://***@example.com:8443/a/b.jsonl?x=1&sig=***"
    )
    assert redact_url("s3://bucket/key.parquet") == "s3://bucket/key.parquet"
    assert redact_url("/local/path@odd") == "/local/path@odd"
    azure = "abfs://container@account.dfs.core.windows.net/data/x.parquet"  # a container, not a user
    assert redact_url(azure) == location_identity(azure) == redact_text(azure) == azure
    presigned = "https://b.s3.amazonaws.com/f.parquet?X-Amz-Date=20261201T000000Z&X-Amz-Signature=deadbeef99"
    assert redact_url(presigned) == (
        "https://b.s3.amazonaws.com/f.parquet?X-Amz-Date=20261201T000000Z&X-Amz-Signature=***"
    )


def test_location_identity_is_the_same_after_rotation() -> None:
    first = "https://u:old-pass@h.example/d/f.parquet?versionId=7&X-Amz-Date=1&X-Amz-Signature=aa11"
    second = "https://u:new-pass@h.example/d/f.parquet?versionId=7&X-Amz-Date=2&X-Amz-Signature=bb22"
    assert (
        location_identity(first) == location_identity(second) == "https://h.example/d/f.parquet?versionId=7"
    )
    assert location_identity("s3://bucket/a.parquet") == "s3://bucket/a.parquet"
    # Azure SAS fields go only with a signature; without one `se` is an ordinary parameter.
    assert location_identity("https://h/f?se=2026&sp=r&sig=zz99") == "https://h/f"
    assert location_identity("https://h/f?se=2026") == "https://h/f?se=2026"


def test_credentials_come_back_only_from_the_configured_input() -> None:
    source = "https://bob:pw12@example.com/data/"
    assert with_credentials_of("https://example.com/data/a.jsonl", source) == (
        "https://bob:pw12@example.com/data/a.jsonl"
    )
    assert with_credentials_of("https://other.com/a.jsonl", source) == "https://other.com/a.jsonl"
    presigned = "https://h/f.parquet?X-Amz-Signature=aa11&X-Amz-Date=1"
    assert with_credentials_of(location_identity(presigned), presigned) == presigned
    assert with_credentials_of("/tmp/x.parquet", "/tmp/x.parquet") == "/tmp/x.parquet"


def test_redact_options_and_config_leave_the_originals() -> None:
    options = {"key": "AKIA1", "secret": "s", "token": None, "client_kwargs": {"endpoint_url": "http://h:9"}}
    assert redact_options(options) == {
        "key": "***",
        "secret": "***",
        "token": None,
        "client_kwargs": {"endpoint_url": "http://h:9"},
    }
    config = {
        "input": {"path": "http://u:pw12@h/x", "storage_options": options},
        "sampling": {"stop_token_ids": [7, 8]},  # a credential-looking name outside storage options
        "ray": {"runtime_env": {"env_vars": {"AWS_SECRET_ACCESS_KEY": "abcd1234"}}},
    }
    assert redact_config(config) == {
        "input": {"path": "http://***@h/x", "storage_options": redact_options(options)},
        "sampling": {"stop_token_ids": [7, 8]},
        "ray": {"runtime_env": {"env_vars": {"AWS_SECRET_ACCESS_KEY": "***"}}},
    }
    assert options["key"] == "AKIA1"  # a copy: the job still needs the originals


def test_secrets_found_in_a_spec() -> None:
    config = {
        "input": {
            "path": "https://canary:pass%2Fword@h/x?sig=sig-5555",
            "storage_options": {"secret": "shh-1234"},
        },
        "output": {"storage_options": {"client_kwargs": {"aws_session_token": "tok-5678"}, "key": "abc"}},
    }
    assert secrets_in(config) == {
        "canary",
        "pass%2Fword",
        "pass/word",
        "canary:pass%2Fword",
        "sig-5555",
        "shh-1234",
        "tok-5678",
    }  # "abc" is too short to scrub from free text (it is still redacted by name)


def test_redact_text_scrubs_urls_and_remembered_secrets() -> None:
    remember_secrets({"storage_options": {"secret": 'remembered-"quoted"-9'}})
    text = "GET https://user:pw99@host/a?x=1&X-Amz-Signature=ffee&token=t0k3n failed"
    assert redact_text(text) == "GET https://***@host/a?x=1&X-Amz-Signature=***&token=*** failed"
    assert redact_text('error: remembered-"quoted"-9') == "error: ***"
    as_json = json.dumps({"reason": 'remembered-"quoted"-9 denied'})
    assert "remembered" not in redact_text(as_json)
    assert redact_text("job.seed=3; sampling.max_tokens=5") == "job.seed=3; sampling.max_tokens=5"
    # Options quoted back by a parser or a library's repr, never remembered.
    assert redact_text("""unrecognized arguments: {"secret": "zz-9", "anon": "no"}""") == (
        """unrecognized arguments: {"secret": "***", "anon": "no"}"""
    )
    assert redact_text("S3FileSystem(key='AKIA7', endpoint_url='http://h')") == (
        "S3FileSystem(key='***', endpoint_url='http://h')"
    )
    assert (
        redact_text('storage_options = {aws_session_token = "t-1"}')
        == 'storage_options = {aws_session_token = "***"}'
    )
    assert redact_text('"stop_token_ids": [1, 2], "tokenizer": "tok.json"') == (
        '"stop_token_ids": [1, 2], "tokenizer": "tok.json"'
    )


def test_an_exception_named_after_a_credential_word_keeps_its_subject() -> None:
    """`KeyError: 'prompt'` reads like an entry named `KeyError`; blanking its value hid which key a
    failed job missed. An entry whose name is not an exception's is still redacted."""
    assert redact_text("KeyError: 'prompt'") == "KeyError: 'prompt'"
    assert redact_text("raised TokenError: 'bad header'") == "raised TokenError: 'bad header'"
    assert redact_text("AccountKey: 'k-123456'") == "AccountKey: '***'"
    assert redact_text("key_error: 'k-123456'") == "key_error: '***'"


def test_streams_and_errors_crossing_a_process_are_redacted() -> None:
    remember_secrets({"key": "stream-secret-77"})
    sink = io.StringIO()
    stream = RedactingStream(sink)
    stream.write("a stream-secret-77 b\n")
    stream.flush()
    assert sink.getvalue() == "a *** b\n"
    error = redacted_error(ConfigError("cannot open http://u:stream-secret-77@h/x"))
    assert error.exit_code == EXIT_CONFIG
    assert "stream-secret-77" not in str(error)
    # Rebuilt from __reduce__, as Ray rebuilds an actor's error on the driver.
    rebuilt = copy.deepcopy(error)
    assert isinstance(rebuilt, RedactedError) and rebuilt.exit_code == EXIT_CONFIG
    assert str(rebuilt) == str(error)
    plain = ConfigError("model.path='m' is not a directory")
    assert redacted_error(plain) is plain  # nothing to hide: the error keeps its kind


def test_an_in_process_cli_run_redacts_and_then_leaves_nothing_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardinfer.jobs.cli import main

    before = (sys.stdout, sys.stderr)
    secret = "inproc-secret-42"
    output = tmp_path / secret  # an error will quote this path
    assert main(["status", "--storage-options", json.dumps({"secret": secret}), str(output)]) == 66
    err = capsys.readouterr().err
    assert "holds no job" in err and secret not in err and "***" in err
    assert (sys.stdout, sys.stderr) == before  # the caller's streams are its own again
    assert redact_text(f"a {secret}") == f"a {secret}"  # and the secret is forgotten


def test_object_store_credentials_holding_a_slash_are_found_and_hidden() -> None:
    # AWS secret keys are base64 and often hold '/', which ends a URL's user-info elsewhere.
    url = "s3://AKIAEXAMPLE:wJalr/XUtnFEMI/K7MDENG@bucket/in/part.parquet"
    assert has_userinfo(url)
    assert "wJalr/XUtnFEMI/K7MDENG" in secrets_in(url)
    assert location_identity(url) == "s3://bucket/in/part.parquet"
    assert redact_url(url) == "s3://***@bucket/in/part.parquet"
    assert redact_text(f"cannot list {url}: denied") == "cannot list s3://***@bucket/in/part.parquet: denied"
    # '@' and ':' inside an object's key are not credentials.
    for plain in ("s3://bucket/users/a@b.com/x", "s3://bucket/a:b/c@d", "gs://bucket/x@1"):
        assert not has_userinfo(plain) and redact_text(plain) == plain and secrets_in(plain) == set()


def test_a_quoted_credential_with_an_escaped_quote_is_hidden_whole() -> None:
    assert redact_text('{"secret": "ab\\"cdef", "n": 1}') == '{"secret": "***", "n": 1}'
    assert redact_text("{'password': \"it's-hidden\", 'x': 'y'}") == "{'password': \"***\", 'x': 'y'}"


def test_each_credential_of_a_list_is_remembered() -> None:
    assert secrets_in({"credentials": ["first-token", "second-token"]}) == {"first-token", "second-token"}


def test_a_job_remembers_the_credentials_of_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret-1234")
    monkeypatch.setenv("HF_TOKEN", "hf_envtoken5678")
    monkeypatch.setenv("SOME_TOKEN_ENABLED", "true")  # a flag, not a credential
    monkeypatch.setenv("TLS_KEY_FILE", "/etc/tls/private.pem")  # a path names no secret
    with guarded_run():
        guard_job({})
        text = "failed: env-secret-1234 hf_envtoken5678 true /etc/tls/private.pem"
        assert redact_text(text) == "failed: *** *** true /etc/tls/private.pem"
    assert environment_secrets({"PWD": "/home/user/project", "API_KEY": "k" * 8}) == {"API_KEY": "k" * 8}
