"""`costline app`: start the what-if dashboard (`streamlit run` on the packaged app/main.py).

    costline app                      # http://localhost:8501, opens a browser when there is one
    costline app --port 8600 --headless

Streamlit is the `app` extra (`pip install -e '.[app]'`); without it the command says so and
exits with status 2. Nothing heavy is imported here: the command line starts fast.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from advisor.options import clean_errors

APP_MAIN = Path(__file__).resolve().parents[2] / "app" / "main.py"


def streamlit_command(port: int, address: str, headless: bool) -> list[str]:
    """The `streamlit run` command line for the packaged app: uploads capped at the dashboard's
    limit, and no traceback details shown to whoever opens the page (they name server paths)."""
    from app import MAX_UPLOAD_MB

    return [sys.executable, "-m", "streamlit", "run", str(APP_MAIN), "--server.port", str(port),
            "--server.address", address, "--server.headless", str(headless).lower(),
            "--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer",
            "--server.maxUploadSize", str(MAX_UPLOAD_MB), "--client.showErrorDetails", "false"]


def check_address(address: str) -> None:
    """An address Streamlit can listen on: an IP address of this machine or a host name it resolves
    (refused here rather than as Streamlit's traceback after start-up)."""
    import ipaddress
    import socket

    from engine.core.host_names import is_host_name

    try:
        ipaddress.ip_address(address)
        return
    except ValueError:
        pass
    try:
        if not is_host_name(address):  # no lookup for what cannot be a name
            raise ValueError(address)
        socket.getaddrinfo(address, None)
    except (socket.gaierror, UnicodeError, ValueError):
        raise ValueError(f"--address {address!r}: not an IP address or a host name this machine knows; use "
                         "127.0.0.1 (this machine only) or 0.0.0.0 (every interface)") from None


@clean_errors
def serve(
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="port to listen on")] = 8501,
    address: Annotated[str, typer.Option("--address", help="address to listen on (0.0.0.0 = every interface)")] = "127.0.0.1",
    headless: Annotated[bool, typer.Option("--headless", help="do not open a browser")] = False,
) -> None:
    """Start the what-if dashboard (Streamlit) on a built-in workload."""
    if importlib.util.find_spec("streamlit") is None or importlib.util.find_spec("plotly") is None:
        raise ValueError("the dashboard needs the app extra: pip install -e '.[app]' (or bash dev.sh demo app)")
    if not APP_MAIN.is_file():
        raise ValueError(f"{APP_MAIN}: the dashboard is missing from this installation; reinstall costline")
    check_address(address)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(APP_MAIN.parents[1]),
                                                                    os.environ.get("PYTHONPATH")]))}
    cmd = streamlit_command(port, address, headless)
    # exec, not a child process: a signal to `costline app` (Ctrl-C, a test stopping it) reaches
    # the server itself instead of leaving it running orphaned
    os.execve(cmd[0], cmd, env)


__all__ = ["APP_MAIN", "serve", "streamlit_command"]
