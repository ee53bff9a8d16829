"""`strata rank`: which model to run here, for what (docs/architecture.md, ranking).

profiles.py  the workloads, as data files (profiles/*.json)
score.py     the one documented score and the usable / marginal / unusable verdict
candidates.py  what to rank: models, a folder, or every synthetic preset
measure.py   the figures each candidate needs: reused, measured, or predicted
ranking.py   per-profile order, cuts by the time budget, the quality frontier
"""
