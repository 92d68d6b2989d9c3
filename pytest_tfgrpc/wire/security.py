"""TLS for every gRPC channel and server of a run, and the run's job-control token.

One process-wide setting, as a run has one identity: the plugin sets it from
``--tfgrpc-tls-cert/-key/-ca`` (ini twins ``tfgrpc_tls_*``), ``tfgrpc-server`` from its own
``--tls-*`` flags, and the processes a run starts read it from their environment
(:data:`ENV_VARS`), so servers, PS tasks, workers and every client agree.

* cert + key: servers serve TLS with them; clients present them (mutual TLS).
* ca: clients verify servers against it; servers with a CA require and verify client
  certificates (mutual TLS).

A server certificate must name the address clients dial (an IP SAN such as 127.0.0.1 for
``lo``): gRPC checks it as any TLS client does.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import grpc
import grpc.aio

#: Environment variables that carry the TLS files to the processes a run starts.
ENV_VARS: Final = {"cert": "TFGRPC_TLS_CERT", "key": "TFGRPC_TLS_KEY", "ca": "TFGRPC_TLS_CA"}
#: Environment variable that carries the run's job-control token to its PS processes.
TOKEN_ENV: Final = "TFGRPC_JOB_TOKEN"
#: Metadata key of the job-control token on job-control calls.
TOKEN_KEY: Final = "x-tfgrpc-job-token"
#: Environment variable of the agents' shared token (``tfgrpc-node`` and the driver read it).
AGENT_TOKEN_ENV: Final = "TFGRPC_AGENT_TOKEN"
#: Secrets a child process gets only when it is handed them by name.
SECRET_ENV: Final = (AGENT_TOKEN_ENV, TOKEN_ENV)


class SecretFileError(ValueError):
    """A secret's file cannot be read, or others than its owner could read or change it."""


def child_environ(
    environ: Mapping[str, str] | None = None, *, keep: Sequence[str] = ()
) -> dict[str, str]:
    """``environ`` (default: this process's) without the secrets of :data:`SECRET_ENV`
    other than ``keep``: the environment of a child that does not need them (a tensor
    server, a worker, a role an agent runs)."""
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if k not in SECRET_ENV or k in keep}


def read_secret_file(path: str, what: str) -> str:
    """The text of the secret file ``path`` (``what`` names it in errors), read from one
    open file after checking that file: owned by this user or root, a regular file, and
    neither readable nor writable by others, nor writable by its group (a group may read it,
    as a Kubernetes secret mounted with ``fsGroup`` is). Raises :class:`SecretFileError`,
    leading with the cause and giving the ``chmod`` to run."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        raise SecretFileError(f"{what} {path}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise SecretFileError(f"{what} {path}: not a regular file")
    with os.fdopen(fd, "rb") as file:
        if info.st_uid not in (os.geteuid(), 0):
            raise SecretFileError(
                f"{what} {path} belongs to uid {info.st_uid}, not to this user "
                f"(uid {os.geteuid()}) or root: a file another user owns can be changed by them"
            )
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o027:
            raise SecretFileError(
                f"{what} {path} is readable or writable by others (mode {mode:04o}): "
                f"run chmod 600 {path}"
            )
        try:
            return file.read(1 << 16).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SecretFileError(
                f"{what} {path}: {getattr(exc, 'strerror', None) or exc}"
            ) from None


class TlsError(ValueError):
    """TLS settings that cannot work: a missing file, a key without a certificate."""


@dataclass(frozen=True)
class TlsFiles:
    """Paths of the PEM files of a TLS setting; all None means plaintext."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None

    @property
    def enabled(self) -> bool:
        return any((self.cert, self.key, self.ca))

    @property
    def mutual(self) -> bool:
        """Whether both ends present certificates (a CA and an identity)."""
        return bool(self.ca and self.cert)

    def describe(self) -> str:
        """``off``, ``tls`` (server authenticated) or ``mtls`` (both ends): recorded with
        every result."""
        if not self.enabled:
            return "off"
        return "mtls" if self.mutual else "tls"

    def env(self) -> dict[str, str]:
        """The environment that hands this setting to a child process."""
        return {
            var: os.path.abspath(path)
            for name, var in ENV_VARS.items()
            if (path := getattr(self, name)) is not None
        }


@dataclass(frozen=True)
class TlsMaterial:
    """The PEM bytes of a :class:`TlsFiles`, read and checked once."""

    files: TlsFiles
    cert: bytes | None
    key: bytes | None
    ca: bytes | None
    #: How the options that set it are spelled (``--tfgrpc-tls-``, ``--tls-``): errors name them.
    flag_prefix: str = "--tfgrpc-tls-"

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.cert is None or self.key is None:
            raise TlsError("a TLS server needs a certificate and its key (--tfgrpc-tls-cert/-key)")
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.ca,
            require_client_auth=self.ca is not None,
        )


