"""Search for the best plan: exhaustive vectorised enumeration and Optuna samplers.

`space.py` turns a SearchSpace into a candidate table (`ranges.py` reads the GPU counts and
batch sizes a request gives), `scoring.py` judges and scores any table,
`exhaustive.py` and `optuna_search.py` produce a `Scored` set that `ranking.py` orders; `cli.py`
is `autoplan search`.
"""
