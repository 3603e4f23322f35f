"""``ccw ui``: a local web dashboard of one state dir (``server`` serves it, ``api`` reads what it shows)."""
