"""The analytic cost model: small pure numpy functions, one per quantity, each citing its source.

Every function takes scalars or equal-length arrays, so one call scores one plan or a column of a
million candidates. `estimate.estimate_table` composes them; `estimate.estimate_plan` scores one
Plan.
"""
