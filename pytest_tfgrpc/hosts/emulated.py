"""Emulated fabrics: N hosts on one machine, as network namespaces on a bridge, links rate-capped.

Each host is a network namespace with one interface (``fab0`` by default) whose other end is
enslaved to a bridge in this (the root) namespace; the bridge carries the driver's address, so
the process that builds the fabric (pytest, the driver) reaches every host across that host's
own link. Addresses come from 198.18.0.0/15 (RFC 2544's benchmarking range), one /24 per
fabric: ``.1`` is the driver (the bridge), hosts get ``.2``, ``.3``, ... in order. A host's
link can be capped with a ``tbf`` qdisc on both of its ends (``"200mbit"``, ``"1gbit"``); the
kernel needs no ``netem``. Bytes a host sends and receives are read from its link's counters
(:meth:`EmulatedFabric.counters`).

Everything made is named with one unique prefix (``tfgf<k>``, ``k`` the subnet index, chosen
under a file lock that :mod:`tests.netns`-style single links share) and recorded in a state
file under ``/run/tfgrpc-fabric``, with the pid of the process that owns it and the user who
built it (:func:`caller_uid`: the one behind ``sudo``), so that ``tfgrpc-fabric down --all``
removes only that user's fabrics on a shared machine. A fabric is
removed when its ``with`` block ends, whatever ends it (Ctrl-C is held back until teardown is
done), by an ``atexit`` hook if the block never ends, and otherwise by :func:`remove_leftovers`
(``tfgrpc-fabric down``), which removes what dead owners left. Removing a host first kills
every process still in its namespace: deleting a namespace does not end its processes.

Needs Linux, root and iproute2 (``ip``, ``tc``); :func:`can_build` says whether and why not.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_tfgrpc.wire.security import TlsFiles

__all__ = [
    "AGENT_MODULE",
    "IPV4_BENCHMARK_NET",
    "EmulatedFabric",
    "EmulatedHost",
    "FabricBuildError",
    "HostAgent",
    "HostSpec",
    "add_veth_namespace",
    "agent_pids",
    "allocation_lock",
    "build_fabric",
    "caller_uid",
    "can_build",
    "cap_rate",
    "emulated_fabric",
    "free_subnet_index",
    "ipv4_routes",
    "list_fabrics",
    "parse_hosts",
    "pid_alive",
    "rate_bits_per_s",
    "remove_fabric",
    "remove_leftovers",
    "routed_subnets",
    "run_command",
    "sigint_deferred",
    "tbf_burst_bytes",
]

IPV4_BENCHMARK_NET = ipaddress.IPv4Network("198.18.0.0/15")
MAX_SUBNETS = 512  # /24 subnets in 198.18.0.0/15
MAX_HOSTS = 200  # .2 .. .201 of a /24
DEFAULT_IFACE = "fab0"
PREFIX = "tfgf"
STATE_DIR = Path("/run/tfgrpc-fabric")
_NETNS_DIR = Path("/run/netns")
#: ``ip netns exec NS`` bind-mounts the files of /etc/netns/NS over /etc: each host gets a
#: hosts file naming every host of its fabric, so host names resolve inside hosts as on a
#: cluster.
_NETNS_ETC = Path("/etc/netns")
_SYS_NET = Path("/sys/class/net")
_HOST_NAME = re.compile(r"^[a-z][a-z0-9-]{0,15}$")
_RATE = re.compile(r"^(?P<number>\d+(?:\.\d+)?)(?P<unit>[kmgt]?)(?P<kind>bit|bps)$")
_UNIT_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
# Names other tools of this project give to what they make in the root namespace; a subnet
# index that any of them carries is taken.
_TAKEN_NAMES = (
    re.compile(r"^tfg-\d+-(?P<k>\d+)$"),  # tests/netns.py namespaces
    re.compile(r"^tfgv\d+k(?P<k>\d+)[ab]$"),  # tests/netns.py veth ends
    re.compile(rf"^{PREFIX}(?P<k>\d+)(?:br|h\d+)$"),  # fabric bridges and host links
    re.compile(rf"^{PREFIX}(?P<k>\d+)-[a-z0-9-]+$"),  # fabric host namespaces
)


class FabricBuildError(RuntimeError):
    """A fabric that could not be built or removed; the message has the failing command."""


@dataclass(frozen=True)
class HostSpec:
    """One host to build: its name (``[a-z][a-z0-9-]*``, at most 16 characters) and the rate
    its link is capped at (a ``tc`` rate such as ``"200mbit"``; None: uncapped)."""

    name: str
    rate: str | None = None


@dataclass(frozen=True)
class EmulatedHost:
    """A built host: namespace ``netns``, interface ``iface`` there with ``address``/24, and
    ``link``, the other end of its veth pair, on the bridge in the root namespace."""

    name: str
    netns: str
    iface: str
    address: str
    link: str
    rate: str | None

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside this host (``ip netns exec``), for ``Popen``."""
        return ["ip", "netns", "exec", self.netns, *argv]


