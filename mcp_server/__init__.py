"""ccw-mcp: the unprivileged front end of ccw. It owns every MCP transport and tool, and
talks to the helper (package ``sandbox``) over a narrow IPC channel."""

from sandbox import __version__ as __version__  # one version for the distribution
