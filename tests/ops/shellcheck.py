"""The one way the ops tier runs shellcheck on a script."""

import shutil
import subprocess

import pytest


def assert_clean(script, *options):
    """shellcheck finds nothing in ``script`` (skips, saying why, without shellcheck)."""
    shellcheck = shutil.which('shellcheck')
    if shellcheck is None:
        pytest.skip('shellcheck is not installed (apt-get install shellcheck)')
    proc = subprocess.run([shellcheck, *options, str(script)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
