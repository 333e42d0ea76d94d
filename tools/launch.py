"""``python -m hloalias.tools.launch -n N script.py [args]``: run ``script.py``
in N processes on this machine, as ``torchrun --nproc-per-node N`` does.

Each child gets torchrun's variables (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, a
free port), which ``hloalias.distributed.initialize()`` reads, and with
``--devices D`` XLA's forced host device count (D CPU devices per process).
Every line a child prints comes out prefixed ``[rank K]``.

The launcher's contract: it exits 0 only when every child did; when one
fails (or ``--timeout`` passes, or the launcher gets Ctrl-C/SIGTERM) it
stops the others, each child's whole process group (SIGTERM, then SIGKILL
after ``--grace`` seconds), and exits with the first failure's status
(124 for the timeout, 130 for Ctrl-C): no process outlives it."""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

#: XLA's flag for the number of CPU devices of one process.
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def child_environment(
    base: dict[str, str], rank: int, world_size: int, host: str, port: int, devices: int | None
) -> dict[str, str]:
    """``base`` with torchrun's variables for ``rank`` (and the CPU device
    count, replacing any given in ``XLA_FLAGS``)."""
    env = dict(base)
    env.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR=host, MASTER_PORT=str(port), PYTHONUNBUFFERED="1",
    )
    if devices is not None:
        flags = re.sub(rf"{DEVICE_COUNT_FLAG}=\S*", "", env.get("XLA_FLAGS", "")).split()
        env["XLA_FLAGS"] = " ".join([*flags, f"{DEVICE_COUNT_FLAG}={devices}"])
    return env


def _relay(rank: int, stream: IO[bytes], out: IO[str], lock: threading.Lock) -> None:
    """Copy ``stream`` to ``out`` line by line, each line prefixed."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            out.write(f"[rank {rank}] {line}\n")
            out.flush()
    stream.close()


def _stop(children: Sequence[subprocess.Popen[bytes]], grace: float) -> None:
    """SIGTERM each live child's process group, then SIGKILL what is left
    after ``grace`` seconds; wait for all."""
    for child in children:
        if child.poll() is None:
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for child in children:
        remaining = max(0.0, deadline - time.monotonic())
        try:
            child.wait(remaining)
        except subprocess.TimeoutExpired:
            pass
    for child in children:
        # The group too: a grandchild may outlive its parent.
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()


def launch(
    command: Sequence[str], nprocs: int, *, devices: int | None = None, host: str = "127.0.0.1",
    port: int | None = None, timeout: float | None = None, grace: float = 5.0, out: IO[str] | None = None,
) -> int:
    """Run ``command`` in ``nprocs`` processes (see the module docstring);
    return the launcher's exit status."""
    if nprocs < 1:
        raise ValueError(f"-n must be at least 1, got {nprocs}")
    out = out if out is not None else sys.stdout
    port = port if port is not None else free_port(host)
    lock = threading.Lock()
    children: list[subprocess.Popen[bytes]] = []
    relays: list[threading.Thread] = []
    status = 0
    # SIGTERM stops the ranks as Ctrl-C does (handlers: main thread only).
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if main_thread else None
    try:
        for rank in range(nprocs):
            child = subprocess.Popen(
                list(command), env=child_environment(dict(os.environ), rank, nprocs, host, port, devices),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: stopped as a whole
            )
            children.append(child)
            assert child.stdout is not None
            relay = threading.Thread(target=_relay, args=(rank, child.stdout, out, lock), daemon=True)
            relay.start()
            relays.append(relay)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            codes = [child.poll() for child in children]
            failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                rank, status = failed[0]
                with lock:
                    out.write(f"[launch] rank {rank} exited with status {status}; stopping the others\n")
                break
            if all(code == 0 for code in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                with lock:
                    out.write(f"[launch] timeout after {timeout} s; stopping every rank\n")
                status = 124
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        status = 130
    finally:
        _stop(children, grace)
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        for relay in relays:
            relay.join(timeout=5)
    if status < 0:  # killed by a signal: the shell's convention
        status = 128 - status
    return status


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hloalias.tools.launch",
        description="Run a script in N processes with torchrun's environment variables.",
    )
    parser.add_argument("-n", "--nproc", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--devices", type=int, default=None, help="CPU devices per process (XLA's forced host count)")
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=None, help="default: a free port")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before every rank is stopped")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("-m", dest="module", default=None, help="run a module, as python -m")
    parser.add_argument("script", nargs="?", help="the script (omit with -m)")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    if options.module is not None:
        rest = ([options.script] if options.script else []) + options.args
        command = [sys.executable, "-u", "-m", options.module, *rest]
    elif options.script is not None:
        command = [sys.executable, "-u", options.script, *options.args]
    else:
        parser.error("give a script (or -m module)")
    if options.nproc < 1:
        parser.error(f"-n must be at least 1, got {options.nproc}")
    return launch(
        command, options.nproc, devices=options.devices, host=options.master_addr, port=options.master_port,
        timeout=options.timeout, grace=options.grace,
    )


if __name__ == "__main__":
    sys.exit(main())
