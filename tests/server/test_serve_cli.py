"""`metalkv serve`'s flags are checked before the model loads, each mistake named."""
from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import needs_server_packages

needs_server_packages()


@pytest.mark.parametrize("flags, says", [
    (["--temperature", "-1"], "--temperature"),
    (["--presence-penalty", "3"], "--presence-penalty"),
    (["--top-p", "0"], "--top-p"),
    (["--port", "0"], "--port"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--max-calls", "0"], "--max-calls"),
])
def test_bad_flags_fail_before_loading(flags, says):
    r = subprocess.run([sys.executable, "-m", "metalkv.cli", "serve", "--model", "/nonexistent.gguf", *flags],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert says in r.stderr and "nonexistent" not in r.stderr  # refused before the model was looked for
