"""Open WebUI in front of sinkd, driven in headless Chromium: what a real chat UI sends, and what
sinkd does with each request.

    /opt/owui-venv/bin/python bench/open_webui.py        -> bench/results/open_webui.json
                                                            bench/results/open_webui/*.png

It installs nothing. It needs, and names what is missing:
  - Open WebUI in a virtual environment of its own (it pulls torch):
        python3 -m venv /opt/owui-venv && /opt/owui-venv/bin/pip install open-webui==0.12.4 selenium
    and this script run with that environment's python (selenium), or OPEN_WEBUI=/path/to/open-webui;
  - Debian's chromium and chromium-driver (`apt-get install chromium chromium-driver`);
  - sinkd installed (SINKD=/path/to/sinkd; default: the project's .venv/bin/sinkd) and the default
    model pulled (`sinkd models pull`).

Three chats of eight turns each, interleaved (a turn of each in turn), with a regenerate of one
reply and an edit of one user message, then back to the first chat. Open WebUI's own side requests
stay on (titles, tags, follow-up suggestions); its built-in tools are off (36 functions, more than
a session pins: sinkd answers without them and says so), unless OWUI_DEFAULTS=1, Open WebUI as
shipped (results in open_webui_as_shipped.json; OWUI_TURNS and OWUI_CHATS shorten the run).
OWUI_MEMORY=1 instead: the tenant keeps a memory across its conversations; one chat says "Please
remember this: my locker code is 4417.", a new chat asks "What is my locker code?", and the run
records where the second chat's recall came from (open_webui_memory.json, a screenshot of each). The
model's replies are bounded at 384
tokens in Open WebUI's model settings (OWUI_REPLY_TOKENS; 0: unbounded, as the UI's default sends
none): unbounded, this small model's recipes and lists run to sinkd's 4,096-token cap, minutes a
turn on two cores. Between Open WebUI and sinkd a
recording proxy notes, for every request sinkd answered: its kind (main turn, title, tags,
follow-ups; told from Open WebUI's task prompts, which are its own text, never stored), how sinkd
continued it, the tokens it read, time to first byte, status; at the end the sessions resident and
parked, and a screenshot of each chat. No prompt or reply text is written anywhere. Not in CI: it
takes about 15 minutes here.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import task_answers  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SHOTS = RESULTS / (
    "open_webui_memory"
    if os.environ.get("OWUI_MEMORY") == "1"
    else "open_webui_as_shipped"
    if os.environ.get("OWUI_DEFAULTS") == "1"
    else "open_webui"
)
TOKEN = "owui-bench-token"
ADMIN = "owui-bench-admin"
MODEL = "smollm2-135m-instruct"
TURNS = int(os.environ.get("OWUI_TURNS", "8"))
CHATS = int(os.environ.get("OWUI_CHATS", "3"))
REPLY_TIMEOUT_S = 400.0
REPLY_TOKENS = int(os.environ.get("OWUI_REPLY_TOKENS", "384"))
# OWUI_DEFAULTS=1: Open WebUI as shipped, its built-in tools on (36 functions with every chat turn)
AS_SHIPPED = os.environ.get("OWUI_DEFAULTS") == "1"
# OWUI_MEMORY=1: the tenant keeps a memory across its conversations; one chat states a fact and asks
# for it to be remembered, a new chat asks for it (results in open_webui_memory.json)
MEMORY = os.environ.get("OWUI_MEMORY") == "1"
NAME = "open_webui_memory" if MEMORY else "open_webui_as_shipped" if AS_SHIPPED else "open_webui"
REMEMBER = "Please remember this: my locker code is 4417."
ASK = "What is my locker code?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- what is needed, named when missing ---


def requirements() -> dict[str, str]:
    found = {
        "sinkd": os.environ.get("SINKD") or str(ROOT / ".venv" / "bin" / "sinkd"),
        "open-webui": os.environ.get("OPEN_WEBUI")
        or shutil.which("open-webui")
        or str(Path(sys.executable).parent / "open-webui"),
        "chromium": shutil.which("chromium") or "",
        "chromedriver": shutil.which("chromedriver") or "",
    }
    missing = [name for name, path in found.items() if not path or not Path(path).exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (in this python)")
    if missing:
        sys.exit(
            "missing: "
            + ", ".join(missing)
            + "\n"
            + (__doc__ or "").split("It installs nothing.")[1]
        )
    return found


# --- the recording proxy ---


# the first line of each of Open WebUI's task prompts (its config's DEFAULT_*_PROMPT_TEMPLATE)
TASKS = {
    "Generate a concise title": "title",
    "Generate 1-3 broad tags": "tags",
    "Predict 3-5 useful messages": "follow-ups",
    "Analyze the chat history to determine the necessity of generating search": "query",
    "You are an autocompletion system": "autocomplete",
}


def kind_of(body: dict[str, Any]) -> str:
    """Open WebUI's task requests are one user message holding its own task prompt; the rest are
    the chat's turns."""
    messages = body.get("messages") or []
    last = messages[-1].get("content", "") if messages else ""
    text = last if isinstance(last, str) else json.dumps(last)
    for opening, kind in TASKS.items():
        if opening in text[:400]:
            return kind
    return "task" if text.startswith("### Task:") else "main"


