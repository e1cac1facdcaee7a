"""Waits with an end: a test that waits on another process gives up after a set time instead of
hanging the suite."""

import subprocess
import threading
import time


def readline_within(process: subprocess.Popen, seconds: float) -> str:
    """The next line of `process`'s stdout; if none comes within `seconds`, the process is
    killed (so the read ends, with whatever was written) and the line returned may be empty."""
    timer = threading.Timer(seconds, process.kill)
    timer.start()
    try:
        return process.stdout.readline()  # bounded: the timer kills the writer
    finally:
        timer.cancel()


def wait_for(condition, seconds: float, process: subprocess.Popen) -> bool:
    """Whether `condition()` came true within `seconds`, polled while `process` runs (checked
    once more after it exits, for what it wrote last)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        if process.poll() is not None:
            return condition()
        time.sleep(0.2)
    return False
