"""ccw-mcp: the unprivileged front end of ccw. It owns every MCP transport and tool, and
talks to the helper (package ``sandbox``) over a narrow IPC channel."""

__version__ = "0.1.0"