@dataclass
class Record:
    kind: str
    status: int
    messages: int
    continuation: str = ""
    why_class: str = ""
    read_tokens: int | None = None
    n_seen: int | None = None
    residency: str = ""
    restored_ms: float = 0.0
    ttfb_ms: float = 0.0
    total_ms: float = 0.0
    session: str = ""
    error: str = ""
    tools_sent: int = 0  # functions in the request's `tools`
    tools: str = ""  # x-sinkd-tools: pinned, or not offered and why (counts only)
    # a side request's answer as Open WebUI reads it (bench/task_answers.py): "object" (the JSON
    # object it asked for), "copied" (its values words of the prompt), "placeholder" (a value the
    # prompt shows as its placeholder or example), "prose"
    form: str = ""
    output_note: bool = False  # x-sinkd-output: sinkd decoded it under the object's grammar
    # the conversations (session ids) of the passages its recall brought from other conversations
    recalled_from: list[str] = field(default_factory=list)


@dataclass
class Recorder:
    upstream: int
    records: list[Record] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    statuses: list[tuple[str, int]] = field(default_factory=list)  # every request: path, status


def why_class(why: str) -> str:
    """The reason's shape without its ids or text: what a reader needs to count."""
    for key in ("match", "first turn", "took these turns", "gone", "dropped", "taken back", "room"):
        if key in why:
            return key
    return why[:40]