def _read(name: str, path: str | None, flag_prefix: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise TlsError(f"{flag_prefix}{name} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise TlsError(f"{flag_prefix}{name} {path}: not a PEM file (no '-----BEGIN' line)")
    return data


def load_tls(files: TlsFiles, flag_prefix: str = "--tfgrpc-tls-") -> TlsMaterial | None:
    """Read and check ``files``; None when TLS is off. :class:`TlsError` names the flag
    (``flag_prefix`` + cert/key/ca) and the file when a file is missing or not PEM, or when
    a certificate comes without its key or the other way round."""
    if not files.enabled:
        return None
    if (files.cert is None) != (files.key is None):
        given, missing = ("cert", "key") if files.key is None else ("key", "cert")
        raise TlsError(f"{flag_prefix}{given} needs {flag_prefix}{missing} too")
    return TlsMaterial(
        files,
        _read("cert", files.cert, flag_prefix),
        _read("key", files.key, flag_prefix),
        _read("ca", files.ca, flag_prefix),
        flag_prefix,
    )


def files_from_env(env: Mapping[str, str] | None = None) -> TlsFiles:
    """The TLS files a parent handed this process through :data:`ENV_VARS`."""
    env = os.environ if env is None else env
    return TlsFiles(**{name: env.get(var) or None for name, var in ENV_VARS.items()})


_current: TlsMaterial | None = None


def use_tls(material: TlsMaterial | None) -> None:
    """Make ``material`` the TLS setting of every channel and server this process opens."""
    global _current
    _current = material


def current_tls() -> TlsMaterial | None:
    """The process's TLS setting (None: plaintext)."""
    return _current


def tls_mode() -> str:
    """``off``, ``tls`` or ``mtls``: what :func:`current_tls` amounts to."""
    return _current.files.describe() if _current is not None else "off"


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the process's TLS setting in
    :data:`ENV_VARS` and no other, and none of the secrets :func:`child_environ` leaves out:
    what a child that dials or serves for this process gets (the native client, stream
    workers)."""
    env = {k: v for k, v in child_environ(base).items() if k not in ENV_VARS.values()}
    if _current is not None:
        env.update(_current.files.env())
    return env


def open_channel(target: str, options: Sequence[tuple[str, int]]) -> grpc.Channel:
    """A channel to ``target`` under the process's TLS setting."""
    if _current is None:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, _current.channel_credentials(), options=options)


def open_aio_channel(target: str, options: Sequence[tuple[str, int]]) -> grpc.aio.Channel:
    """An asyncio channel to ``target`` under the process's TLS setting."""
    if _current is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, _current.channel_credentials(), options=options)


def add_port(server: grpc.Server, address: str) -> int:
    """Bind ``server`` to ``address`` under the process's TLS setting; the bound port."""
    if _current is None:
        return int(server.add_insecure_port(address))
    return int(server.add_secure_port(address, _current.server_credentials()))


def new_token() -> str:
    """A fresh job-control token: a run hands it to the PS processes it starts, and only
    calls carrying it may configure or read their jobs."""
    return secrets.token_urlsafe(24)


def looks_like_tls_failure(details: str) -> bool:
    """Whether gRPC's failure text is about the TLS handshake (not a refusal or a dead
    server): gRPC gives all of them the same status code, UNAVAILABLE."""
    text = details.lower()
    words = ("ssl", "tls", "handshake", "certificate", "hostname verification")
    return any(word in text for word in words)


#: gRPC's (BoringSSL's) words for each way a server's certificate fails verification.
_NAME_MISMATCH = ("hostname verification", "peer name", "not in peer certificate")
_EXPIRED = ("certificate has expired", "certificate is not yet valid")
_UNKNOWN_CA = ("unable to get local issuer", "self signed", "self-signed", "unknown ca")


def tls_failure(
    target: str, details: str, *, flag_prefix: str | None = None, mode: str | None = None
) -> str | None:
    """The one-line error of a failed TLS handshake with ``target`` (``host:port``) from
    gRPC's ``details``, or None when they are not about TLS. It leads with what was wrong
    when gRPC says it (the certificate the host presented does not name it, has expired or
    is not yet valid, or is signed by a CA this side does not trust), names the option that
    sets what this side verifies with (``flag_prefix`` + ``ca``; default: the process's
    setting's, :func:`load_tls`) and the host, and keeps gRPC's words at the end. ``mode``:
    this side's TLS (default: :func:`tls_mode`)."""
    if not looks_like_tls_failure(details):
        return None
    flags = flag_prefix or (_current.flag_prefix if _current else "--tfgrpc-tls-")
    ca_file = _current.files.ca if flag_prefix is None and _current is not None else None
    ca = f"{flags}ca" + (f" {ca_file}" if ca_file else "")
    host = target.rsplit(":", 1)[0].strip("[]") if ":" in target else target
    text = details.lower()
    if any(word in text for word in _NAME_MISMATCH):
        cause = (
            f"the certificate {host} presented does not name {host}: the host or address "
            f"dialled must be one of its subject alternative names (checked against {ca})"
        )
    elif any(word in text for word in _EXPIRED):
        cause = (
            f"the certificate {host} presented has expired or is not yet valid (its dates, "
            f"or either host's clock; checked against {ca})"
        )
    elif any(word in text for word in _UNKNOWN_CA):
        cause = f"the certificate {host} presented is not signed by the CA of {ca}"
    else:
        cause = f"checked against {ca}"
    return (
        f"TLS handshake with {target} failed ({mode or tls_mode()} on this side): {cause}. "
        f"gRPC: {details}"
    )
