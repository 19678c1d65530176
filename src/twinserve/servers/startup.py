"""A server that cannot start says why in one plain line, whichever of its processes found out.

Models load in the server's worker processes: a gunicorn worker (sync), uvicorn's app factory and lifespan (async,
hybrid), and with `--workers N` those are not the process the user started. The process that fails
(`report_failure`) logs the failure, appends its one line to the start-up report, a private file the starting
process names in `TWINSERVE_STARTUP_REPORT`, and exits the way its server expects of a worker that could not boot
(gunicorn's `Arbiter.WORKER_BOOT_ERROR`, uvicorn's `STARTUP_FAILURE`: both 3), so that the server stops instead of
starting the worker again. Once the server has stopped, the starting process reads the report's first line
(`StartupReport.check`) and raises `StartupFailed`, which the command line prints as `twinserve: error: ...`.

Models load after the server has begun to answer (live while they load, ready once loaded), so a model of the MODEL
arguments can fail when the worker process booted long ago: `stop_server` then reports the failure the same way and
tells the server to stop (SIGTERM to the process that supervises it: gunicorn's arbiter, uvicorn's supervisor of
several workers, or uvicorn's own server process), and the starting process raises `StartupFailed` once it has.

The traceback stays in the log: with the record of a failure twinserve did not expect, and at debug for one it
raised on purpose (a model's own exception was logged with its traceback where it was raised, `core/hooks.py`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable
from typing import NoReturn, TypeVar

from twinserve.core.hooks import LOG_HINT
from twinserve.core.shared import private_file
from twinserve.errors import TwinserveError

__all__ = [
    "REPORT_ENV",
    "StartupFailed",
    "StartupReport",
    "built_or_exit",
    "describe",
    "report_failure",
    "stop_server",
]

REPORT_ENV = "TWINSERVE_STARTUP_REPORT"
#: The exit status of a server that could not start: gunicorn's WORKER_BOOT_ERROR and uvicorn's STARTUP_FAILURE.
EXIT_CODE = 3

logger = logging.getLogger("twinserve.serve")

T = TypeVar("T")


class StartupFailed(TwinserveError):
    """The server stopped before serving: a model would not load, say. Its message is the one line the command
    line prints; the log has the rest. (Start-up only: never reaches a client.)"""

    exit_code = EXIT_CODE


def describe(error: BaseException) -> str:
    """`error` in one line for the operator: what failed, and why in the exception's own words. The private part a
    client never reads belongs here: whoever reads this line reads the server log."""
    if isinstance(error, TwinserveError):
        message = error.message.removesuffix(LOG_HINT)
        text = f"{message}: {error.private}" if error.private else message
    else:
        text = f"{type(error).__name__}: {error}"
    return " ".join(text.split())  # one line, whatever the exception's text spans


def report_failure(error: BaseException) -> str:
    """Log `error` as this process's start-up failure and add its line to the start-up report; the line. The line
    itself is the caller's to log (uvicorn logs the message a failed lifespan startup sends)."""
    line = describe(error)
    if isinstance(error, TwinserveError):
        logger.debug("start-up failure", exc_info=error)
    else:  # not raised on purpose: nothing logged its traceback yet
        logger.error("start-up failure", exc_info=error)
    path = os.environ.get(REPORT_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as report:
            report.write(line + "\n")  # one short append: the first process to fail is the first line
    return line


def built_or_exit(build: Callable[[], T], exit_code: int) -> T:
    """`build()`, or, if it raises, the failure reported and logged and this process ended with `exit_code`."""
    try:
        return build()
    except Exception as exc:
        _exit(exc, exit_code)


def stop_server(error: BaseException, server_pid: int) -> None:
    """A model that failed to load behind a serving port: reported as a start-up failure (logged, its line in the
    start-up report), and the server stopped gracefully by SIGTERM to `server_pid`, the process that runs it (both
    gunicorn and uvicorn document SIGTERM as their graceful stop)."""
    logger.error("%s", report_failure(error))
    with contextlib.suppress(ProcessLookupError):  # stopped already
        os.kill(server_pid, signal.SIGTERM)


def _exit(error: Exception, exit_code: int) -> NoReturn:
    logger.error("%s", report_failure(error))
    raise SystemExit(exit_code) from None


class StartupReport:
    """The start-up report of the server about to start, made in the starting process (`core/shared.py`'s private
    file, removed at exit) and named in the environment every worker process inherits."""

    def __init__(self) -> None:
        fd, self.path = private_file("twinserve-startup-")
        os.close(fd)
        os.environ[REPORT_ENV] = self.path
        #: A gunicorn worker is a fork of this process: its exit unwinds the frames it shares with the starter's.
        self.starter = os.getpid()

    def failure(self) -> str | None:
        """The first failure a process of the server reported, if any."""
        try:
            with open(self.path, encoding="utf-8") as report:
                return report.readline().strip() or None
        except OSError:
            return None

    def check(self) -> None:
        """StartupFailed if a process of the server reported a start-up failure (in the starting process only)."""
        line = self.failure() if os.getpid() == self.starter else None
        if line is not None:
            raise StartupFailed(line)
