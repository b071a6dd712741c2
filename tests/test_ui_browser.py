"""sinkd's page (/ui) in a real browser: Debian's chromium, headless, driven by selenium, over a
daemon on the real model. A tenant logs in, opens a conversation that evicted and recalled, sees
its cache map's counts equal the session's receipt, opens the recalled passage and its source,
forgets a memory passage from the page (gone over the API), sees a log line's markup as text; a
form without its CSRF token is refused; another tenant sees nothing of the first's; no request
leaves the daemon's address (the browser's network log).

`SINKD_UI_SHOTS=DIR` keeps a screenshot of each page there (bench/results/ui/ holds the last)."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sinkd.daemon.node import Daemon
from sinkd.daemon.runtime.sessions import Principal
from tests.support.daemons import http_daemon, openai_client

pytestmark = pytest.mark.model
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SECRET = "The vault code is marmalade ocelot quasar 7391, said Quentin."
QUESTION = "What vault code did Quentin give, the marmalade ocelot one?"
FILLER = "We talked about the weather and the gardens for a while, then about trains. " * 10
MARKUP = '<script>alert("pwned")</script><b>bold</b>'
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = http_daemon(
        tmp_path_factory.mktemp("ui"),
        memory_across_conversations=True,
        max_sessions=4,
        purge_interval_s=0,
        http_window=128,  # the second conversation evicts
        recall_threshold=0.5,  # and recalls: the page is under test here, not recall's ranking
    )
    yield d
    d.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (shutil.which(CHROMIUM) and shutil.which(DRIVER)):
        pytest.skip(
            "Debian's chromium and chromium-driver are not installed (.ci/run installs them)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--disable-background-networking", "--window-size=1280,1000"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def shot(browser: Any, name: str) -> None:
    folder = os.environ.get("SINKD_UI_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(folder) / f"{name}.png"))


def log_in(browser: Any, address: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    browser.delete_all_cookies()
    browser.get(f"{address}/ui")
    assert browser.current_url == f"{address}/ui/login"  # not logged in: the form
    browser.find_element(By.NAME, "token").send_keys(token)
    click(browser, browser.find_element(By.CSS_SELECTOR, "form.login button"))


def click(browser: Any, element: Any) -> None:
    """Click, then wait for the page it loads (a find before then would read the old page)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    old = browser.find_element(By.TAG_NAME, "html")
    element.click()

    def gone(driver: Any) -> bool:
        try:
            return bool(expected_conditions.staleness_of(old)(driver))
        except WebDriverException as e:  # chromium, mid-navigation: the node left the document
            if "does not belong to the document" in str(e):
                return True
            raise

    WebDriverWait(browser, 60).until(gone)


def counts_shown(browser: Any) -> dict[str, int]:
    from selenium.webdriver.common.by import By

    return {
        b.get_attribute("data-count"): int(b.text)
        for b in browser.find_elements(By.CSS_SELECTOR, "b[data-count]")
    }


