"""`autoplan tune`: the cost model narrows the space to a handful of plans, short real runs with
the built-in runtime decide between them, and every run feeds calibration."""
