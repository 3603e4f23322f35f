"""Parts of the benchmark suites: each ``measure(...)`` returns rows for a Report."""
