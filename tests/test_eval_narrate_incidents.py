"""`sinkd eval narrate --incidents` (evaluation/narrate_incidents.py) on a small loghub of its own:
labelled incidents counted as raised, false ones per 10,000 lines where nothing is labelled, lines
that state their error counted apart, and the pool of the logs that state none."""

from __future__ import annotations

from pathlib import Path

import pytest

from sinkd.evaluation import narrate_incidents as ni

pytestmark = pytest.mark.unit
BGL = "{label} 1117838570 2005.06.03 R02-M1-N0 2005-06-03-15.42.50.{n:06d} R02-M1-N0 RAS KERNEL {text}"


def small_loghub(folder: Path) -> None:
    """A BGL sample with one labelled alert run and a FATAL line not labelled; the lines the
    spliced cases take from Apache, OpenSSH and Linux; a Thunderbird sample with no alert."""
    bgl = [BGL.format(label="-", n=i, text=f"INFO generating core.{i}") for i in range(600)]
    for i in range(300, 306):
        bgl[i] = BGL.format(label="KERNDTLB", n=i, text="FATAL data TLB error interrupt")
    bgl[450] = BGL.format(label="-", n=450, text="FATAL machine check enable..........0")
    (folder / "BGL_2k.log").write_text("\n".join(bgl) + "\n")
    apache = ["[Sun Dec 04 04:47:44 2005] [error] mod_jk child workerEnv in error state 6"] * 6
    apache += ["[Sun Dec 04 04:51:18 2005] [error] [client 24.147.151.74] Directory index"] * 3
    (folder / "Apache_2k.log").write_text("\n".join(apache) + "\n")
    ssh = ["Dec 10 09:32:20 LabSZ sshd[24680]: error: Received disconnect from 1.2.3.4: 3"]
    ssh += [f"Dec 10 06:55:48 LabSZ sshd[{i}]: Failed password for invalid user w{i} from"
            f" 173.234.31.186 port 38926 ssh2" for i in range(8)]  # fmt: skip
    (folder / "OpenSSH_2k.log").write_text("\n".join(ssh) + "\n")
    linux = [f"Jun 14 15:16:01 combo sshd(pam_unix)[{i}]: authentication failure; logname= uid=0"
             for i in range(5)]  # fmt: skip
    (folder / "Linux_2k.log").write_text("\n".join(linux) + "\n")
    quiet = [f"- 1131566461 2005.11.09 dn228 Nov 9 12:01:01 dn228/dn228 crond[{i}]: (root) CMD"
             f" (run-parts /etc/cron.hourly)" for i in range(400)]  # fmt: skip
    (folder / "Thunderbird_2k.log").write_text("\n".join(quiet) + "\n")


def test_incidents_are_counted_raised_false_and_pooled(tmp_path: Path) -> None:
    loghub = tmp_path / "loghub"
    loghub.mkdir()
    small_loghub(loghub)
    access = tmp_path / "access.log"
    access.write_text("".join(
        f'127.0.0.1 - - [07/Dec/2026:07:02:58 +0000] "GET /p{i % 5}.html HTTP/1.1" 200 17 "-"'
        f' "curl/7.88.1"\n' for i in range(1000)
    ))  # fmt: skip
    results = ni.evaluate(loghub, machine_logs=(str(access),))
    bgl = results["labelled"]["bgl"]["today"]
    assert (bgl["labelled"], bgl["raised"], bgl["cited"]) == (1, 1, 1)
    assert bgl["false"] == 1  # the FATAL line loghub does not label: stated, so paged
    quiet = results["no_trouble"]
    assert quiet["BGL_2k.log, no-alert lines"]["lines_stating_errors"] == 1
    assert quiet["BGL_2k.log, no-alert lines"]["today"]["incidents"] == 1
    assert quiet[str(access)]["today"]["incidents"] == 0
    assert quiet["Thunderbird_2k.log, no-alert lines"]["lines_stating_errors"] == 0
    segments = quiet["BGL_2k.log, normal segments"]  # 0-299 and 306-599: runs of 200 or more
    assert segments["today"]["lines"] == 594 and segments["lines_stating_errors"] == 1
    assert "Thunderbird_2k.log, normal segments" not in quiet  # the whole sample: no new row
    assert results["pooled"] == {
        "logs_stating_no_error_lines": 1400, "incidents": 0, "per_10000_lines": 0.0
    }  # fmt: skip
    [_, _, (title, columns, rows)] = ni.tables(results)
    assert rows[-1][0].startswith("pooled") and len(rows) == len(quiet) + 1
