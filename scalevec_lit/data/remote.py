"""Object storage: the one client through which everything remote is read and written.

A prepared folder may live in an S3-compatible bucket (AWS S3, MinIO, Ceph, Cloudflare R2, Google Cloud
Storage's XML API, ...): ``s3://bucket/prefix``. ``Remote`` is the only code that talks to it, through
boto3 (which litdata depends on): ``prepare --output s3://...`` uploads with it (``publish``), and the data
module reads ``meta.json``, ``tokenizer.json`` and the ``index.json`` of each split with it and streams the
chunks with it (``cache.py`` registers it with litdata as the downloader of ``s3://``).

Where the endpoint and the credentials come from: boto3's standard chain (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``,
``~/.aws/config`` and ``credentials``, instance roles), or explicitly ``data.storage_options`` (the
``--storage-option KEY=VALUE`` of prepare), whose keys are ``STORAGE_KEYS``.

Every request is tried ``retries`` times (default 6) when the endpoint cannot be reached or answers with
a server error (5xx, throttling), waiting ``retry_wait`` seconds (default 1) and twice as long after each
failure (at most 30 s); the connection and each read of an attempt wait at most ``timeout`` seconds
(default 60). Then
a ``RunError`` names the URL, what the endpoint said and the fix; so do a missing bucket or object and
rejected credentials, at once (no retry can fix them). A bucket that does not exist exits 2, as a local
folder that does not exist does (``cache.mirror``: so does a prefix that holds nothing, or no ``meta.json``).

Other schemes that litdata streams from (``gs://``, ``azure://``, ``hf://``, ``r2://``, ...) need clients
that are not installed; they are refused with the S3-compatible way to reach the same storage.

Must not import Lightning or torch.
"""
from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import RunError, UserError

#: the keys of ``data.storage_options``: boto3's client arguments, the profile, and the retry policy
STORAGE_KEYS = ("endpoint_url", "aws_access_key_id", "aws_secret_access_key", "aws_session_token", "region_name",
                "profile", "retries", "retry_wait", "timeout")
RETRIES, RETRY_WAIT, MAX_WAIT, TIMEOUT = 6, 1.0, 30.0, 60.0
REFUSED = {
    "gs": "Google Cloud Storage serves the S3 API: use s3://BUCKET/PREFIX with data.storage_options "
          "{endpoint_url: https://storage.googleapis.com} and an HMAC key as aws_access_key_id/aws_secret_access_key",
    "azure": "Azure Blob Storage has no S3 API here: copy the prepared folder to an S3-compatible bucket or a "
             "local/shared disk",
    "r2": "Cloudflare R2 serves the S3 API: use s3://BUCKET/PREFIX with data.storage_options "
          "{endpoint_url: https://ACCOUNT.r2.cloudflarestorage.com}",
}
_BLOCK = 1 << 22


def is_remote(path: Any) -> bool:
    return "://" in str(path)


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts if p)])


def check_options(options: Optional[dict], key: str = "data.storage_options") -> dict:
    """``storage_options`` as a plain dict; a ``UserError`` naming an unknown key."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise UserError(key, repr(options), "not a mapping", "give e.g. {endpoint_url: http://host:9000}")
    unknown = sorted(set(options) - set(STORAGE_KEYS))
    if unknown:
        raise UserError(key, unknown[0], "not a storage option", f"use any of {', '.join(STORAGE_KEYS)}")
    return dict(options)


def _scheme(url: str, key: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of an ``s3://`` URL; a ``UserError`` for another scheme or no bucket."""
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme != "s3":
        hint = REFUSED.get({"gcs": "gs", "az": "azure", "abfs": "azure", "abfss": "azure"}.get(scheme, scheme))
        raise UserError(key, url, f"{scheme}:// is not supported (only s3://, for any S3-compatible endpoint)",
                        hint or "use s3://BUCKET/PREFIX on an S3-compatible endpoint, or a local/shared folder")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise UserError(key, url, "names no bucket", "give s3://BUCKET/PREFIX")
    return bucket, prefix.strip("/")