def make_proxy(recorder: Recorder) -> type[http.server.BaseHTTPRequestHandler]:
    class Proxy(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # no request lines on the console
            pass

        def do_GET(self) -> None:
            self._forward(None)

        def do_POST(self) -> None:
            n = int(self.headers.get("content-length", "0"))
            self._forward(self.rfile.read(n))

        def _forward(self, data: bytes | None) -> None:
            t0 = time.perf_counter()
            body = json.loads(data) if data and self.path.endswith("/chat/completions") else None
            with recorder.lock:
                recorder.in_flight += 1
            try:
                self._relay(data, body, t0)
            finally:
                with recorder.lock:
                    recorder.in_flight -= 1

        def _relay(self, data: bytes | None, body: dict[str, Any] | None, t0: float) -> None:
            up = http.client.HTTPConnection("127.0.0.1", recorder.upstream, timeout=600)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host",)}
            up.request(self.command, self.path, body=data, headers=headers)
            resp = up.getresponse()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            first: float | None = None
            tail = b""
            while True:
                piece = resp.read1(65536)
                if not piece:
                    break
                if first is None:
                    first = time.perf_counter()
                tail = (tail + piece)[-65536:]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            with recorder.lock:
                recorder.statuses.append((self.path.split("?")[0], resp.status))
            if body is None:
                return
            rec = Record(
                kind_of(body), resp.status, len(body.get("messages") or []),
                continuation=resp.getheader("x-sinkd-continuation", ""),
                why_class=why_class(resp.getheader("x-sinkd-why", "")),
                session=resp.getheader("x-sinkd-session", ""),
                ttfb_ms=1000 * ((first or time.perf_counter()) - t0),
                total_ms=1000 * (time.perf_counter() - t0),
                tools_sent=len(body.get("tools") or []),
                tools=resp.getheader("x-sinkd-tools", ""),
                output_note=bool(resp.getheader("x-sinkd-output")),
            )  # fmt: skip
            if rec.kind in TASK_KEYS and resp.status == 200:
                rec.form = form_of(tail, rec.kind, body)
            ext = extension_of(tail)
            if ext is not None:
                receipt = ext.get("receipt") or {}
                rec.read_tokens = ext.get("read_tokens")
                rec.n_seen = receipt.get("n_seen")
                rec.residency = receipt.get("residency", "")
                rec.restored_ms = receipt.get("restored_ms", 0.0)
                recalled = (ext.get("recall") or {}).get("recalled") or []
                rec.recalled_from = [r["conversation"] for r in recalled if r.get("conversation")]
            elif resp.status != 200:
                rec.error = tail.decode(errors="replace")[-300:]
            with recorder.lock:
                recorder.records.append(rec)

    return Proxy


TASK_KEYS = {"title": "title", "tags": "tags", "follow-ups": "follow_ups"}


def form_of(tail: bytes, kind: str, body: dict[str, Any]) -> str:
    """How Open WebUI reads a task's answer, as a class (bench/task_answers.py). Only the class
    is kept."""
    try:
        content = json.loads(tail)["choices"][0]["message"]["content"] or ""
    except (ValueError, KeyError, IndexError, TypeError):
        return "prose"
    prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages") or [])
    return task_answers.classify(content, TASK_KEYS[kind], prompt)[0]


def extension_of(tail: bytes) -> dict[str, Any] | None:
    """The `sinkd` field of the answer (its last SSE chunk, or the JSON body)."""
    text = tail.decode(errors="replace")
    for line in reversed(text.splitlines()):
        line = line.removeprefix("data: ").strip()
        if '"sinkd"' in line:
            try:
                return dict(json.loads(line)["sinkd"])
            except (ValueError, KeyError):
                return None
    return None


# --- the processes ---


def start_sinkd(sinkd: str, tmp: Path, port: int) -> subprocess.Popen[bytes]:
    import hashlib

    config = tmp / "sinkd.toml"
    config.write_text(
        f'admin_token_sha256 = "{hashlib.sha256(ADMIN.encode()).hexdigest()}"\n'
        f"memory_across_conversations = {'true' if MEMORY else 'false'}\n"
        f'[[tenants]]\nname = "owui"\ntoken_sha256 = "{hashlib.sha256(TOKEN.encode()).hexdigest()}"\n'
    )
    with open(tmp / "sinkd.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [sinkd, "serve", "--config", str(config), "--socket", str(tmp / "sinkd.sock"),
             "--state-dir", str(tmp / "state"), "--http", f"127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
    wait_http(f"http://127.0.0.1:{port}/v1/models", 120, {"authorization": f"Bearer {TOKEN}"})
    return proc


def start_open_webui(binary: str, tmp: Path, port: int, proxy: int) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ,
        DATA_DIR=str(tmp / "owui"),
        WEBUI_AUTH="False",
        ENABLE_OLLAMA_API="False",
        OPENAI_API_BASE_URL=f"http://127.0.0.1:{proxy}/v1",
        OPENAI_API_KEY=TOKEN,
        ENABLE_WEB_SEARCH="False",
        ENABLE_CODE_INTERPRETER="False",
        ENABLE_IMAGE_GENERATION="False",
        ENABLE_BUILTIN_TOOLS="False",
        ENABLE_AUTOCOMPLETE_GENERATION="False",
        OFFLINE_MODE="True",
        HF_HUB_OFFLINE="1",
        RAG_EMBEDDING_MODEL_AUTO_UPDATE="False",
        BYPASS_EMBEDDING_AND_RETRIEVAL="True",
        ENABLE_VERSION_UPDATE_CHECK="False",
        WEBUI_SECRET_KEY="bench",
        SCARF_NO_ANALYTICS="true",
        DO_NOT_TRACK="true",
        ANONYMIZED_TELEMETRY="false",
    )
    (tmp / "owui").mkdir()
    with open(tmp / "owui.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [binary, "serve", "--host", "127.0.0.1", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    wait_http(f"http://127.0.0.1:{port}/health", 600)
    return proc


def wait_http(url: str, timeout: float, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, headers=headers or {}), timeout=5
            ):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{url} did not answer within {timeout:.0f} s")


class Proxy:
    """The recording proxy in a thread of this process."""

    def __init__(self, upstream: int) -> None:
        self.recorder = Recorder(upstream)
        self.port = free_port()
        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", self.port), make_proxy(self.recorder)
        )
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self) -> int:
        with self.recorder.lock:
            return len(self.recorder.records)

    def records(self) -> list[Record]:
        with self.recorder.lock:
            return list(self.recorder.records)

    def statuses(self) -> list[tuple[str, int]]:
        with self.recorder.lock:
            return list(self.recorder.statuses)

    def idle(self) -> bool:
        with self.recorder.lock:
            return self.recorder.in_flight == 0


