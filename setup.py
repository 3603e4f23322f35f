"""The one C part of ccw: hashline tags (mcp_server/core/_fnvtags.c).

Everything else is in pyproject.toml.  The extension is optional: when it cannot be
built (no compiler or Python headers), the install goes on and linetags.py computes the
tags in Python, about 60 times slower.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("mcp_server.core._fnvtags", ["mcp_server/core/_fnvtags.c"], optional=True)])
