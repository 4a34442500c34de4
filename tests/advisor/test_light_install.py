"""The light install (`pip install -e .`, what `bash dev.sh demo` gets) has only the core dependencies:
the command line must start without the packages the test extra brings along (click came with
streamlit; typer carries its own since 0.2x, and the demo broke on a fresh machine)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# packages of the extras (engine/test/app/serve) or their dependencies, never of the core
NOT_IN_CORE = ("click", "torch", "triton", "streamlit", "plotly", "fastapi", "uvicorn", "aiohttp", "ray", "pyarrow")


def test_the_cli_starts_without_the_extras_packages():
    code = textwrap.dedent(f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {NOT_IN_CORE!r}:
                    raise ImportError("not in the light install: " + name)
        sys.meta_path.insert(0, Block())
        from costline.cli import app
        from typer.testing import CliRunner
        r = CliRunner().invoke(app, ["simulate", "--help"])
        assert r.exit_code == 0, r.output
        print("ok", len(r.output.splitlines()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ok ") and int(out.stdout.split()[1]) > 20