@dataclass(frozen=True)
class EmulatedFabric:
    """N hosts joined by a bridge; the driver (this namespace) is ``driver_address`` on
    ``bridge``. ``owner_pid`` is the process whose exit removes it (0: kept until ``down``),
    ``owner_uid`` the user who built it (-1: not recorded). ``agent_token_file``: the token file
    of the node agents ``tfgrpc-fabric up --agents`` started in every host (absolute; "" when
    it started none), which ``tfgrpc-fabric agent`` starts again; ``agent_tf_python`` the
    TensorFlow Python they were given (``--tf-python``; "": none)."""

    name: str
    bridge: str
    driver_address: str
    prefixlen: int
    hosts: tuple[EmulatedHost, ...]
    owner_pid: int = 0
    owner_uid: int = -1
    agent_token_file: str = ""
    agent_tf_python: str = ""
    timeout: float = field(default=10.0, compare=False)

    def host(self, name: str) -> EmulatedHost:
        """The host called ``name``; KeyError naming the hosts there are otherwise."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no host {name!r} in fabric {self.name}: {[h.name for h in self.hosts]}")

    def counters(self, host: str) -> tuple[int, int]:
        """Bytes (received, sent) by ``host`` on its link so far, from the kernel's counters of
        the link's root end (what the host sends arrives there, and the reverse)."""
        link = self.host(host).link
        stats = _SYS_NET / link / "statistics"
        sent_by_host = int((stats / "rx_bytes").read_text())
        received_by_host = int((stats / "tx_bytes").read_text())
        return received_by_host, sent_by_host

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "bridge": self.bridge,
            "driver_address": self.driver_address,
            "prefixlen": self.prefixlen,
            "owner_pid": self.owner_pid,
            "owner_uid": self.owner_uid,
            "agent_token_file": self.agent_token_file,
            "agent_tf_python": self.agent_tf_python,
            "hosts": [vars(h) for h in self.hosts],
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> EmulatedFabric:
        """The fabric a state file describes. Raises ValueError (and KeyError, TypeError) if
        it names anything a fabric of its name would not have: removing it removes what it
        names (namespaces, their /etc/netns files, links, the bridge)."""
        hosts = data["hosts"]
        assert isinstance(hosts, list)
        fabric = cls(
            name=str(data["name"]),
            bridge=str(data["bridge"]),
            driver_address=str(data["driver_address"]),
            prefixlen=int(str(data["prefixlen"])),
            hosts=tuple(EmulatedHost(**h) for h in hosts),
            owner_pid=int(str(data.get("owner_pid", 0))),
            owner_uid=int(str(data.get("owner_uid", -1))),
            agent_token_file=str(data.get("agent_token_file", "")),
            agent_tf_python=str(data.get("agent_tf_python", "")),
        )
        fabric.check_names()
        return fabric

    def check_names(self) -> None:
        """Raise ValueError naming each name that is not the one this module gives a fabric
        of this name (``tfgfK``, bridge ``tfgfKbr``, host i's link ``tfgfKhI`` and namespace
        ``tfgfK-HOST``): a state file naming a path outside /etc/netns or an interface the
        fabric never made is not followed."""
        wrong = [] if re.fullmatch(rf"{PREFIX}\d+", self.name) else [f"name {self.name!r}"]
        if self.bridge != f"{self.name}br":
            wrong.append(f"bridge {self.bridge!r}")
        for i, host in enumerate(self.hosts):
            if host.link != f"{self.name}h{i}":
                wrong.append(f"link {host.link!r}")
            if not _HOST_NAME.match(host.name) or host.netns != f"{self.name}-{host.name}":
                wrong.append(f"namespace {host.netns!r}")
        if wrong:
            raise ValueError(f"fabric state {self.name!r} names {', '.join(wrong)}: not its own")


