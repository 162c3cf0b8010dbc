"""Evaluation: `evaluate()` over a dataset, its config, files, report, summaries, progress and scores.

Modules: `run` (evaluate: rows in, samples out), `executor` (what runs the samples: in this
process, or a worker pool the caller hands in), `run_sample` (evaluate_sample in its phases:
set-up, agent, scoring; rescore_sample), `config` (EvalConfig), `resume` (what a resumed run may
reuse), `fingerprint` (what a sample's outcome depends on), `ids` (row ids in order), `io`
(loaders, samples log, atomic JSON), `report` (EvalReport), `summary`, `progress`, `sample`
(Metric, Score, Sample), `scorers` (score helpers). Import the public names from `rollouts`.
"""
