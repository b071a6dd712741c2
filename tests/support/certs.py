"""Test certificates: self-signed for localhost, made with openssl (a CA of its own)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def self_signed(folder: Path, name: str = "server") -> tuple[Path, Path]:
    """(certificate, key) for CN=localhost; the certificate is also the CA that signed it."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make a test certificate")
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / f"{name}.pem", folder / f"{name}-key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key
