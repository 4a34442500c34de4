"""The dashboard's tests: streamlit's AppTest scans every installed distribution's metadata for
custom components on each run (`scan_component_manifests`, ~12% of tests/app/test_pages.py's time
in a py-spy profile, 2026-12-03). The installed packages do not change while the suite runs: scan
once per test process."""

from __future__ import annotations

import functools

from streamlit.components.v2 import manifest_scanner

_scan_once = functools.cache(manifest_scanner.scan_component_manifests)
manifest_scanner.scan_component_manifests = lambda *args, **kwargs: list(_scan_once(*args, **kwargs))
