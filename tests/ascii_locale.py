"""Running a snippet under a C locale whose default encoding is ASCII: files a model folder holds in
UTF-8 (chat templates with non-ASCII text) must be read as UTF-8 whatever the machine's locale."""

from __future__ import annotations

import subprocess
import sys


def run_in_ascii_locale(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    # Python's UTF-8 mode and locale coercion off: open() without an encoding then reads ASCII.
    env = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=60
    )
