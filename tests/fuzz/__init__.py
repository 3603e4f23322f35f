"""Coverage-guided fuzzing with atheris: one target per parser (see ``targets.py``)."""