class Remote:
    """A folder in a bucket (``url``) and the boto3 client that reaches it (one per process)."""

    def __init__(self, url: str, storage_options: Optional[dict] = None, key: str = "data.data_dir") -> None:
        self.url, self.key = url.rstrip("/"), key
        self.bucket, self.prefix = _scheme(self.url, key)
        self.options = check_options(storage_options, "data.storage_options" if key.startswith("data.")
                                     else "--storage-option")
        self.retries = max(1, int(self.options.get("retries", RETRIES)))
        self.retry_wait = float(self.options.get("retry_wait", RETRY_WAIT))
        self._client, self._pid = None, None
        #: the end of an endpoint-down fix: advice for a fit; a command that is not a fit sets it to ""
        self.resume_hint = "; a fit stopped by this resumes with --ckpt_path last once it is back"

    def __getstate__(self) -> dict:  # a boto3 client is neither picklable nor fork-safe: made again where used
        return {**self.__dict__, "_client": None, "_pid": None}

    @property
    def client(self):
        if self._client is None or self._pid != os.getpid():
            import boto3
            from botocore.config import Config

            o = self.options
            session = boto3.Session(profile_name=o["profile"]) if o.get("profile") else boto3.Session()
            timeout = float(o.get("timeout", TIMEOUT))
            config = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=timeout,
                            read_timeout=timeout)  # this class retries, with its own bounded backoff
            args = {k: o[k] for k in ("endpoint_url", "aws_access_key_id", "aws_secret_access_key",
                                      "aws_session_token", "region_name") if o.get(k) is not None}
            self._client, self._pid = session.client("s3", config=config, **args), os.getpid()
        return self._client

    def endpoint(self) -> str:
        try:
            return self.client.meta.endpoint_url
        except Exception:  # noqa: BLE001 - only for a message
            return "the configured endpoint"

    def key_of(self, rel: str) -> str:
        return "/".join(p for p in (self.prefix, rel.strip("/")) if p)

    # -- every request goes through here -------------------------------------------------------------
    def call(self, what: str, rel: str, fn: Callable[[], Any], missing_ok: bool = False) -> Any:
        """``fn()`` with bounded retries; a ``RunError`` naming the URL, the cause and the fix."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

        url = join(self.url, rel) if rel else self.url
        wait = self.retry_wait
        for attempt in range(1, self.retries + 1):
            try:
                return fn()
            except (NoCredentialsError, PartialCredentialsError) as err:
                raise RunError(self.key, url, f"no credentials for the endpoint ({err})", _CRED_FIX) from None
            except ClientError as err:
                code = str(err.response.get("Error", {}).get("Code", ""))
                status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
                if code in ("NoSuchKey", "404", "NotFound") and missing_ok:
                    return None
                if not (status >= 500 or code in _TRANSIENT):
                    raise self._client_error(url, what, code, status, err) from None
                cause = f"{code or status}: {err}"
            except (BotoCoreError, OSError) as err:  # connection refused or reset, timeouts, DNS
                cause = f"{type(err).__name__}: {err}"
            if attempt == self.retries:
                raise RunError(self.key, url, f"{what} failed {self.retries} times, the last with {cause} (endpoint "
                               f"{self.endpoint()})", "check that the endpoint is up and reachable (AWS_ENDPOINT_URL "
                               "or data.storage_options endpoint_url)" + self.resume_hint) from None
            time.sleep(min(wait, MAX_WAIT) * (0.5 + random.random() / 2))
            wait *= 2

    def _client_error(self, url: str, what: str, code: str, status: int, err: Exception) -> RunError:
        if code == "NoSuchBucket":  # missing, as a local folder that does not exist: exit 2
            return RunError(self.key, url, f"the bucket {self.bucket!r} does not exist at {self.endpoint()}",
                            "create it, or correct the bucket name or the endpoint (AWS_ENDPOINT_URL or "
                            "data.storage_options endpoint_url)", exit_code=2)
        if code in ("NoSuchKey", "404", "NotFound"):
            return RunError(self.key, url, f"{what}: no such object in the bucket", "prepare the data there "
                            f"(python -m scalevec_lit prepare --output {self.url}) or correct the prefix")
        if code in _AUTH or status in (401, 403):
            return RunError(self.key, url, f"{what}: the endpoint {self.endpoint()} refused the credentials "
                            f"({code or status})", _CRED_FIX)
        return RunError(self.key, url, f"{what}: {code or status}: {err}", "check the URL, the endpoint and the "
                        "credentials")

    # -- operations ---------------------------------------------------------------------------------
    def read(self, rel: str, missing_ok: bool = False) -> Optional[bytes]:
        def get():
            body = self.client.get_object(Bucket=self.bucket, Key=self.key_of(rel))["Body"]
            return body.read()

        return self.call("reading", rel, get, missing_ok=missing_ok)

    def listing(self, rel: str = "") -> dict[str, int]:
        """Every object under ``rel`` (relative name -> size in bytes)."""
        base = self.key_of(rel)
        base = f"{base}/" if base else ""

        def list_all():
            out: dict[str, int] = {}
            token: dict = {}
            while True:
                page = self.client.list_objects_v2(Bucket=self.bucket, Prefix=base, **token)
                for obj in page.get("Contents", []):
                    out[obj["Key"][len(base):]] = int(obj["Size"])
                if not page.get("IsTruncated"):
                    return out
                token = {"ContinuationToken": page["NextContinuationToken"]}

        return self.call("listing", rel, list_all)

    def download(self, rel: str, dest: Path, size: Optional[int] = None, sha256: Optional[str] = None,
                 fix: str = "") -> None:
        """``rel`` into ``dest`` (written beside it, then renamed), its size and SHA-256 checked on the way. Each
        thread writes its own file (``<name>.tmp.<thread>.<pid>``): two threads of a process may fetch the same
        chunk at once (two data modules over one bucket, a reader's last download and the next reader's)."""
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f"{dest.name}.tmp.{threading.get_ident()}.{os.getpid()}")  # the pid last: cache.py
        digest = hashlib.sha256()

        def get():
            body = self.client.get_object(Bucket=self.bucket, Key=self.key_of(rel))["Body"]
            digest.__init__()  # a retried attempt starts the hash again
            with open(tmp, "wb") as fh:
                while block := body.read(_BLOCK):
                    digest.update(block)
                    fh.write(block)
            return True

        try:
            found = self.call("downloading", rel, get, missing_ok=True)
            url = join(self.url, rel)
            fix = fix or f"prepare that folder again: python -m scalevec_lit prepare ... --output {self.url} --overwrite"
            if found is None:  # listed when the run checked the folder at its start: deleted since (a fit's chunk)
                raise RunError(self.key, url, f"missing: index.json lists this chunk{f' ({size} bytes)' if size else ''}"
                               " but the bucket no longer has it (deleted after the run started)", fix + (
                                   "; a fit stopped by this resumes with --ckpt_path last once the folder is prepared "
                                   "again from the same input" if self.resume_hint else ""))
            have = tmp.stat().st_size
            if size is not None and have != int(size):
                raise RunError(self.key, url, f"{have} bytes downloaded: prepare recorded {size} bytes in meta.json "
                               "(the object was replaced or cut short)", fix)
            if sha256 is not None and digest.hexdigest() != sha256:
                raise RunError(self.key, url, "corrupt: the SHA-256 of the downloaded bytes differs from the one "
                               "prepare recorded in meta.json (same size, other bytes)", fix)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def upload(self, src: Path, rel: str) -> None:
        self.call("uploading", rel, lambda: self.client.upload_file(str(src), self.bucket, self.key_of(rel)))

    def delete(self, rels: list[str]) -> None:
        for i in range(0, len(rels), 1000):
            keys = [{"Key": self.key_of(r)} for r in rels[i:i + 1000]]
            self.call("deleting", "", lambda: self.client.delete_objects(Bucket=self.bucket,
                                                                         Delete={"Objects": keys}))


_TRANSIENT = {"Throttling", "ThrottlingException", "SlowDown", "RequestTimeout", "RequestTimeTooSkewed",
              "InternalError", "ServiceUnavailable"}
_AUTH = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken", "InvalidToken",
         "AuthorizationHeaderMalformed"}
_CRED_FIX = ("set the credentials of that endpoint: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in "
             "the environment, or data.storage_options {aws_access_key_id: ..., aws_secret_access_key: ...}")