# --- the browser ---

CHAT_TOPICS = [
    ["What is a river?", "Where do rivers begin?", "Why do rivers bend?", "What is a delta?",
     "Name a long river.", "How do floods happen?", "What lives in rivers?", "Thanks. Summarize."],
    ["How do I bake bread?", "What does yeast do?", "How long should dough rise?",
     "Why knead the dough?", "What flour is best?", "How hot should the oven be?",
     "Why is my crust pale?", "Thanks. Summarize."],
    ["What is a planet?", "How many planets orbit the Sun?", "Which planet is largest?",
     "What is a moon?", "Why is Mars red?", "What is an asteroid?", "How far is Jupiter?",
     "Thanks. Summarize."],
]  # fmt: skip
REGENERATE_AT = (0, 3)  # chat 0: its 4th reply is regenerated
EDIT_AT = (1, 5)  # chat 1: its 6th message is edited and sent again


class Browser:
    def __init__(self, base: str, proxy: Proxy) -> None:
        from selenium import webdriver

        opts = webdriver.ChromeOptions()
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                    "--window-size=1400,1000"):  # fmt: skip
            opts.add_argument(arg)
        opts.binary_location = shutil.which("chromium") or "chromium"
        service = webdriver.ChromeService(shutil.which("chromedriver") or "chromedriver")
        self.d = webdriver.Chrome(options=opts, service=service)
        self.base = base
        self.proxy = proxy
        self.errors: list[str] = []
        self.notes_seen = False

    def open(self, path: str) -> None:
        from selenium.webdriver.common.by import By

        self.d.get(self.base + path)
        self.wait_for(lambda: self.d.find_elements(By.ID, "chat-input"), 60)
        if not self.notes_seen:  # the release notes open over the chat on the first visit
            notes = '//button[contains(., "Okay, Let\'s Go!")]'
            self.wait_for(lambda: self.d.find_elements(By.XPATH, notes), 20)[0].click()
            self.notes_seen = True
        time.sleep(0.5)  # the chat's messages render after its input

    def send(self, text: str) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys

        box = self.d.find_element(By.ID, "chat-input")
        box.click()
        box.send_keys(text)
        box.send_keys(Keys.ENTER)

    def regenerate(self) -> None:
        from selenium.webdriver.common.by import By

        buttons = self.d.find_elements(By.CSS_SELECTOR, "button[aria-label='Regenerate']")
        self.d.execute_script("arguments[0].click()", buttons[-1])
        again = "//*[self::button or @role='menuitem'][contains(., 'Try Again')]"
        found = self.wait_for(lambda: self.d.find_elements(By.XPATH, again), 10)
        self.d.execute_script("arguments[0].click()", found[-1])  # its menu: the plain retry

    def edit_last_user_message(self, text: str) -> None:
        from selenium.webdriver.common.by import By

        users = self.d.find_elements(By.CSS_SELECTOR, "#messages-container .user-message")
        last = users[-1]
        edit = [b for b in last.find_elements(By.CSS_SELECTOR, "button")
                if b.get_attribute("aria-label") == "Edit"]  # fmt: skip
        self.d.execute_script("arguments[0].click()", edit[0])
        area = self.wait_for(lambda: last.find_elements(By.CSS_SELECTOR, "textarea"), 10)[0]
        area.clear()
        area.send_keys(text)
        self.d.find_element(By.ID, "confirm-edit-message-button").click()

    def settle(self, before: int) -> None:
        """Until the turn's reply and the side requests after it are answered: a chat request
        recorded since `before`, then nothing in flight for four seconds."""
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        quiet_since: float | None = None
        while time.monotonic() < deadline:
            done = any(r.kind == "main" for r in self.proxy.records()[before:])
            if done and self.proxy.idle():
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= 4.0:
                    self.collect_errors()
                    return
            else:
                quiet_since = None
            time.sleep(0.25)
        self.d.save_screenshot(str(SHOTS / "stuck.png"))
        kinds = [(r.kind, r.status, r.continuation) for r in self.proxy.records()[before:]]
        raise SystemExit(f"a turn was not answered in time; since it: {kinds}")

    def collect_errors(self) -> None:
        from selenium.webdriver.common.by import By

        for toast in self.d.find_elements(
            By.CSS_SELECTOR, "[data-sonner-toast][data-type='error']"
        ):
            self.errors.append("toast")  # its text may quote the chat: only counted
            del toast
        for _ in self.d.find_elements(By.CSS_SELECTOR, "#messages-container [class*='text-red']"):
            self.errors.append("error in a message")

    def wait_for(self, probe: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = probe()
            if found:
                return found
            time.sleep(0.2)
        raise SystemExit("the page did not show what was expected")

    def titles(self) -> dict[str, str]:
        """Every chat's title (id -> title), as Open WebUI's own API gives them to its sidebar;
        compared with each chat's first message, never stored."""
        script = """
            const done = arguments[arguments.length - 1];
            fetch('/api/v1/chats/?page=1', {headers: {Authorization: 'Bearer ' + localStorage.token}})
                .then(r => r.json()).then(done, e => done([]));
        """
        chats = self.d.execute_async_script(script)
        return {c["id"]: c.get("title", "") for c in chats if isinstance(c, dict)}


def drive(browser: Browser) -> tuple[list[str], list[int]]:
    """Three chats, a turn of each in turn; returns each chat's path and where each main turn's
    records start."""
    paths = ["/"] * CHATS
    marks: list[int] = []
    for turn in range(TURNS):
        for c in range(CHATS):
            browser.open(paths[c])
            before = browser.proxy.count()
            browser.send(CHAT_TOPICS[c][turn])
            browser.settle(before)
            marks.append(before)
            print(f"chat {c} turn {turn}: {browser.proxy.count()} requests so far", flush=True)
            if paths[c] == "/":
                paths[c] = "/c/" + browser.d.current_url.split("/c/")[-1]
            if (c, turn) == REGENERATE_AT:
                before = browser.proxy.count()
                browser.regenerate()
                browser.settle(before)
            if (c, turn) == EDIT_AT:
                before = browser.proxy.count()
                browser.edit_last_user_message(CHAT_TOPICS[c][turn] + " Answer briefly.")
                browser.settle(before)
    browser.open(paths[0])  # back to the first chat, after the others
    before = browser.proxy.count()
    browser.send("One more thing: what did we talk about first?")
    browser.settle(before)
    return paths, marks


def drive_memory(browser: Browser) -> tuple[list[str], list[int]]:
    """A chat states a fact and asks for it to be remembered; a new chat asks for it."""
    paths: list[str] = []
    marks: list[int] = []
    for text in (REMEMBER, ASK):
        browser.open("/")
        before = browser.proxy.count()
        browser.send(text)
        browser.settle(before)
        marks.append(before)
        paths.append("/c/" + browser.d.current_url.split("/c/")[-1])
        print(f"chat {len(paths)}: {browser.proxy.count()} requests so far", flush=True)
    return paths, marks


def kept_memory(port: int) -> list[dict[str, Any]]:
    """The tenant's memory across conversations, as its owner lists it (ids, speaker, turn; the
    text is not kept here)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/sinkd/memory", headers={"authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        data = json.loads(r.read())["data"]
    return [{k: p[k] for k in ("id", "conversation", "speaker", "turn", "asked")} for p in data]


def sessions(sinkd: str, sock: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sinkd, "sessions", "list", "--connect", f"unix:{sock}", "--token", TOKEN, "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return list(json.loads(out.stdout))


def main() -> None:
    found = requirements()
    SHOTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sinkd_port, webui_port = free_port(), free_port()
        procs = [start_sinkd(found["sinkd"], tmp, sinkd_port)]
        proxy = Proxy(sinkd_port)
        os.environ["DEFAULT_MODELS"] = MODEL
        if not AS_SHIPPED:
            os.environ["DEFAULT_MODEL_METADATA"] = json.dumps(
                {"capabilities": {"builtin_tools": False}}
            )
        if REPLY_TOKENS:  # as a user bounds replies in the model's settings
            os.environ["DEFAULT_MODEL_PARAMS"] = json.dumps({"max_tokens": REPLY_TOKENS})
        try:
            procs.append(start_open_webui(found["open-webui"], tmp, webui_port, proxy.port))
            browser = Browser(f"http://127.0.0.1:{webui_port}", proxy)
            try:
                t0 = time.monotonic()
                paths, marks = drive_memory(browser) if MEMORY else drive(browser)
                elapsed = time.monotonic() - t0
                for c, path in enumerate(paths):
                    browser.open(path)
                    time.sleep(1)
                    browser.d.save_screenshot(str(SHOTS / f"chat{c}.png"))
                titles = browser.titles()
                answered = (
                    MEMORY
                    and "4417" in browser.d.find_element("css selector", "#messages-container").text
                )  # the reply on screen holds the code (kept as a yes or no)
            finally:
                browser.d.quit()
            held = sessions(found["sinkd"], tmp / "sinkd.sock")
            kept = kept_memory(sinkd_port) if MEMORY else []
        finally:
            for proc in reversed(procs):
                proc.terminate()
                proc.wait(60)
    records = proxy.records()
    memory = memory_summary(records, marks, kept, answered) if MEMORY else None
    report(records, proxy.statuses(), paths, titles, held, browser.errors, elapsed, memory)


def memory_summary(
    records: list[Record], marks: list[int], kept: list[dict[str, Any]], answered: bool
) -> dict[str, Any]:
    """Which session took the first chat's fact, and where the second chat's turn recalled from."""
    first = next(r for r in records[marks[0] :] if r.kind == "main")
    second = next(r for r in records[marks[1] :] if r.kind == "main")
    return {
        "first_chat_session": first.session,
        "second_chat_session": second.session,
        "second_chat_recalled_from": second.recalled_from,
        "recalled_from_the_first_chat": first.session in second.recalled_from,
        "kept": kept,  # the memory across conversations: side requests (titles...) kept none
        "kept_from_side_requests": sum(
            p["conversation"] in {r.session for r in records if r.kind != "main"} for p in kept
        ),
        "second_chat_answer_holds_the_code": answered,
    }


def report(
    records: list[Record],
    statuses: list[tuple[str, int]],
    paths: list[str],
    titles: dict[str, str],
    held: list[dict[str, Any]],
    ui_errors: list[str],
    elapsed: float,
    memory: dict[str, Any] | None = None,
) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    rows = [
        [i, r.kind, r.status, r.messages, r.continuation, r.why_class, r.read_tokens,
         f"{r.ttfb_ms:.0f}", r.residency, f"{r.restored_ms:.1f}"]
        for i, r in enumerate(records)
    ]  # fmt: skip
    print(f"{'#':>3} {'kind':>10} {'status':>6} {'msgs':>4} {'continuation':>12} {'why':>16}"
          f" {'read':>5} {'ttfb ms':>8} {'residency':>9} {'restore ms':>10}")  # fmt: skip
    for row in rows:
        print(
            " ".join(
                f"{v!s:>{w}}" for v, w in zip(row, (3, 10, 6, 4, 12, 16, 5, 8, 9, 10), strict=True)
            )
        )
    main_turns = [r for r in records if r.kind == "main"]
    followers = [r for r in main_turns if r.messages > 1]
    reread = [r for r in followers if r.continuation not in ("continued", "regenerated")]
    side = [r for r in records if r.kind != "main"]
    chat_ids = [p.split("/c/")[-1] for p in paths]
    from_model = {
        cid: bool(titles.get(cid)) and titles[cid] not in ("New Chat", CHAT_TOPICS[c][0])
        for c, cid in enumerate(chat_ids)
    }
    summary = {
        "requests": len(records),
        "main_turns": len(main_turns),
        "main_turns_after_the_first": len(followers),
        "main_turns_read_again": len(reread),
        "side_requests": len(side),
        "side_requests_not_200": sum(r.status != 200 for r in side),
        "requests_seen": len(statuses),
        "not_200": sorted({f"{p} {st}" for p, st in statuses if st != 200}),
        "answers_404": sum(st == 404 for _, st in statuses),
        "side_forms": {
            kind: {
                f: sum(r.form == f for r in side if r.kind == kind) for f in task_answers.CLASSES
            }
            for kind in TASK_KEYS
        },  # fmt: skip
        "side_requests_said_decoded": sum(r.output_note for r in side),
        "restored_turns": sum(r.restored_ms > 0 for r in records),
        "ui_errors": len(ui_errors),
        "titles_read": sum(cid in titles for cid in chat_ids),
        "titles_from_the_model": sum(from_model.values()),
        "chats": len(chat_ids),
        "sessions_resident": sum(s["residency"] == "resident" for s in held),
        "sessions_parked": sum(s["residency"] == "parked" for s in held),
        "sessions": len(held),
        "seconds": round(elapsed),
        "requests_with_tools": sum(r.tools_sent > 0 for r in records),
        "tools_reported": sum(bool(r.tools) for r in records if r.tools_sent),
        "tools_note": next((r.tools for r in records if r.tools), ""),
        "as_shipped": AS_SHIPPED,
        "reply_tokens": REPLY_TOKENS,
        **({"memory": memory} if memory is not None else {}),
    }
    print(json.dumps(summary, indent=1))
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {
        "command": "python " + " ".join(sys.argv),
        "open_webui": "0.12.4",
        "summary": summary,
        "requests": [asdict(r) for r in records],
    }
    (RESULTS / f"{NAME}.json").write_text(json.dumps(data, indent=1))
    print(f"wrote {RESULTS / f'{NAME}.json'} and screenshots in {SHOTS}")


if __name__ == "__main__":
    main()
