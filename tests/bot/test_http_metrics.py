"""``/metrics`` as Prometheus reads it: prometheus_client's strict OpenMetrics parser takes every family with its
declared type, units are spelled out, and ``promtool check metrics`` (where installed) finds nothing to lint."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from tests.bot.test_http_fakes import Server

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


async def _scrape(server: Server, session, accept: str = "") -> str:
    async with session.post(server.url + "/v1/audio/speech", json={"input": "Hi there.", "voice": "bob"}) as r:
        await r.read()  # one observation in every HTTP histogram
    async with session.get(server.url + "/metrics", headers={"Accept": accept} if accept else None) as r:
        assert r.status == 200
        return await r.text()


async def test_the_strict_parser_reads_every_family_with_its_type(server: Server, session) -> None:
    families = {f.name: f for f in text_string_to_metric_families(await _scrape(server, session, OPENMETRICS))}
    types = {name: f.type for name, f in families.items() if name.startswith("voicebot_")}
    assert types == {
        "voicebot_http_requests": "counter", "voicebot_http_time_to_first_audio_seconds": "histogram",
        "voicebot_http_real_time_factor": "histogram", "voicebot_http_audio_seconds": "counter",
        "voicebot_http_aborted_streams": "counter", "voicebot_start_time_seconds": "gauge",
        "voicebot_engine": "info", "voicebot_synthesis_queue_depth": "gauge",
        "voicebot_synthesis_requests": "counter", "voicebot_synthesis_prosody_hits": "counter",
        "voicebot_synthesis_prosody_misses": "counter", "voicebot_synthesis_prosody_hit_ratio": "gauge",
        "voicebot_synthesis_time_to_first_audio_seconds": "summary", "voicebot_synthesis_real_time_factor": "summary",
    }
    quantiles = {s.labels["quantile"]: s.value for s in families["voicebot_synthesis_time_to_first_audio_seconds"]
                 .samples}
    assert quantiles == {"0.5": 0.2, "0.9": 0.3, "0.99": 0.3}  # the fake's recent samples 0.1, 0.2, 0.3
    assert not any(name.endswith("_s") or "_ms" in name for name in families)  # units spelled out


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus package) not installed")
async def test_promtool_finds_nothing_to_lint(server: Server, session) -> None:
    text = await _scrape(server, session)
    done = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr
