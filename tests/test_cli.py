"""The CLI through typer's CliRunner, and `sinkd stream -` as a real subprocess fed by a pipe."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sinkd.cli.main import app
from tests.support.texts import TEXT

runner = CliRunner()


def run(*args: str, input: str | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), input=input)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.unit
def test_models_list_json_names_both_models() -> None:
    code, out, _ = run("models", "list", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["smollm2-135m-instruct"]["default"] is True
    assert rows["gemma3-270m"]["adds_bos"] is True


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["receipt", "--model", "llama-70b"], 4, "not in models.lock"),
        (["stream", "nope.txt"], 2, "no such file"),
        (["stream", "-", "--window", "0"], 2, "window: must be >= 1"),
        (["stream", "-", "--evict", "300"], 2, "evict_chunk: must be in 1..window"),
    ],
)
def test_errors_are_one_line_with_an_exit_code(args: list[str], code: int, message: str) -> None:
    exit_code, out, err = run(*args, input="")
    assert exit_code == code, (out, err)
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["stream", "-", "--policy", "lru"], "--policy"),
        (["stream", "-", "--chunk", "0"], "--chunk"),
        (["stream", "-", "--evict", "0"], "--evict"),
        (["narrate", "--queue-lines", "0"], "--queue-lines"),
        (["narrate", "--on-full", "sometimes"], "--on-full"),
    ],
)
def test_out_of_range_options_are_usage_errors(args: list[str], option: str) -> None:
    """Ranges and choices are the CLI's own (typer's): exit 2, naming the option, no traceback."""
    exit_code, out, err = run(*args, input="")
    assert exit_code == 2, (out, err)
    assert option in err and "Traceback" not in err


@pytest.mark.unit
def test_missing_model_says_how_to_pull(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SINKD_HOME", str(tmp_path))
    code, _, err = run("receipt")
    assert code == 3
    assert "sinkd models pull smollm2-135m-instruct" in err


@pytest.mark.model
def test_receipt_matches_the_tensor_shapes() -> None:
    code, out, _ = run("receipt", "--sinks", "4", "--window", "252", "--json")
    assert code == 0
    r = json.loads(out)
    assert (r["layers"], r["kv_heads"], r["head_dim"], r["kv_dtype"]) == (30, 3, 64, "f16")
    assert r["bytes_per_token"] == 30 * 3 * 64 * 2 * 2
    assert r["payload_bytes_per_session"] == 256 * r["bytes_per_token"]
    assert r["allocated_cells_per_session"] == 256
    assert (
        abs(r["allocated_kv_mib_per_session"] * 2**20 - r["payload_bytes_per_session"])
        < 0.01 * 2**20
    )


@pytest.mark.model
def test_gemma_noshift_is_refused_with_a_reason(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    code, _, err = run("stream", str(text), "--model", "gemma3-270m", "--policy", "sink-noshift")
    assert code == 5 and "sliding window of 512" in err


@pytest.mark.model
def test_models_verify_checks_vocabulary_and_template() -> None:
    code, out, _ = run("models", "verify", "--json")
    assert code == 0
    r = json.loads(out)
    assert r["ok"] and r["tokenizer_sha256"].startswith("58d74fe7")


@pytest.mark.model
def test_stream_from_a_pipe_keeps_memory_flat() -> None:
    """~2,700 tokens through S=4, W=60 (forty budgets): no chunk holds more than 64 cells, and
    resident memory grows by less than 8 MiB from the second chunk to the end. The first chunk
    already evicts; between it and the second, llama.cpp's compute buffers and the allocator reach
    their steady size (about +50 MiB, once). Measured here over 8,160 tokens: 248.0 -> 248.2 MiB.
    A leak of one chunk's logits (128 x 49,152 floats, 24 MiB) would fail at the first repeat."""
    text = (TEXT + "\n") * 10
    proc = subprocess.run(
        [sys.executable, "-m", "sinkd.cli.main", "stream", "-", "--sinks", "4", "--window", "60",
         "--evict", "8", "--chunk", "128", "--json"],
        input=text.encode(), capture_output=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    chunks, receipt = lines[:-1], lines[-1]["receipt"]
    assert len(chunks) >= 15
    assert sum(c["chunk_tokens"] for c in chunks) == receipt["n_seen"] == chunks[-1]["tokens_seen"]
    evicting = [c for c in chunks if c["evicted_tokens"] > 0]
    assert all(c["retained"] <= 64 for c in chunks)
    assert receipt["retained"] + receipt["evicted_tokens"] == receipt["n_seen"]
    assert receipt["anchors_logical"] == [0, 4]
    assert all(0 < c["perplexity"] < 1000 for c in chunks)
    assert evicting[0]["chunk"] == 0
    growth = chunks[-1]["rss_bytes"] - chunks[1]["rss_bytes"]
    assert growth < 8 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB after warm-up"


@pytest.mark.model
def test_models_pull_keeps_a_verified_file() -> None:
    from sinkd.daemon.models.registry import load_lock, model_path

    path = model_path(load_lock().get(None))
    mtime = path.stat().st_mtime_ns
    code, _, err = run("models", "pull")
    assert code == 0 and "sha256 verified" in err
    assert path.stat().st_mtime_ns == mtime  # verified in place, not fetched again


@pytest.mark.model
def test_a_corrupt_model_file_is_refused_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sinkd.daemon.models.registry import load_lock, model_path

    good = model_path(load_lock().get(None)).read_bytes()
    monkeypatch.setenv("SINKD_HOME", str(tmp_path))
    (tmp_path / "models").mkdir()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    (tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(bytes(bad))
    code, _, err = run("receipt")
    assert code == 4 and "sha256 differs from models.lock" in err
    (tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(good[:1000])
    code, _, err = run("receipt")
    assert code == 4 and "size differs" in err


@pytest.mark.model
def test_an_unlisted_model_file_runs_full_only(tmp_path: Path) -> None:
    from sinkd.daemon.models.registry import load_lock, model_path

    unlisted = tmp_path / "some-other.gguf"
    unlisted.symlink_to(model_path(load_lock().get(None)))
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    code, _, err = run("stream", str(text), "--model-file", str(unlisted))
    assert code == 5 and "full policy only" in err
    code, out, err = run(
        "stream",
        str(text),
        "--model-file",
        str(unlisted),
        "--policy",
        "full",
        "--window",
        "512",
        "--json",
    )
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["receipt"]["evictions"] == 0


@pytest.mark.model
def test_eval_ppl_writes_json_and_a_plot(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    code, out, err = run("eval", "ppl", "--text", str(text), "--tokens", "200", "--policies", "sink,window,recompute",
                         "--sinks", "4", "--window", "60", "--evict", "8", "--stride", "32", "--bucket", "50",
                         "--out", str(tmp_path), "--name", "t", "--json")  # fmt: skip
    assert code == 0, err
    results = json.loads(out)
    assert [r["policy"] for r in results["runs"]] == ["sink", "window", "recompute"]
    assert all(r["scored_tokens"] == results["tokens"] - 1 for r in results["runs"])
    assert (tmp_path / "t.json").is_file() and (tmp_path / "t.png").stat().st_size > 10_000
    code, _, err = run("eval", "ppl", "--text", str(text), "--policies", "lru")
    assert code == 2 and "--policies" in err


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arm", "needle"], "--arm"),
        (["--arm", "chat", "--sources", "email"], "--sources"),
        (["--arm", "chat", "--samplings", "beam"], "--samplings"),
        (["--arm", "chat", "--presentation", "footnote"], "--presentation"),
        (["--arm", "chat", "--distances", "1000,x"], "--distances"),
    ],
)
def test_eval_recall_refuses_a_bad_arm_or_chat_option(
    args: list[str], message: str, tmp_path: Path
) -> None:
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    code, _, err = run("eval", "recall", "--text", str(text), *args)
    assert code == 2 and message in err, err


@pytest.mark.model
def test_eval_recall_chat_arm_runs_a_small_plan_and_writes_its_cells(tmp_path: Path) -> None:
    """Two facts said in conversation, asked 300 tokens on (still in the window here) in both
    wordings: the CLI runs the arm end to end and reports each trial in its cell."""
    from sinkd.daemon.models.registry import load_lock

    text = tmp_path / "t.txt"
    text.write_text((TEXT + "\n") * 40)
    code, out, err = run("eval", "recall", "--text", str(text), "--arm", "chat", "--facts", "2",
                         "--distances", "300", "--sources", "conversation", "--samplings", "greedy",
                         "--out", str(tmp_path), "--json")  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert {(t["bucket"], t["wording"]) for t in data["trials"]} == {
        (b, w) for b in ("in-window", "300") for w in ("lexical", "paraphrase")
    }
    assert len(data["trials"]) == 8
    [cell] = data["cells"]
    assert cell["trials"] == 4 and cell["tokens_back"] == 300 and cell["paraphrased_share"] == 0.5
    assert data["presentation"] == load_lock().get(None).recall_presentation  # the lock's choice
    assert (tmp_path / f"eval-recall-chat_{data['model']}_{data['presentation']}.json").is_file()


@pytest.mark.unit
@pytest.mark.parametrize(("given", "others"), [(None, 0), (None, 1), ("2", 1)])
def test_a_model_run_in_the_cli_process_shares_the_cores_unless_told(
    given: str | None, others: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes that each spin on every core slow each other ~4x (bench/two_processes.py):
    a command that runs the model here takes the cores divided by the engines decoding on this
    machine, or exactly what $SINKD_N_THREADS says."""
    from sinkd.cli import offline
    from sinkd.daemon.config import THREADS_ENV, machine_threads
    from sinkd.daemon.engine.cores import CoreShare, default_folder

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # this test's engines alone
    if given is None:
        monkeypatch.delenv(THREADS_ENV, raising=False)
    else:
        monkeypatch.setenv(THREADS_ENV, given)
    busy = [CoreShare(machine_threads(), default_folder()) for _ in range(others)]
    for other in busy:
        other.threads()  # another engine, decoding
    seen: list[int] = []
    real = offline.open_engine

    @contextlib.contextmanager
    def spy(*args: Any, **kw: Any) -> Iterator[Any]:
        with real(*args, **kw) as engine:
            seen.append(engine.threads)  # what llama.cpp's context says it runs with
            yield engine

    monkeypatch.setattr(offline, "open_engine", spy)
    try:
        code, _, _ = run("receipt", "--sinks", "4", "--window", "252", "--json")
    finally:
        for other in busy:
            other.close()
    assert code == 0
    expected = int(given) if given else max(1, machine_threads() // (1 + others))
    assert seen == [expected]


@pytest.mark.unit
def test_a_thread_count_in_the_environment_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from sinkd.daemon.config import THREADS_ENV, threads_given
    from sinkd.errors import InvalidInput

    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert threads_given() is None
    monkeypatch.setenv(THREADS_ENV, "3")
    assert threads_given() == 3
    for bad in ("0", "-2", "two", ""):
        monkeypatch.setenv(THREADS_ENV, bad)
        with pytest.raises(InvalidInput, match=THREADS_ENV):
            threads_given()


@pytest.mark.unit
def test_a_narration_prints_as_text_whatever_the_model_wrote() -> None:
    """Model output is not markup: `[/x]` made rich raise (and end narrate), `[ERROR]` vanished,
    and escape sequences reached the terminal."""
    import io

    from rich.console import Console

    from sinkd.cli.narrate import narration_line

    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(
        narration_line("12:00", "[/x] then [ERROR] disk full \x1b[2J done")
    )
    assert out.getvalue() == "12:00 [/x] then [ERROR] disk full \\x1b[2J done\n"


@pytest.mark.unit
def test_stream_holds_a_bounded_piece_of_input_without_newlines(tmp_path: Path) -> None:
    from sinkd.cli.stream import MAX_PENDING_CHARS, _read_texts

    endless = tmp_path / "one-line.txt"
    text = "é" + "abcdefgh" * 200_000  # 1.6 MB and no newline; a two-byte character first
    endless.write_text(text + "\nend")
    pieces = list(_read_texts(str(endless)))
    assert "".join(pieces) == text + "\nend"
    assert max(map(len, pieces)) <= MAX_PENDING_CHARS + 4096
    assert len(pieces) > 20


@pytest.mark.unit
def test_history_names_the_templates_an_interval_raised() -> None:
    """`sinkd narrate mute NAME ID` takes the id history prints beside INCIDENT."""
    from sinkd.cli.narrated import incident_cell
    from sinkd.daemon.runtime.api import NarratedInterval

    def interval(incidents: int, record: dict[str, Any]) -> NarratedInterval:
        return NarratedInterval("web", 3, 3, 201, 300, 0.0, 1.0, incidents, 2, json.dumps(record))

    opened = [{"template_id": 12}, {"template_id": 40}]
    assert incident_cell(interval(1, {"facts": {"opened": opened}})) == "INCIDENT (template 12, 40)"
    assert incident_cell(interval(1, {"folded": 16})) == "INCIDENT"  # a fold keeps counts only
    assert incident_cell(interval(0, {"facts": {"opened": []}})) == ""
