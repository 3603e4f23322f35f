"""What a local REAPI cluster (PostgreSQL + BuildGrid, mcp_server/devcluster/cluster.py) needs of
this host, checked once by the vm-tests that bring one up (test_reapi_cluster.py,
test_reapi_ccw_bot.py) before their module-scoped cluster starts.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

from mcp_server.devcluster import postgres
from mcp_server.devcluster.cluster import find_server_python
from sandbox.errors import CcwError


def _conftest(config: pytest.Config) -> Any:
    """vm-tests/conftest.py as loaded (a test's own module cannot import it)."""
    for plugin in config.pluginmanager.get_plugins():
        if hasattr(plugin, "ToolRunner") and hasattr(plugin, "require"):
            return plugin
    raise AssertionError("vm-tests/conftest.py is not loaded")


def require_cluster_prerequisites(config: pytest.Config) -> None:
    """Skip (fail under CCW_MUST_WORK=1) where neither PostgreSQL nor a way to install it, or no
    Python 3.13; through the conftest's ``require``, which a module-scoped fixture cannot take."""
    require = _conftest(config).require
    installable = os.geteuid() == 0 and shutil.which("apt-get") is not None
    require(postgres.find_bin_dir() is not None or installable, "no PostgreSQL server and no root to install it")
    try:
        find_server_python()
    except CcwError as error:
        require(False, str(error))
