"""Every FERRY_* variable that the Python package or its torch extension reads is in docs/env.md
(generated from src/core/env.cpp, where the package's own variables have a table of their own), so
that the list users read is complete and the library's startup log does not call them typos."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_variable_the_package_reads_is_documented():
    documented = set(re.findall(r"^\| `([A-Z0-9_]+)` \|", (ROOT / "docs" / "env.md").read_text(), re.M))
    sources = [*(ROOT / "python" / "ferry").rglob("*.py"), *(ROOT / "python" / "torch_backend").glob("*.cpp")]
    read = set()
    for path in sources:
        text = path.read_text()
        read |= set(re.findall(r"""environ(?:\.get)?[\[(]\s*["'](FERRY_[A-Z0-9_]+)""", text))
        read |= set(re.findall(r"""getenv\(\s*["'](FERRY_[A-Z0-9_]+)""", text))
        read |= set(re.findall(r"""envIs\(\s*"(FERRY_[A-Z0-9_]+)""", text))
    assert {"FERRY_FUSED_PIPELINE", "FERRY_TORCH_FORWARD", "FERRY_SOCKET_IFNAME"} <= read  # the scan works
    assert not read - documented, f"read by the package but not in docs/env.md: {sorted(read - documented)}"