def requested(browser: Any) -> list[str]:
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def test_a_tenant_sees_its_cache_map_recall_memory_and_narrator_and_nothing_else(
    daemon: Daemon, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    assert daemon.http is not None
    address = daemon.http.address
    oai = openai_client(daemon)
    first = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Please remember: " + SECRET}],
        max_tokens=2,
    )  # fmt: skip
    source = (first.model_extra or {})["sinkd"]["session_id"]
    chat: list[dict[str, str]] = [{"role": "user", "content": FILLER + MARKUP}]
    reply = oai.chat.completions.create(model=MODEL, messages=chat, max_tokens=2)  # type: ignore[arg-type]
    chat += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
             {"role": "user", "content": QUESTION}]  # fmt: skip
    later = oai.chat.completions.create(model=MODEL, messages=chat, max_tokens=2)  # type: ignore[arg-type]
    field = (later.model_extra or {})["sinkd"]
    conversation = field["session_id"]
    assert [r["conversation"] for r in field["recall"]["recalled"]].count(source) >= 1, json.dumps(
        field["recall"]
    )
    api = httpx.Client(base_url=address, headers={"authorization": "Bearer alice-token"})
    lines = ["web 200 GET /index.html"] * 30 + [f"web ERROR upstream failed {MARKUP}"] * 5
    fed = api.post("/v1/sinkd/narrations/web/lines", json={"lines": lines, "close": True})
    assert fed.status_code == 200, fed.text

    log_in(browser, address, "alice-token")
    assert browser.current_url == f"{address}/ui/sessions"
    shot(browser, "sessions")
    click(browser, browser.find_element(By.LINK_TEXT, conversation))
    shown = counts_shown(browser)
    shot(browser, "session-cache-map")
    alice = Principal("alice")
    (receipt,) = [
        r for r in daemon.service.reads.list_sessions(alice) if r.session_id == conversation
    ]
    anchors = receipt.anchors_logical[1] - receipt.anchors_logical[0]
    recalled = sum(
        min(s.stream[1], receipt.recent_logical[1]) - max(s.stream[0], receipt.recent_logical[0])
        for s in receipt.recalled
    )
    window = receipt.recent_logical[1] - receipt.recent_logical[0]
    assert receipt.evicted_tokens > 0 and recalled > 0
    assert shown == {
        "pinned": receipt.system_prompt_tokens_pinned,
        "sinks": anchors - receipt.system_prompt_tokens_pinned,
        "recalled": recalled,
        "recalled-passages": len(receipt.recalled),
        "window": window - recalled,
        "evicted": receipt.evicted_tokens,
    }
    seen = browser.find_element(By.XPATH, "//h2[text()='What the model sees now']/following::pre")
    assert (
        "</script><b>bold</b>" in seen.text
    )  # the user's markup (its tail in the window), as text
    assert browser.find_elements(By.TAG_NAME, "script") == []

    click(
        browser, browser.find_element(By.PARTIAL_LINK_TEXT, "open")
    )  # what came back, and from where
    shot(browser, "recalled-passage")
    assert "ocelot" in browser.find_element(By.TAG_NAME, "pre").text
    click(browser, browser.find_element(By.LINK_TEXT, source))
    assert browser.current_url == f"{address}/ui/sessions/{source}"

    browser.get(f"{address}/ui/memory?search=ocelot")
    shot(browser, "memory")
    row = browser.find_element(By.XPATH, "//td[contains(., 'ocelot')]/..")
    passage = int(row.find_elements(By.TAG_NAME, "td")[0].text)
    click(browser, row.find_element(By.LINK_TEXT, "forget"))
    assert "This forgets 1 passage" in browser.find_element(By.TAG_NAME, "main").text
    click(browser, browser.find_element(By.CSS_SELECTOR, "main form button.danger"))
    assert "Removed: 1 passage." in browser.find_element(By.TAG_NAME, "main").text
    kept = api.get("/v1/sinkd/memory").json()["data"]
    assert passage not in [p["id"] for p in kept]  # gone, over the API

    browser.get(f"{address}/ui/narrations/web")
    shot(browser, "narrator")
    history = browser.find_element(By.XPATH, "//h2[starts-with(., 'History')]/following::table")
    assert MARKUP in history.text and browser.find_elements(By.TAG_NAME, "script") == []
    assert browser.find_elements(By.CSS_SELECTOR, "svg.timeline rect.errors")
    opened = browser.find_element(By.XPATH, "//h2[text()='Open incidents']/following::table")
    click(browser, opened.find_element(By.XPATH, ".//button[text()='Mute']"))
    said = browser.find_element(By.TAG_NAME, "main").text
    assert "Muted: it is listed in the facts, never paged." in said and MARKUP in said
    browser.get(f"{address}/ui/narrations/web")
    muted = browser.find_element(By.XPATH, "//h2[starts-with(., 'Muted')]/following::table")
    assert "upstream failed" in muted.text and muted.find_elements(By.TAG_NAME, "button")

    cookie = browser.get_cookie("sinkd_ui")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    page = httpx.Client(base_url=address, cookies={"sinkd_ui": cookie["value"]})
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.get("/ui/memory").text)
    assert csrf is not None
    refused = page.post("/ui/memory/forget", data={"conversation": source})
    assert refused.status_code == 403 and "CSRF" in refused.text
    elsewhere = page.post(
        "/ui/memory/forget",
        data={"conversation": source, "csrf": csrf.group(1)},
        headers={"origin": "http://evil.example"},
    )
    assert elsewhere.status_code == 403
    later = {"since": "2999-01-01T00:00"}  # a period forget: only its intervals, none yet
    assert "2999-01-01T00:00" in page.get("/ui/narrations/web/forget", params=later).text
    assert page.get("/ui/narrations/web/forget", params={"since": "soon"}).status_code == 400
    done = page.post("/ui/narrations/web/forget", data={**later, "csrf": csrf.group(1)})
    assert "Removed: 0 intervals." in done.text, done.text
    assert "upstream failed" in page.get("/ui/narrations/web").text  # the stream stays
    assert page.get("/ui/admin").status_code == 403  # a tenant is not the admin
    found = page.get(f"/ui/sessions/{conversation}", params={"search": "gardens trains"}).text
    assert "<td>user</td>" in found and "gardens" in found.split("Stored passages")[1]
    none = page.get(f"/ui/sessions/{conversation}", params={"search": "zebra"}).text
    assert "None stored." in none
    for header in ("content-security-policy", "x-frame-options"):
        assert header in page.get("/ui/sessions").headers

    outside = [u for u in requested(browser) if not u.startswith((address, "data:"))]
    assert outside == []  # every script, style and image came from the daemon itself

    log_in(browser, address, "bob-token")  # another tenant sees none of alice's
    shot(browser, "bob-sessions")
    assert "No sessions." in browser.find_element(By.TAG_NAME, "main").text
    browser.get(f"{address}/ui/sessions/{conversation}")
    assert "Error 404" in browser.title
    browser.get(f"{address}/ui/memory")
    assert "ocelot" not in browser.page_source and "Nothing kept." in browser.page_source
    browser.get(f"{address}/ui/narrations")
    assert "No narrated streams" in browser.page_source

    log_in(browser, address, "admin-token")
    assert browser.current_url == f"{address}/ui/admin"
    shot(browser, "admin")
    tenants = browser.find_element(
        By.XPATH, "//h2[text()='Tenants and their shares']/following::table"
    )
    assert "alice" in tenants.text