def issue_certificates(fabric: EmulatedFabric, where: Path) -> dict[str, TlsFiles]:
    """A fresh CA in ``where`` (``ca.pem``), and a certificate for each host's address, named
    for the host too, and one for the driver's address (``_driver``), that the CA signed: the
    mutual-TLS files of a run across ``fabric``, by host name. Needs ``trustme`` (the dev
    extra): raises :class:`ImportError` without it."""
    import trustme

    from pytest_tfgrpc.wire.security import TlsFiles

    ca = trustme.CA()
    ca_path = where / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    out = {}
    names = [("_driver", fabric.driver_address), *((h.name, h.address) for h in fabric.hosts)]
    for name, address in names:
        leaf = ca.issue_cert(address, *([] if name.startswith("_") else [name]))
        cert, key = where / f"{name}.pem", where / f"{name}-key.pem"
        leaf.private_key_pem.write_to_path(str(key))
        for i, pem in enumerate(leaf.cert_chain_pems):
            pem.write_to_path(str(cert), append=i > 0)
        out[name] = TlsFiles(str(cert), str(key), str(ca_path))
    return out


def parse_hosts(text: str, default_rate: str | None = None) -> tuple[HostSpec, ...]:
    """Hosts from ``"ps0,ps1@200mbit,w0"`` (``name[@rate]``, comma-separated) or a count
    (``"4"``: ``h0`` .. ``h3``); ``default_rate`` caps those without their own rate.

    Raises ValueError quoting the bad name or rate.
    """
    text = text.strip()
    if text.isdigit():
        count = int(text)
        if not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"host count {count} must be from 1 to {MAX_HOSTS}")
        specs = tuple(HostSpec(f"h{i}", default_rate) for i in range(count))
    else:
        parts = [part.strip() for part in text.split(",")]
        specs = tuple(
            HostSpec(name, rate or default_rate)
            for name, _, rate in (part.partition("@") for part in parts)
        )
    _check_specs(specs)
    return specs


def rate_bits_per_s(rate: str) -> int:
    """A ``tc`` rate in bits per second: ``"200mbit"`` -> 200_000_000; as ``tc`` reads it,
    ``bps`` is bytes per second (``"10mbps"`` -> 80_000_000). ValueError otherwise."""
    match = _RATE.match(rate.strip().lower())
    if match is None:
        raise ValueError(f"rate {rate!r} is not a tc rate such as '200mbit', '1gbit' or '10mbps'")
    bits = float(match["number"]) * _UNIT_SCALE[match["unit"]]
    if match["kind"] == "bps":
        bits *= 8
    if bits < 8000:
        raise ValueError(f"rate {rate!r} is below 8kbit, which tbf cannot shape usefully")
    return int(bits)


