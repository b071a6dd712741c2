"""A web server's ordinary traffic, for the narrator's false-incident count: browsers fetching
pages and their assets, revisits asking If-Modified-Since, the usual 404s (a favicon, robots.txt, a mistyped
page), a directory without its slash (301), HEAD checks, over keep-alive connections.

    apt-get install nginx-light && nginx      # serves /var/www/html, logs /var/log/nginx/
    python bench/web_traffic.py http://127.0.0.1/ --requests 20000 --site /var/www/html

`bench/narrate_incidents.py` then reads /var/log/nginx/access.log as a log with no trouble.
Seeded: the same mix each run.
"""

from __future__ import annotations

import argparse
import http.client
import random
from pathlib import Path
from urllib.parse import urlsplit

PAGES = ["/", "/about.html", "/contact.html", "/pricing.html", "/blog.html", "/docs/"]
ASSETS = ["/static/site.css", "/static/app.js"]
MISSES = ["/favicon.ico", "/robots.txt", "/pricng.html", "/apple-touch-icon.png"]
AGENTS = [
    "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 Safari/605.1.15",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 Chrome/126.0 Safari/537.36",
    "curl/7.88.1",
    "Googlebot/2.1 (+http://www.google.com/bot.html)",
]


def visit(rng: random.Random) -> list[tuple[str, str, dict[str, str]]]:
    """One visitor's requests: a page, its assets (asked If-Modified-Since on a revisit), now and
    then a miss."""
    agent = {"User-Agent": rng.choice(AGENTS)}
    revisit = rng.random() < 0.4
    cached = {**agent, "If-Modified-Since": "Sat, 01 Jan 2050 00:00:00 GMT"} if revisit else agent
    page = rng.choice(PAGES)
    if rng.random() < 0.2:
        page += f"?utm_source=news&id={rng.randrange(1000)}"
    out = [("GET", page, agent)] + [("GET", a, cached) for a in ASSETS]
    if rng.random() < 0.3:
        out.append(("GET", rng.choice(MISSES), agent))
    if rng.random() < 0.05:
        out.append(("GET", "/docs", agent))  # 301 to /docs/
    if rng.random() < 0.05:
        out.append(("HEAD", "/", {"User-Agent": "uptime-check/1.0"}))
    return out


def write_site(root: Path) -> None:
    """The pages and assets the visitors ask for, where the server serves them (the misses stay
    missing): without them every page is a 404, not ordinary traffic."""
    for path in [*PAGES, *ASSETS]:
        file = root / path.lstrip("/")
        if path.endswith("/"):
            file = file / "index.html"
        file.parent.mkdir(parents=True, exist_ok=True)
        if not file.exists():
            file.write_text(f"<!doctype html><title>{path}</title><p>{path}</p>\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--site", type=Path, help="the server's root: write the pages there first")
    args = parser.parse_args()
    if args.site:
        write_site(args.site)
    where = urlsplit(args.url)
    rng = random.Random(args.seed)
    sent = 0
    codes: dict[int, int] = {}
    while sent < args.requests:
        conn = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port or 80)
        for method, path, headers in visit(rng):
            conn.request(method, path, headers=headers)
            response = conn.getresponse()
            response.read()
            codes[response.status] = codes.get(response.status, 0) + 1
            sent += 1
        conn.close()
    print(f"{sent} requests:", ", ".join(f"{c}: {n}" for c, n in sorted(codes.items())))


if __name__ == "__main__":
    main()
