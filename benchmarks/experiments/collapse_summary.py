"""Summarize py-spy collapsed stacks (``-f raw``): where the sampled time goes.

    python benchmarks/experiments/collapse_summary.py FILE [FILE ...] [--top 12]

For each file: the samples, the share of each category (by the frame a sample was spent in,
native frames included), and the top self frames with their share. Categories:

- ``copy``: memcpy/memmove (user-space copies; the kernel's socket copies are not visible);
- ``syscall``: a libc system-call wrapper (sendmsg, recvmsg, read, write, epoll/poll, futex...);
- ``grpc core``: other native frames of grpcio's ``cygrpc`` extension (core and Cython glue);
- ``python``: the interpreter (``libpython``/``python``) running Python code, attributed to the
  nearest Python frame's file: ``ours`` (pytest_tfgrpc), ``grpc glue`` (grpc/*.py and the
  Cython ``.pyx.pxi`` sources), ``asyncio``, ``other``;
- ``other native``: anything else (numpy, libc malloc, ...).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

COPY = re.compile(r"\b(__)?mem(cpy|move)|memcpy|memmove")
SYSCALL = re.compile(r"^(__)?(libc_)?(sendmsg|recvmsg|send|recv|read|write|writev|readv)\b")
#: A thread asleep: polling for events, or blocked on a lock or a condition.
WAIT_LEAF = re.compile(
    r"^(epoll_wait|epoll_pwait|poll|ppoll|select|clock_nanosleep|nanosleep|sem_wait|"
    r"sem_timedwait|pthread_cond_(timed)?wait|__futex_abstimed_wait_common)\b"
)
WAIT_FRAME = re.compile(
    r"^(PyThread_acquire_lock_timed|lock_PyThread_acquire_lock|Condition\.wait|"
    r"pthread_cond_(timed)?wait|sem_wait|sem_timedwait|_watch_stdin|_read_stdin_until_eof)\b"
)


@dataclass(frozen=True)
class Frame:
    name: str
    where: str  # "file.py:line" for Python frames, a library for native ones

    @property
    def python(self) -> bool:
        return ".py" in self.where or ".pxi" in self.where or ".pyx" in self.where


def parse_frame(text: str) -> Frame:
    m = re.match(r"^(.*) \(([^()]*)\)$", text)
    if not m:
        return Frame(text, "")
    return Frame(m.group(1), m.group(2))


def python_category(frame: Frame) -> str:
    where = frame.where
    if "pytest_tfgrpc" in where or "/benchmarks/" in where:
        return "python: ours"
    if "grpc" in where or ".pxi" in where or ".pyx" in where:
        return "python: grpc glue"
    if "asyncio" in where:
        return "python: asyncio"
    return "python: other"


def waiting(stack: Sequence[Frame]) -> bool:
    """A sample of a thread asleep (py-spy with ``--native`` samples idle threads too)."""
    if WAIT_LEAF.search(stack[-1].name):
        return True
    # Unsymbolized libc frames under a lock acquisition are the futex wait itself; the
    # server's stdin watcher sits in read() for the whole run.
    return any(WAIT_FRAME.search(f.name) for f in stack)


def category(stack: Sequence[Frame]) -> str:
    leaf = stack[-1]
    if waiting(stack):
        return "waiting (epoll, lock, condition)"
    if leaf.python:
        return python_category(leaf)
    if COPY.search(leaf.name):
        return "copy (memcpy/memmove)"
    if SYSCALL.search(leaf.name):
        return "socket syscall (send/recv/read/write)"
    lib = leaf.where.lower()
    if "cygrpc" in lib or "grpc" in lib:
        return "grpc core (native)"
    if "python" in lib or leaf.name.startswith(("_Py", "Py")):
        for frame in reversed(stack):
            if frame.python:
                return python_category(frame)
        return "python: other"
    return "other native"


@dataclass(frozen=True)
class Summary:
    path: str
    samples: int
    busy: int  # samples not waiting
    categories: tuple[tuple[str, float], ...]
    top: tuple[tuple[str, float], ...]
    inclusive: tuple[tuple[str, float], ...]


INCLUSIVE: dict[str, Callable[[Sequence[Frame]], bool]] = {
    "any pytest_tfgrpc frame": lambda st: any("pytest_tfgrpc" in f.where for f in st),
    "codec (encode/decode)": lambda st: any("codec.py" in f.where for f in st),
    "memcpy/memmove": lambda st: COPY.search(st[-1].name) is not None,
    "malloc/free": lambda st: st[-1].name.startswith(("malloc", "free", "_int_", "cfree")),
}


def summarize(path: Path, top: int) -> Summary:
    cats: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    busy = 0
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text or not count_text.isdigit():
            continue
        count = int(count_text)
        stack = [parse_frame(f) for f in stack_text.split(";") if f]
        if not stack:
            continue
        total += count
        cat = category(stack)
        cats[cat] += count
        if cat.startswith("waiting"):
            continue
        busy += count
        leaf = stack[-1]
        where = leaf.where.rsplit("/", 1)[-1]
        leaves[f"{leaf.name} ({where})"] += count
        for name, test in INCLUSIVE.items():
            if test(stack):
                incl[name] += count

    def share(count: int) -> float:
        return count / total if total else 0.0

    def busy_share(count: int) -> float:
        return count / busy if busy else 0.0

    return Summary(
        str(path),
        total,
        busy,
        tuple((k, share(v)) for k, v in cats.most_common()),
        tuple((k, busy_share(v)) for k, v in leaves.most_common(top)),
        tuple((k, busy_share(incl[k])) for k in INCLUSIVE),
    )


def render(s: Summary) -> str:
    out = [f"### {Path(s.path).name}: {s.samples} thread samples, {s.busy} not waiting"]
    out.append(
        "all samples, by the frame each was spent in: "
        + ", ".join(f"{k} {v:.0%}" for k, v in s.categories)
    )
    out.append(
        "of the samples not waiting, inclusive: "
        + ", ".join(f"{k} {v:.0%}" for k, v in s.inclusive)
    )
    out.append("top self frames of the samples not waiting:")
    out += [f"  {v:6.1%}  {k}" for k, v in s.top]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args(argv)
    for path in args.files:
        print(render(summarize(path, args.top)))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