def tbf_burst_bytes(rate: str, burst: str | None = None) -> int:
    """The ``tbf`` bucket for ``rate``: ``burst`` bytes if given, else 10 ms at that rate and at
    least 32 KiB (a smaller bucket cannot pass a 64 KiB GSO packet at once)."""
    bits = rate_bits_per_s(rate)
    if burst is not None:
        if not burst.isdigit() or int(burst) <= 0:
            raise ValueError(f"burst {burst!r} must be a positive number of bytes")
        return int(burst)
    return max(bits // 8 // 100, 32 * 1024)


def caller_uid() -> int:
    """The user a fabric is built for: the one who ran ``sudo`` (``$SUDO_UID``) when this
    process is root through it, else this process's real uid."""
    sudo = os.environ.get("SUDO_UID", "")
    return int(sudo) if os.getuid() == 0 and sudo.isdigit() else os.getuid()


def can_build() -> tuple[bool, str]:
    """Whether this process can build fabrics, and if not, why (platform, root, iproute2)."""
    if not sys.platform.startswith("linux"):
        return False, f"emulated fabrics need Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, f"emulated fabrics need root to make network namespaces (euid {os.geteuid()})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"emulated fabrics need the iproute2 '{tool}' command, not on PATH"
    return True, "emulated fabrics can be built"


def run_command(
    args: Sequence[str], *, timeout: float, check: bool = True, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``args`` (bounded by ``timeout`` s); with ``check``, a failure raises
    :class:`FabricBuildError` showing the command, its status and its stderr."""
    try:
        result = subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout, input=input
        )
    except subprocess.TimeoutExpired as exc:
        raise FabricBuildError(f"'{' '.join(args)}' did not finish within {timeout:g} s") from exc
    if check and result.returncode != 0:
        raise FabricBuildError(
            f"'{' '.join(args)}' exited with status {result.returncode}:"
            f" {result.stderr.strip() or result.stdout.strip() or '(no output)'}"
        )
    return result


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C until the block is done, then deliver it, so cleanup is not cut short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            signal.raise_signal(signal.SIGINT)


@contextlib.contextmanager
def allocation_lock(timeout: float) -> Iterator[None]:
    """An inter-process lock held while a subnet index is chosen and put to use."""
    lock_dir = Path("/run/lock") if Path("/run/lock").is_dir() else Path(tempfile.gettempdir())
    handle: IO[bytes]
    with open(lock_dir / "pytest-tfgrpc-netns.lock", "ab") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise FabricBuildError(
                        f"another process held {handle.name} for more than {timeout:g} s"
                    ) from exc
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


#: Route types ``ip route`` prints before a route's destination.
_ROUTE_TYPES = frozenset(
    {"unicast", "local", "broadcast", "multicast", "blackhole", "unreachable", "prohibit"}
    | {"throw", "nat", "anycast"}
)


def ipv4_routes() -> list[ipaddress.IPv4Network]:
    """The destinations of every IPv4 route of this namespace, in every routing table
    (``ip -4 route show table all``), the default routes left out."""
    listing = run_command(["ip", "-o", "-4", "route", "show", "table", "all"], timeout=10.0)
    out = []
    for line in listing.stdout.splitlines():
        words = line.split()
        if words and words[0] in _ROUTE_TYPES:
            words = words[1:]
        if not words or words[0] == "default":
            continue
        try:
            out.append(ipaddress.IPv4Network(words[0], strict=False))
        except ValueError:
            continue
    return out


def routed_subnets(routes: Iterable[ipaddress.IPv4Network]) -> set[int]:
    """The /24 indices of 198.18.0.0/15 that ``routes`` send somewhere already: a fabric
    there would take another host's traffic, or lose its own."""
    base = int(IPV4_BENCHMARK_NET.network_address)
    taken: set[int] = set()
    for route in routes:
        if not route.overlaps(IPV4_BENCHMARK_NET):
            continue
        first = max(int(route.network_address), base)
        last = min(int(route.broadcast_address), int(IPV4_BENCHMARK_NET.broadcast_address))
        taken.update(range((first - base) >> 8, ((last - base) >> 8) + 1))
    return taken


def free_subnet_index(
    routes: Callable[[], Iterable[ipaddress.IPv4Network]] = ipv4_routes,
) -> int:
    """The lowest /24 index of 198.18.0.0/15 that no interface, namespace or root-namespace
    address made by this project uses and no route of this namespace covers (``routes``:
    the route table's destinations; tests inject one). Call it under
    :func:`allocation_lock`."""
    used: set[int] = set()
    names = list(os.listdir(_SYS_NET))
    if _NETNS_DIR.is_dir():
        names += os.listdir(_NETNS_DIR)
    for name in names:
        for pattern in _TAKEN_NAMES:
            match = pattern.match(name)
            if match is not None:
                used.add(int(match["k"]))
    listing = run_command(["ip", "-o", "-4", "addr", "show"], timeout=10.0).stdout
    for token in re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", listing):
        address = ipaddress.IPv4Address(token)
        if address in IPV4_BENCHMARK_NET:
            used.add((int(address) - int(IPV4_BENCHMARK_NET.network_address)) >> 8)
    used |= routed_subnets(routes())
    for k in range(MAX_SUBNETS):
        if k not in used:
            return k
    raise FabricBuildError(
        f"all {MAX_SUBNETS} test subnets of {IPV4_BENCHMARK_NET} are in use or routed elsewhere"
    )


def add_veth_namespace(netns: str, root_if: str, ns_if: str, *, timeout: float) -> list[str]:
    """Make namespace ``netns`` and a veth pair: ``root_if`` here, ``ns_if`` in the namespace.
    Returns the command prefix that runs inside it (``ip netns exec NETNS``)."""
    run_command(["ip", "netns", "add", netns], timeout=timeout)
    run_command(
        ["ip", "link", "add", root_if, "type", "veth", "peer", "name", ns_if, "netns", netns],
        timeout=timeout,
    )
    return ["ip", "netns", "exec", netns]


def cap_rate(prefix: Sequence[str], ifname: str, rate: str, burst: int, *, timeout: float) -> None:
    """Cap what ``ifname`` sends at ``rate`` with a ``tbf`` qdisc of ``burst`` bytes (``prefix``
    runs the command in a namespace)."""
    run_command(
        [*prefix, "tc", "qdisc", "add", "dev", ifname, "root", "tbf", "rate", rate,
         "burst", str(burst), "latency", "50ms"],
        timeout=timeout,
    )  # fmt: skip


def _check_specs(specs: Sequence[HostSpec]) -> None:
    if not specs:
        raise ValueError("a fabric needs at least one host")
    if len(specs) > MAX_HOSTS:
        raise ValueError(f"{len(specs)} hosts: a fabric has at most {MAX_HOSTS}")
    seen: set[str] = set()
    for spec in specs:
        if not _HOST_NAME.match(spec.name):
            raise ValueError(
                f"host name {spec.name!r}: use a lowercase letter, then up to 15 lowercase"
                " letters, digits or '-'"
            )
        if spec.name in seen:
            raise ValueError(f"host name {spec.name!r} is given twice")
        seen.add(spec.name)
        if spec.rate is not None:
            rate_bits_per_s(spec.rate)


def build_fabric(
    hosts: Sequence[HostSpec],
    *,
    iface: str = DEFAULT_IFACE,
    owner_pid: int | None = None,
    timeout: float = 10.0,
    agent_token_file: str = "",
    agent_tf_python: str = "",
) -> EmulatedFabric:
    """Build a fabric of ``hosts`` and return it; remove it with :func:`remove_fabric`.

    ``owner_pid`` (default: this process) is the process whose death makes the fabric a
    leftover for :func:`remove_leftovers`; 0 keeps it until removed by name. Its owner user
    is :func:`caller_uid`. ``agent_token_file`` records the token of the agents the caller
    starts in its hosts, ``agent_tf_python`` the TensorFlow Python they get. Anything half
    built is removed before the error propagates. Prefer
    :func:`emulated_fabric`.
    """
    _check_specs(hosts)
    if not 1 <= len(iface) <= 15 or not re.match(r"^[a-z][a-z0-9]*$", iface):
        raise ValueError(f"interface name {iface!r}: 1-15 lowercase letters and digits")
    remove_leftovers()
    owner = os.getpid() if owner_pid is None else owner_pid
    with allocation_lock(timeout):
        k = free_subnet_index()
        net = ipaddress.IPv4Network((int(IPV4_BENCHMARK_NET.network_address) + (k << 8), 24))
        name = f"{PREFIX}{k}"
        fabric = EmulatedFabric(
            name=name,
            bridge=f"{name}br",
            driver_address=str(net[1]),
            prefixlen=24,
            hosts=tuple(
                EmulatedHost(
                    name=spec.name,
                    netns=f"{name}-{spec.name}",
                    iface=iface,
                    address=str(net[i + 2]),
                    link=f"{name}h{i}",
                    rate=spec.rate,
                )
                for i, spec in enumerate(hosts)
            ),
            owner_pid=owner,
            owner_uid=caller_uid(),
            agent_token_file=agent_token_file,
            agent_tf_python=agent_tf_python,
            timeout=timeout,
        )
        _write_state(fabric)
        try:
            _create(fabric)
        except BaseException:
            with sigint_deferred():
                remove_fabric(fabric, quiet=True)
            raise
    if owner == os.getpid():
        _OWNED[fabric.name] = fabric
    return fabric


@contextlib.contextmanager
def emulated_fabric(
    hosts: Sequence[HostSpec], *, iface: str = DEFAULT_IFACE, timeout: float = 10.0
) -> Iterator[EmulatedFabric]:
    """Build a fabric for the ``with`` block and remove it (processes, namespaces, links)
    however the block ends."""
    fabric = build_fabric(hosts, iface=iface, timeout=timeout)
    try:
        yield fabric
    finally:
        failed = sys.exc_info()[0] is not None
        with sigint_deferred():
            remove_fabric(fabric, quiet=failed)


def remove_fabric(fabric: EmulatedFabric, *, quiet: bool = False) -> None:
    """Kill every process in the fabric's namespaces, delete them, their links and the bridge,
    and the state file. Raises FabricBuildError if anything is left (warns with ``quiet``)."""
    problems: list[str] = []
    for host in fabric.hosts:
        if (_NETNS_DIR / host.netns).exists():
            _kill_namespace_processes(host.netns, fabric.timeout)
        for args in (["ip", "link", "del", "dev", host.link], ["ip", "netns", "del", host.netns]):
            with contextlib.suppress(FabricBuildError):
                run_command(args, timeout=fabric.timeout, check=False)
        shutil.rmtree(_NETNS_ETC / host.netns, ignore_errors=True)
        if (_SYS_NET / host.link).exists():
            problems.append(f"link {host.link} still exists")
        if (_NETNS_DIR / host.netns).exists():
            problems.append(f"namespace {host.netns} still exists")
    with contextlib.suppress(FabricBuildError):
        run_command(
            ["ip", "link", "del", "dev", fabric.bridge], timeout=fabric.timeout, check=False
        )
    if (_SYS_NET / fabric.bridge).exists():
        problems.append(f"bridge {fabric.bridge} still exists")
    _OWNED.pop(fabric.name, None)
    if not problems:
        for path in (STATE_DIR / f"{fabric.name}.json", *STATE_DIR.glob(f"{fabric.name}-*.log")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return
    message = f"could not remove fabric {fabric.name}: " + "; ".join(problems)
    if not quiet:
        raise FabricBuildError(message)
    warnings.warn(message, RuntimeWarning, stacklevel=2)


def list_fabrics() -> tuple[EmulatedFabric, ...]:
    """The fabrics whose state files exist (built and not yet removed), by name."""
    if not STATE_DIR.is_dir():
        return ()
    found = []
    for path in sorted(STATE_DIR.glob(f"{PREFIX}*.json")):
        try:
            found.append(EmulatedFabric.from_json(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError, AssertionError):
            continue
    return tuple(found)


def remove_leftovers(*, everything: bool = False, uid: int | None = None) -> list[str]:
    """Remove fabrics whose owner process is gone (``everything``: all fabrics of user
    ``uid``, or of every user when ``uid`` is None), and any namespace, link or bridge named
    with the fabric prefix that no fabric accounts for. Returns what was removed."""
    removed: list[str] = []
    kept: set[str] = set()
    for fabric in list_fabrics():
        owner_gone = fabric.owner_pid != 0 and not pid_alive(fabric.owner_pid)
        if (everything and uid in (None, fabric.owner_uid)) or owner_gone:
            remove_fabric(fabric, quiet=True)
            removed.append(fabric.name)
        else:
            kept.add(fabric.name)
    # Pieces with no state file: a build killed between creating them and writing the file.
    stray_ns = re.compile(rf"^({PREFIX}\d+)-[a-z0-9-]+$")
    stray_if = re.compile(rf"^({PREFIX}\d+)(?:br|h\d+)$")
    if _NETNS_DIR.is_dir():
        for name in sorted(os.listdir(_NETNS_DIR)):
            match = stray_ns.match(name)
            if match and match[1] not in kept and not _state_exists(match[1]):
                _kill_namespace_processes(name, 10.0)
                run_command(["ip", "netns", "del", name], timeout=10.0, check=False)
                shutil.rmtree(_NETNS_ETC / name, ignore_errors=True)
                removed.append(name)
    for name in sorted(os.listdir(_SYS_NET)):
        match = stray_if.match(name)
        if match and match[1] not in kept and not _state_exists(match[1]):
            run_command(["ip", "link", "del", "dev", name], timeout=10.0, check=False)
            removed.append(name)
    return removed


_OWNED: dict[str, EmulatedFabric] = {}


@atexit.register
def _remove_owned() -> None:
    for fabric in list(_OWNED.values()):
        remove_fabric(fabric, quiet=True)


def _state_exists(name: str) -> bool:
    return (STATE_DIR / f"{name}.json").exists()


def _write_state(fabric: EmulatedFabric) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    path = STATE_DIR / f"{fabric.name}.json"
    path.write_text(json.dumps(fabric.to_json(), indent=1))


def _create(fabric: EmulatedFabric) -> None:
    t = fabric.timeout
    run_command(["ip", "link", "add", fabric.bridge, "type", "bridge"], timeout=t)
    cidr = f"/{fabric.prefixlen}"
    run_command(
        ["ip", "addr", "add", fabric.driver_address + cidr, "dev", fabric.bridge], timeout=t
    )
    run_command(["ip", "link", "set", "dev", fabric.bridge, "up"], timeout=t)
    for host in fabric.hosts:
        ns = add_veth_namespace(host.netns, host.link, host.iface, timeout=t)
        run_command(["ip", "link", "set", "dev", host.link, "master", fabric.bridge], timeout=t)
        run_command([*ns, "ip", "addr", "add", host.address + cidr, "dev", host.iface], timeout=t)
        if host.rate is not None:
            bits = f"{rate_bits_per_s(host.rate)}bit"
            burst = tbf_burst_bytes(host.rate)
            for prefix, ifname in (([], host.link), (ns, host.iface)):
                cap_rate(prefix, ifname, bits, burst, timeout=t)
        run_command([*ns, "ip", "link", "set", "dev", "lo", "up"], timeout=t)
        run_command([*ns, "ip", "link", "set", "dev", host.iface, "up"], timeout=t)
        run_command(["ip", "link", "set", "dev", host.link, "up"], timeout=t)
    names = "".join(f"{host.address}\t{host.name}\n" for host in fabric.hosts)
    for host in fabric.hosts:
        etc = _NETNS_ETC / host.netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost\n{names}")
    deadline = time.monotonic() + t
    for host in fabric.hosts:
        operstate = _SYS_NET / host.link / "operstate"
        while operstate.read_text().strip() != "up":
            if time.monotonic() > deadline:
                raise FabricBuildError(f"link {host.link} of {host.name} did not come up in {t} s")
            time.sleep(0.02)


def _kill_namespace_processes(netns: str, timeout: float) -> None:
    """SIGTERM every process in ``netns``; SIGKILL what is left after half of ``timeout`` s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + timeout / 2
        while time.monotonic() < deadline:
            listing = run_command(["ip", "netns", "pids", netns], timeout=timeout, check=False)
            pids = [int(p) for p in listing.stdout.split() if p.isdigit()]
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            time.sleep(0.1)


#: How an agent process names itself on its command line (``python -m`` its module).
AGENT_MODULE = "pytest_tfgrpc.hosts.agent"


def agent_pids(host: EmulatedHost, timeout: float = 10.0) -> list[int]:
    """The node agents (``tfgrpc-node``) running in ``host``'s namespace."""
    listing = run_command(["ip", "netns", "pids", host.netns], timeout=timeout, check=False)
    found = []
    for pid in (int(p) for p in listing.stdout.split() if p.isdigit()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if AGENT_MODULE.encode() in argv or any(a.endswith(b"/tfgrpc-node") for a in argv):
            found.append(pid)
    return found


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class HostAgent:
    """A node agent (``tfgrpc-node``) running inside an emulated host, a child of this process.

    It stops when this process ends (its stdin is our pipe), on :meth:`stop`, or with the
    host's namespace; :meth:`kill` ends it abruptly (SIGKILL), as a crashed host would.
    """

    def __init__(
        self,
        host: EmulatedHost,
        token_file: str,
        *,
        ready_timeout: float = 30.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        """Start ``tfgrpc-node`` in ``host`` with ``extra_args`` (e.g. its TLS files) and wait
        up to ``ready_timeout`` s until it serves (ServerError with its stderr otherwise)."""
        from pytest_tfgrpc.roles.processes import ChildProcess

        argv = host.command(
            [sys.executable, "-m", AGENT_MODULE, "--fabric", host.iface,
             "--port", "0", "--token-file", token_file, "--host-name", host.name,
             "--exit-on-stdin-eof", *extra_args]
        )  # fmt: skip
        self.host = host
        self._child = ChildProcess(argv, name=f"agent on {host.name}")
        try:
            self.target = str(self._child.read_ready_line(ready_timeout)["target"])
        except BaseException:
            self._child.stop()
            raise

    @property
    def pid(self) -> int:
        """The agent's pid (the ``ip netns exec`` it ran as became the agent)."""
        return self._child.pid

    def kill(self) -> None:
        """SIGKILL the agent: its roles lose their stdin and end, drivers see it gone."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._child.pid, signal.SIGKILL)

    def stop(self) -> int:
        """Stop the agent (stdin EOF; it stops its roles first); its exit status."""
        return self._child.stop()
