"""Output locations a user can get wrong, each refused by name with its fix (exit 78) rather than
written somewhere else or failing with a bare OSError, ValueError or ImportError: a URL without
bucket or folder (`s3://`), a misspelt protocol (`S3://`, `s3:/bucket`), a store whose package is
missing, a folder this user cannot write, a file where a folder must be. Trailing slashes name the
same place."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from store_helpers import commit_all, new_store, plan, table_for

from shardinfer.errors import ConfigError, exit_code_for
from shardinfer.jobs.cli import main
from shardinfer.writers import OutputStore, make_job_record


@pytest.mark.parametrize("url", ["s3://", "s3:///", "memory://", "memory:///"])
def test_a_url_without_bucket_or_folder_is_refused_by_name(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="names no bucket or folder") as info:
        OutputStore(url)
    assert repr(url) in str(info.value) and exit_code_for(info.value) == 78
    assert list(tmp_path.iterdir()) == []  # before: `s3://` became the local folder `s3:` here


def test_status_of_a_bucketless_url_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["status", "s3://"]) == 78
    assert "'s3://' names no bucket or folder" in capsys.readouterr().err


@pytest.mark.parametrize("spelling", ["{dir}/", "{dir}//", "file://{dir}/"])
def test_trailing_slashes_name_the_same_location(tmp_path: Path, spelling: str) -> None:
    out = tmp_path / "out"
    splits = plan(2)
    store = new_store(str(out), splits)
    commit_all(store, splits)
    store.finalize({})
    again = OutputStore(spelling.format(dir=out))
    assert again.root == str(out)
    assert again.read_committed_table().num_rows == 6


def test_the_root_of_a_local_disk_stays_the_root() -> None:
    # Stripped of its slash, "/" would have become "", which is the working directory.
    assert OutputStore("/").root == "/"
    assert OutputStore("file:///").root == "/"


@pytest.mark.parametrize(
    "error",
    [PermissionError(errno.EACCES, "Permission denied"), OSError(errno.EROFS, "Read-only file system")],
    ids=["permission", "read-only"],
)
def test_a_local_folder_this_user_cannot_write_is_named_with_its_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError
) -> None:
    """Not "the object store refused access, check the credentials" (a PermissionError's message
    for a store), nor a bare OSError with exit 1: the folder, what is wrong with it, what to do."""
    import shardinfer.writers.output_store as output_store

    splits = plan(1)
    store = new_store(str(tmp_path / "out"), splits)

    def refuse(*_: object) -> None:
        raise error

    monkeypatch.setattr(output_store, "put_bytes", refuse)
    with pytest.raises(ConfigError) as info:
        store.write_part(splits[0], "a1", table_for(splits[0]), {})
    message = str(info.value)
    assert exit_code_for(info.value) == 78
    assert str(tmp_path / "out") in message and error.strerror in message
    assert "fix the permissions of that folder" in message and "output.path" in message


def test_a_file_where_the_commits_folder_goes_is_named_not_a_lost_race(tmp_path: Path) -> None:
    """Creating the folder of a marker failed with FileExistsError, which a commit reads as "another
    attempt committed first"; then reading that marker back failed with a bare NotADirectoryError."""
    out = tmp_path / "out"
    splits = plan(1)
    store = new_store(str(out), splits)
    (out / "_commits").write_text("someone's notes\n")
    part = store.write_part(splits[0], "a1", table_for(splits[0]), {})
    with pytest.raises(ConfigError) as info:
        store.commit(splits[0], part)
    assert f"{out / '_commits'} (or a folder above it) is a file, not a folder" in str(info.value)
    assert "move that file away" in str(info.value) and exit_code_for(info.value) == 78
    assert (out / "_commits").read_text() == "someone's notes\n"


def test_a_file_where_the_runs_folder_goes_is_named(tmp_path: Path) -> None:
    """Before: ten thousand create attempts, each 'failing' with FileExistsError, then "too many
    runs named ..."."""
    from shardinfer.writers.run_records import create_run_record

    out = tmp_path / "out"
    store = new_store(str(out), plan(1))
    (out / "_runs").write_text("x")
    with pytest.raises(ConfigError, match=r"_runs \(or a folder above it\) is a file, not a folder"):
        create_run_record(store, "run-1", {"state": "running"})


def test_an_output_path_below_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text("[job]\n")
    store = OutputStore(str(tmp_path / "job.toml" / "out"))
    with pytest.raises(ConfigError, match="is a file, not a folder") as info:
        store.write_job(make_job_record("r", {"hash": "ab" * 32}, plan(1)))
    assert str(tmp_path / "job.toml" / "out") in str(info.value)
    assert (tmp_path / "job.toml").read_text() == "[job]\n"


def test_an_upper_case_protocol_is_named_with_its_spelling() -> None:
    # Before: "ValueError: Protocol not known: S3", exit 1.
    with pytest.raises(ConfigError, match=r"protocols are lower case: s3://bucket/out") as info:
        OutputStore("S3://bucket/out")
    assert "'S3://bucket/out'" in str(info.value) and exit_code_for(info.value) == 78


def test_a_protocol_with_one_slash_is_not_a_local_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`s3:/bucket/out` is what fsspec takes for the local folder `s3:` in the working directory:
    a job would have written its whole output there."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"did you mean 's3://bucket/out'\?"):
        OutputStore("s3:/bucket/out")
    with pytest.raises(ConfigError, match=r"did you mean 'memory://x'\?"):
        OutputStore("memory:/x")
    assert list(tmp_path.iterdir()) == []
    # Spelled as the message says, a local folder of that name is still a local folder.
    assert OutputStore("./s3:/bucket/out").root == str(tmp_path / "s3:" / "bucket" / "out")
    assert OutputStore(f"file:{tmp_path}/out").root == str(tmp_path / "out")


def test_a_store_whose_package_is_missing_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from fsspec.registry import known_implementations

    monkeypatch.setitem(
        known_implementations,
        "nopkg",
        {"class": "no_such_package.FileSystem", "err": "install no_such_package to use nopkg://"},
    )
    with pytest.raises(
        ConfigError, match=r"'nopkg://bucket/out': this store needs a package that is not installed"
    ):
        OutputStore("nopkg://bucket/out")


def test_chained_urls_are_left_to_fsspec() -> None:
    from shardinfer.storage import filesystem

    _, path = filesystem("simplecache::memory://chained/out")
    assert path.endswith("chained/out")
