"""Built-in hardware profiles, shipped inside the wheel as `autoplan.profiles` (package data).

Only the YAML files are data; autoplan.resources reads them with importlib.resources.
"""
