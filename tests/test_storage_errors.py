"""Which storage errors mean "no room left": a full disk, a quota, an object store out of space."""

from __future__ import annotations

import errno

import pytest

from teibatch.storage_errors import storage_full


def client_error(code: str, status: int = 400) -> BaseException:
    """What s3fs raises for an object store's refusal: botocore's ClientError turned into an OSError."""
    botocore = pytest.importorskip("botocore.exceptions")
    s3fs_errors = pytest.importorskip("s3fs.errors")
    response = {"Error": {"Code": code, "Message": f"{code} says no"}, "ResponseMetadata": {"HTTPStatusCode": status}}
    error = botocore.ClientError(response, "PutObject")
    translated: BaseException = s3fs_errors.translate_boto_error(error)
    return translated


def raised_from_write(error: OSError) -> BaseException:
    """``error`` as a write raises it, wrapped the way a caller re-raises it."""
    def write() -> None:
        raise error

    try:
        try:
            write()
        except OSError as exc:
            raise RuntimeError("cannot write the part") from exc
    except RuntimeError as wrapped:
        return wrapped
    raise AssertionError("unreachable")


@pytest.mark.parametrize("error", [
    pytest.param(OSError(errno.ENOSPC, "No space left on device"), id="enospc"),
    pytest.param(OSError(errno.EDQUOT, "Disk quota exceeded"), id="edquot"),
    pytest.param(raised_from_write(OSError(errno.ENOSPC, "No space left on device")), id="enospc-as-cause"),
])
def test_a_full_disk_or_quota_is_storage_full(error: BaseException) -> None:
    assert storage_full(error)


@pytest.mark.parametrize(("code", "status"), [
    pytest.param("QuotaExceeded", 403, id="ceph-quota"),
    pytest.param("XMinioStorageFull", 507, id="minio-storage-full"),
    pytest.param("XMinioAdminBucketQuotaExceeded", 400, id="minio-bucket-quota"),
    pytest.param("SomethingNew", 507, id="http-507"),
])
def test_an_object_store_out_of_room_is_storage_full(code: str, status: int) -> None:
    error = client_error(code, status)
    assert isinstance(error, OSError) and error.errno == errno.EIO  # s3fs's own translation keeps no hint
    assert storage_full(error)


@pytest.mark.parametrize("error", [
    pytest.param(OSError(errno.EACCES, "Permission denied"), id="eacces"),
    pytest.param(OSError(errno.EIO, "Input/output error"), id="eio"),
    pytest.param(OSError("disk full"), id="no-errno-only-words"),
    pytest.param(ValueError("no space"), id="not-storage"),
])
def test_other_errors_are_not(error: BaseException) -> None:
    assert not storage_full(error)


@pytest.mark.parametrize(("code", "status"), [
    pytest.param("AccessDenied", 403, id="access-denied"),
    pytest.param("SlowDown", 503, id="slow-down"),
    pytest.param("InternalError", 500, id="internal"),
])
def test_other_object_store_refusals_are_not(code: str, status: int) -> None:
    assert not storage_full(client_error(code, status))
