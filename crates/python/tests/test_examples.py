"""examples/python/latency_cdf.py measures (plotting needs matplotlib, not installed here)."""

import pathlib
import re
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[3] / "examples" / "python" / "latency_cdf.py"


def test_the_latency_script_measures_and_summarises():
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--count", "200", "--no-plot"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    first = run.stdout.splitlines()[0]
    assert re.fullmatch(
        r"200 proposals \(handover mode, 16 B\), µs: p50 [\d.]+  p90 [\d.]+  p99 [\d.]+  p99\.9 [\d.]+  max [\d.]+", first
    ), first
