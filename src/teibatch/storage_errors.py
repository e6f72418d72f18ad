"""The exceptions a storage backend raises when it refuses: caught at the corpus and output boundaries.

fsspec backends raise ``OSError`` for most refusals, but an object store's client library may raise
its own for missing credentials or a refused request (botocore's ``NoCredentialsError`` escapes
s3fs as it is). Those become teibatch errors naming the location, never a traceback.
"""

from __future__ import annotations


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
