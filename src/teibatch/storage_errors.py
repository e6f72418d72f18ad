"""The exceptions a storage backend raises when it refuses: caught at the corpus and output boundaries.

fsspec backends raise ``OSError`` for most refusals, but an object store's client library may raise
its own for missing credentials or a refused request (botocore's ``NoCredentialsError`` escapes
s3fs as it is). Those become teibatch errors naming the location, never a traceback.

A full disk, a quota reached or an object store out of room is told apart (:func:`storage_full`):
running the same command again fails the same way until space is made.
"""

from __future__ import annotations

import errno


def _storage_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [OSError]
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # no S3 support installed: nothing of botocore's can be raised
        pass
    else:
        errors += [BotoCoreError, ClientError]
    return tuple(errors)


STORAGE_ERRORS = _storage_errors()
"""``OSError`` and the installed object-store clients' own errors (credentials, refused requests)."""

CREDENTIAL_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
    "TokenRefreshRequired", "AllAccessDisabled", "InvalidClientTokenId", "UnrecognizedClientException",
})
"""S3's error codes for credentials that are wrong, expired or not allowed (``ClientError`` responses)."""
CREDENTIAL_ERROR_NAMES = frozenset({"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                                    "NoAuthTokenError", "UnauthorizedSSOTokenError"})
"""botocore's exceptions for credentials it cannot find or load, by class name (botocore is optional)."""

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""A disk with no space left, a user or project over its disk quota."""
FULL_CODES = frozenset({
    "QuotaExceeded",                   # Ceph RGW: the user's or the bucket's quota
    "XMinioStorageFull",               # MinIO: its drives are below their free-space threshold
    "XMinioAdminBucketQuotaExceeded",  # MinIO: the bucket's quota
    "InsufficientStorage",
})
"""Object stores' error codes for "no room": s3fs passes them on as ``OSError(EIO)`` raised from the
botocore ``ClientError``, whose response keeps the code."""
INSUFFICIENT_STORAGE = 507  # the HTTP status of a store that has no room (MinIO's XMinioStorageFull)


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the errors it was raised from (s3fs wraps botocore's), each once."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def credentials_problem(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, says the storage refuses the credentials:
    none found, wrong or expired, or without permission. Running again changes nothing: it is the
    configuration (the environment, ``storage_options``) that must change."""
    for current in _chain(error):
        if isinstance(current, PermissionError):
            return True
        if any(cls.__name__ in CREDENTIAL_ERROR_NAMES for cls in type(current).__mro__):
            return True
        response = getattr(current, "response", None)  # botocore's ClientError
        if isinstance(response, dict) and response.get("Error", {}).get("Code") in CREDENTIAL_CODES:
            return True
    return False


def storage_full(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, says the storage has no room left.

    Such a write fails the same way until space is freed or a quota raised: the run must say so
    rather than advise running it again as it is.
    """
    for current in _chain(error):
        if isinstance(current, OSError) and current.errno in FULL_ERRNOS:
            return True
        response = getattr(current, "response", None)  # botocore's ClientError
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in FULL_CODES or status == INSUFFICIENT_STORAGE:
                return True
    return False
