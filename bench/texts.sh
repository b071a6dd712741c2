#!/usr/bin/env bash
# The public-domain texts of the quality runs, from Debian packages (installs them if missing).
set -euo pipefail
out="${1:-bench/texts}"
mkdir -p "$out"
command -v bible >/dev/null || apt-get install -y -q bible-kjv bible-kjv-text >/dev/null
[ -f /usr/share/doc/jargon-text/jargon.txt.gz ] || apt-get install -y -q jargon-text >/dev/null
bible -f Genesis1:1-Revelation22:21 > "$out/kjv.txt"        # King James Bible, public domain
zcat /usr/share/doc/jargon-text/jargon.txt.gz > "$out/jargon.txt"   # The Jargon File 4.4.7, public domain
wc -c "$out"/kjv.txt "$out"/jargon.txt
