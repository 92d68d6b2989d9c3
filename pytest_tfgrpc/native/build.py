"""``tfgrpc-build-native``: build the native engine into the per-user cache.

The build runs cmake in a fresh temporary directory next to the final one and renames it into
place only once every program is built, so a failed or interrupted build is never found.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pytest_tfgrpc.native import (
    APT_PACKAGES,
    CLIENT_NAME,
    FLOOR_NAME,
    SERVER_NAME,
    SOURCE_DIR,
    WORKER_NAME,
    NativeNotBuilt,
    binaries,
    build_dir,
)


class BuildError(RuntimeError):
    """A tool is missing or a build step failed; the message says which and how to fix it."""


def _run(argv: list[str], cwd: Path, quiet: bool) -> str:
    try:
        done = subprocess.run(
            argv, cwd=cwd, capture_output=quiet, text=True, check=False, timeout=1800
        )
    except FileNotFoundError:
        raise BuildError(
            f"{argv[0]} is not installed; on Debian/Ubuntu: apt-get install -y "
            + " ".join(APT_PACKAGES)
        ) from None
    if done.returncode != 0:
        output = ((done.stdout or "") + (done.stderr or "")).strip()
        tail = "\n".join(output.splitlines()[-30:])
        raise BuildError(
            f"`{' '.join(argv)}` failed with status {done.returncode}"
            + (f":\n{tail}" if tail else "")
            + f"\n(the build needs {', '.join(APT_PACKAGES)})"
        )
    return done.stdout or ""


def build(*, force: bool = False, quiet: bool = True, jobs: int = 2) -> Path:
    """Build the engine unless this version and source are built already; return its dir."""
    target = build_dir()
    if not force:
        try:
            binaries()
            return target
        except NativeNotBuilt:
            pass
    for tool in ("cmake", "pkg-config", "c++"):
        if shutil.which(tool) is None:
            raise BuildError(
                f"{tool} is not installed; on Debian/Ubuntu: apt-get install -y "
                + " ".join(APT_PACKAGES)
            )
    grpc_version = _run(["pkg-config", "--modversion", "grpc++"], SOURCE_DIR, True).strip()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as tmp:
        work = Path(tmp)
        out = work / "out"
        out.mkdir()
        _run(
            [
                "cmake",
                "-S",
                str(SOURCE_DIR),
                "-B",
                str(work / "cmake"),
                "-DCMAKE_BUILD_TYPE=Release",
            ],
            work,
            quiet,
        )
        _run(["cmake", "--build", str(work / "cmake"), "-j", str(jobs)], work, quiet)
        for name in (SERVER_NAME, CLIENT_NAME, WORKER_NAME, FLOOR_NAME):
            shutil.copy2(work / "cmake" / name, out / name)
        info = {"grpc_version": grpc_version, "source": str(SOURCE_DIR)}
        (out / "build.json").write_text(json.dumps(info, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tfgrpc-build-native",
        description="Build pytest-tfgrpc's native (C++) engine against the system's gRPC.",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if already built")
    parser.add_argument(
        "--verbose", action="store_true", help="show cmake's and the compiler's output"
    )
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (default: 2)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: at least 1")
    try:
        where = build(force=args.force, quiet=not args.verbose, jobs=args.jobs)
    except BuildError as exc:
        print(f"tfgrpc-build-native: error: {exc}", file=sys.stderr)
        return 1
    print(f"native engine built in {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
