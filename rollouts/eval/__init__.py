"""Evaluation: `evaluate()` over a dataset, its config, files, report, summaries, progress and scores.

Modules: `run` (evaluate, evaluate_sample), `config` (EvalConfig), `io` (loaders, samples log,
atomic JSON), `report` (EvalReport), `summary`, `progress`, `sample` (Metric, Score, Sample),
`scorers` (score helpers). Import the public names from `rollouts`.
"""