def _logged_in(address: str, token: str) -> tuple[httpx.Client, str]:
    """A client holding a login's cookie, as a browser would, and the login's CSRF token."""
    page = httpx.Client(base_url=address)
    login = page.post("/ui/login", data={"token": token})
    assert login.status_code == 303, login.text
    page.cookies = login.cookies
    found = re.search(r'name="csrf" value="([^"]+)"', page.get("/ui/sessions").text)
    assert found is not None
    return page, found.group(1)


def test_fork_reset_and_close_from_the_page_and_a_stale_form_is_refused(daemon: Daemon) -> None:
    assert daemon.http is not None
    address = daemon.http.address
    reply = openai_client(daemon).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=2
    )
    sid = (reply.model_extra or {})["sinkd"]["session_id"]
    page, csrf = _logged_in(address, "alice-token")
    alice = Principal("alice")

    def generation(session_id: str) -> str:
        (r,) = [r for r in daemon.service.reads.list_sessions(alice) if r.session_id == session_id]
        return r.generation

    before = generation(sid)
    fork = page.post(f"/ui/sessions/{sid}/fork", data={"csrf": csrf, "generation": before})
    assert fork.status_code == 303
    child = fork.headers["location"].rsplit("/", 1)[1]
    assert child != sid and page.get(f"/ui/sessions/{child}").status_code == 200
    asked = page.get(f"/ui/sessions/{sid}/reset")
    assert "Reset starts a new generation" in asked.text and before in asked.text
    reset = page.post(f"/ui/sessions/{sid}/reset", data={"csrf": csrf, "generation": before})
    assert reset.status_code == 303 and generation(sid) != before
    stale = page.post(f"/ui/sessions/{sid}/close", data={"csrf": csrf, "generation": before})
    assert stale.status_code == 409  # the page showed the old generation: refused, not applied
    assert sid in [r.session_id for r in daemon.service.reads.list_sessions(alice)]
    closed = page.post(
        f"/ui/sessions/{sid}/close", data={"csrf": csrf, "generation": generation(sid)}
    )
    assert closed.status_code == 200 and "Removed: 1 session." in closed.text
    assert sid not in [r.session_id for r in daemon.service.reads.list_sessions(alice)]
    bob, bobs_csrf = _logged_in(address, "bob-token")
    theirs = bob.post(
        f"/ui/sessions/{child}/close", data={"csrf": bobs_csrf, "generation": generation(child)}
    )
    assert theirs.status_code == 404 and child in [
        r.session_id for r in daemon.service.reads.list_sessions(alice)
    ]
    assert (
        bob.post(f"/ui/sessions/{child}/close", data={"csrf": csrf}).status_code == 403
    )  # alice's token

    assert httpx.post(f"{address}/ui/login", data={"token": "nobody"}).status_code == 401
    out = page.post("/ui/logout", data={"csrf": csrf})
    assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
    assert page.get("/ui/sessions").headers["location"] == "/ui/login"  # the login ended


def test_with_the_setting_off_there_is_no_page(daemon: Daemon) -> None:
    from sinkd.daemon.http.front import HttpFront

    assert daemon.http is not None
    on = HttpFront(
        daemon.service, daemon.settings, daemon.http.authenticator, daemon.http.calls.limits
    )
    off_settings = daemon.settings.model_copy(update={"ui": False})
    off = HttpFront(
        daemon.service, off_settings, daemon.http.authenticator, daemon.http.calls.limits
    )
    from starlette.testclient import TestClient

    assert TestClient(on.app).get("/ui/login").status_code == 200
    assert TestClient(off.app).get("/ui/login").status_code == 404
    assert TestClient(off.app).get("/ui").status_code == 404
