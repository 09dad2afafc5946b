"""Built-in search spaces, shipped inside the wheel as `autoplan.search_spaces` (package data).

Only the YAML files are data; autoplan.resources reads them with importlib.resources.
"""
