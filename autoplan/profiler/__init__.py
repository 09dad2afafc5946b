"""`autoplan profile`: measure this machine's compute, memory bandwidth, collectives and host
paths, and write them as a hardware profile the cost model reads like any other.

Imports torch; the planner never imports this package.
"""
