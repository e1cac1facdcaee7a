"""Waits with an end: a test that waits on another process gives up after a set time instead of
hanging the suite."""

import subprocess
import threading


def readline_within(process: subprocess.Popen, seconds: float) -> str:
    """The next line of `process`'s stdout; if none comes within `seconds`, the process is
    killed (so the read ends, with whatever was written) and the line returned may be empty."""
    timer = threading.Timer(seconds, process.kill)
    timer.start()
    try:
        return process.stdout.readline()  # bounded: the timer kills the writer
    finally:
        timer.cancel()
